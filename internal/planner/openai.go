package planner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/tracing"
)

// Planner modes of the openai provider.
const (
	ModeNativeTools = "native_tools"
	ModeEnvelope    = "envelope"
)

// OpenAIConfig configures the openai provider.
type OpenAIConfig struct {
	// BaseURL is the OpenAI-compatible endpoint, e.g.
	// "https://api.openai.com/v1" or "http://localhost:11434/v1".
	BaseURL string
	// APIKey authenticates; empty for endpoints that need none.
	APIKey string
	// Model is the model used when no pool key applies.
	Model string
	// Models is the model pool: business keys to model names.
	Models map[string]string
	// PlanningModelKey picks the pool's model for planning calls;
	// SynthesisModelKey for finalize and section calls (default: the
	// planning model).
	PlanningModelKey  string
	SynthesisModelKey string
	// Mode is "native_tools" (default) or "envelope". Native mode falls
	// back to envelope mode for good when the endpoint rejects tools.
	Mode string
	// CallTimeout bounds each LLM call; default 60 s.
	CallTimeout time.Duration
	// MaxRetries is the HTTP client's retries of failed calls (429, 5xx,
	// connection errors); default 1. Negative means none.
	MaxRetries int
	// HTTPClient is used for the calls; nil means http.DefaultClient.
	HTTPClient *http.Client
	// Prices is the price table: a model name (as asked for) to its
	// prices per million tokens. A model without a price costs 0, and its
	// calls are marked unpriced.
	Prices map[string]events.Price
}

// OpenAI is the openai provider: decisions and syntheses from any
// OpenAI-compatible chat-completions endpoint.
type OpenAI struct {
	cfg    OpenAIConfig
	client openai.Client
	// envelopeOnly is set once the endpoint has rejected tools.
	envelopeOnly atomic.Bool
}

// NewOpenAI returns the openai provider.
func NewOpenAI(cfg OpenAIConfig) (*OpenAI, error) {
	if cfg.BaseURL == "" {
		return nil, errors.New("planner: OpenAIConfig.BaseURL is required")
	}
	switch cfg.Mode {
	case "":
		cfg.Mode = ModeNativeTools
	case ModeNativeTools, ModeEnvelope:
	default:
		return nil, fmt.Errorf("planner: unknown planner mode %q (want %s or %s)", cfg.Mode, ModeNativeTools, ModeEnvelope)
	}
	for _, key := range []string{cfg.PlanningModelKey, cfg.SynthesisModelKey} {
		if key != "" && cfg.Models[key] == "" {
			return nil, fmt.Errorf("planner: model key %q is not in the model pool", key)
		}
	}
	if cfg.Model == "" && cfg.PlanningModelKey == "" {
		return nil, errors.New("planner: OpenAIConfig needs a Model or a PlanningModelKey")
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = 60 * time.Second
	}
	switch {
	case cfg.MaxRetries == 0:
		cfg.MaxRetries = 1
	case cfg.MaxRetries < 0:
		cfg.MaxRetries = 0
	}
	opts := []option.RequestOption{option.WithBaseURL(cfg.BaseURL), option.WithMaxRetries(cfg.MaxRetries), option.WithAPIKey(cfg.APIKey)}
	if cfg.HTTPClient != nil {
		opts = append(opts, option.WithHTTPClient(cfg.HTTPClient))
	}
	return &OpenAI{cfg: cfg, client: openai.NewClient(opts...)}, nil
}

// Name implements Provider.
func (p *OpenAI) Name() string { return "openai" }

// Model implements Modeler: the model the provider plans with (its LLM
// limit's key).
func (p *OpenAI) Model() string { return p.model("") }

func (p *OpenAI) model(key string) string {
	if m := p.cfg.Models[key]; key != "" && m != "" {
		return m
	}
	if m := p.cfg.Models[p.cfg.PlanningModelKey]; m != "" {
		return m
	}
	return p.cfg.Model
}

// Decide implements Provider: one decision, with at most one corrective
// round trip when the first reply is not usable.
func (p *OpenAI) Decide(ctx context.Context, in Input) (events.Decision, error) {
	req := in.Request
	if req.Synthesize != "" {
		return p.finalize(ctx, in)
	}
	ix := newCatalogIndex(in.Actions)
	native := p.cfg.Mode == ModeNativeTools && !p.envelopeOnly.Load()
	msgs := p.messages(in, native)
	var problem *actionbus.Error
	for round := 0; round < 2; {
		reply, err := p.complete(ctx, p.model(p.cfg.PlanningModelKey), msgs, p.tools(in.Actions, req.Skill, native), nil)
		if native && toolsRejected(err) {
			// The endpoint has no tool support: envelope mode from now on.
			p.envelopeOnly.Store(true)
			in.Diagnose(actionbus.Errorf(actionbus.CodeToolsUnsupported, "the endpoint rejected tools; falling back to envelope mode").
				WithDetail("error", err.Error()))
			native, msgs = false, p.messages(in, false)
			continue
		}
		if err != nil {
			return events.Decision{}, err
		}
		var dec events.Decision
		if native {
			dec, problem = p.fromToolReply(reply, ix, in)
		} else {
			dec, problem = decodeEnvelope(reply.Content, in)
		}
		if problem == nil {
			ix.repair(&dec, req.Prompt, in)
			problem = ix.check(dec)
		}
		if problem == nil {
			if dec.Type == events.DecisionFinal {
				dec = withSources(dec, req.Observations)
			}
			return dec, nil
		}
		in.Diagnose(problem)
		msgs = append(msgs, correction(reply, problem)...)
		round++
	}
	return events.Decision{}, actionbus.Errorf(actionbus.CodePlannerFailed, "the model's reply was not a usable decision twice: %s", problem.Message).
		WithDetail("reason", problem)
}

// correction is what goes back to the model after an unusable reply: its
// own reply (tool calls answered as not executed, as the protocol needs),
// then the reason.
func correction(reply openai.ChatCompletionMessage, problem *actionbus.Error) []openai.ChatCompletionMessageParamUnion {
	out := []openai.ChatCompletionMessageParamUnion{reply.ToParam()}
	for _, tc := range reply.ToolCalls {
		out = append(out, openai.ToolMessage("not executed: the reply was refused ("+string(problem.Code)+")", tc.ID))
	}
	return append(out, openai.UserMessage(fmt.Sprintf("Your reply could not be used (%s): %s\nReply again with a corrected decision.", problem.Code, problem.Message)))
}

// fromToolReply turns a native tool-call reply into a decision: one call
// is an action (or clarify, or final), several become one plan when every
// call may run without approval, plain text is a final answer.
func (p *OpenAI) fromToolReply(reply openai.ChatCompletionMessage, ix *catalogIndex, in Input) (events.Decision, *actionbus.Error) {
	if len(reply.ToolCalls) == 0 {
		text := strings.TrimSpace(reply.Content)
		switch {
		case toolMarkup.MatchString(text):
			return events.Decision{}, actionbus.Errorf(actionbus.CodeNativeToolCallsEmpty,
				"the reply has no native tool calls but writes tool calls as text; call the tools natively").WithDetail("content", preview(text, 300))
		case text == "":
			return events.Decision{}, actionbus.Errorf(actionbus.CodeNativeToolCallsEmpty, "the reply has neither tool calls nor an answer")
		}
		if raw, ok := extractJSON(text); ok && strings.Contains(raw, `"type"`) {
			return decodeEnvelope(text, in)
		}
		return events.Decision{Type: events.DecisionFinal, Answer: text}, nil
	}
	var calls []events.Decision
	for i, tc := range reply.ToolCalls {
		var args map[string]any
		if s := strings.TrimSpace(tc.Function.Arguments); s != "" {
			if err := json.Unmarshal([]byte(s), &args); err != nil {
				return events.Decision{}, actionbus.Errorf(actionbus.CodeInvalidDecision, "tool call %d (%s): arguments are not a JSON object: %v", i, tc.Function.Name, err)
			}
		}
		switch tc.Function.Name {
		case toolClarify:
			q, _ := args["question"].(string)
			calls = append(calls, events.Decision{Type: events.DecisionClarify, Question: q})
		case toolFinal, toolFinish:
			a, _ := args["answer"].(string)
			dec := events.Decision{Type: events.DecisionFinal, Answer: a}
			if cs, ok := args["citations"].([]any); ok {
				for _, c := range cs {
					if s, ok := c.(string); ok {
						dec.Citations = append(dec.Citations, s)
					}
				}
			}
			calls = append(calls, dec)
		default:
			if dec, ok := fromSkillTool(in.Request.Skill, tc.Function.Name, args); ok {
				calls = append(calls, dec)
				continue
			}
			name := tc.Function.Name
			if n, ok := ix.byTool[name]; ok {
				name = n
			}
			calls = append(calls, events.Decision{Type: events.DecisionAction, Name: name, Args: args})
		}
	}
	if len(calls) == 1 {
		return calls[0], nil
	}
	// Several calls in one reply: one plan, when the plan rules allow it.
	var refused []string
	for _, c := range calls {
		if c.Type != events.DecisionAction {
			return events.Decision{}, actionbus.Errorf(actionbus.CodePlanRejected, "%s cannot be combined with other tool calls; call it alone", c.Type)
		}
		if e := ix.byName[c.Name]; e != nil && !allowedInPlan(e) {
			refused = append(refused, fmt.Sprintf("%s (mode %s, tier %d)", c.Name, e.Mode, e.Tier))
		}
	}
	if len(refused) > 0 {
		return events.Decision{}, actionbus.Errorf(actionbus.CodePlanRejected,
			"several tool calls run as one plan, and a plan may only hold actions that need no approval; %s need approval: call them alone", strings.Join(refused, ", ")).
			WithDetail("refused", refused)
	}
	return events.Decision{Type: events.DecisionPlan, Actions: calls}, nil
}

// allowedInPlan is the planner's view of the plan rule "any non-allow
// policy rejects the whole plan": tier 0, a mode that needs no approval,
// no planner-state mutation. The dispatcher's policy has the last word.
func allowedInPlan(e *actions.Entry) bool {
	if e.Tier != 0 || e.Mode == actions.ModeMutate {
		return false
	}
	return e.Planner == nil || !e.Planner.StateMutator
}

func preview(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// finalize writes the final answer of a plan that asked for synthesis,
// streaming its tokens when the caller listens.
func (p *OpenAI) finalize(ctx context.Context, in Input) (events.Decision, error) {
	req := in.Request
	obs, _ := json.Marshal(req.Observations)
	msgs := []openai.ChatCompletionMessageParamUnion{
		openai.SystemMessage("You write the final answer of a task for the user, in markdown, from the action results you are given. " +
			"Use only what the results say. Do not call tools and do not reply with JSON.\n\nInstruction: " + req.Synthesize),
		openai.UserMessage("Request:\n" + req.Prompt + "\n\nAction results (JSON):\n" + string(obs)),
	}
	reply, err := p.complete(ctx, p.model(p.cfg.SynthesisModelKey), msgs, nil, in.Stream)
	if err != nil {
		return events.Decision{}, err
	}
	answer := strings.TrimSpace(reply.Content)
	if answer == "" {
		return events.Decision{}, actionbus.Errorf(actionbus.CodePlannerFailed, "the finalize call returned an empty answer")
	}
	return withSources(events.Decision{Type: events.DecisionFinal, Answer: answer}, req.Observations), nil
}

// Synthesize implements Provider: one section from one action's result and
// its section prompt, or the intro/outro from compact summaries.
func (p *OpenAI) Synthesize(ctx context.Context, req *events.SynthesisRequested) (string, error) {
	results, _ := json.Marshal(req.Results)
	var system string
	if req.Part == events.PartSection {
		system = "You write one section of a longer markdown report from one action result. Write only the section body: no title, " +
			"no follow-up suggestions, no drill-down hints."
	} else {
		system = fmt.Sprintf("You write the %s of a longer markdown report from compact summaries of its action results. Write only the %s.", req.Part, req.Part)
	}
	msgs := []openai.ChatCompletionMessageParamUnion{
		openai.SystemMessage(system),
		openai.UserMessage("Request:\n" + req.Prompt + "\n\nInstruction:\n" + req.Instruction + "\n\nResult (JSON):\n" + string(results)),
	}
	reply, err := p.complete(ctx, p.model(p.cfg.SynthesisModelKey), msgs, nil, nil)
	if err != nil {
		return "", err
	}
	return reply.Content, nil
}

// complete makes one chat-completions call under the call deadline. With
// stream set, the reply is streamed and its content deltas passed on.
// Errors are typed: timeout, or provider_error with the HTTP status; a
// canceled ctx (the service stopping) is returned as is, so the request is
// redelivered.
func (p *OpenAI) complete(ctx context.Context, model string, msgs []openai.ChatCompletionMessageParamUnion, tools []openai.ChatCompletionToolUnionParam, stream func(string)) (openai.ChatCompletionMessage, error) {
	ctx, span := tracing.Tracer().Start(ctx, "chat "+model, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(semconv.GenAIOperationNameChat, semconv.GenAIProviderNameOpenAI, semconv.GenAIRequestModel(model)))
	defer span.End()
	sent := requestBytes(msgs, tools)
	m := meterFrom(ctx)
	tokens, cost := p.inputEstimate(model, sent)
	h, err := m.admit(ctx, model, tokens, cost)
	if err != nil {
		tracing.Fail(span, string(actionbus.CodeOf(err)))
		return openai.ChatCompletionMessage{}, err
	}
	msg, usage, err := p.call(ctx, model, msgs, tools, stream)
	var used *events.LLMUsage
	if err == nil || usage.input+usage.output > 0 {
		u := p.callUsage(model, usage, sent, replyBytes(msg))
		used = &u
	}
	if rerr := m.record(ctx, h, used); rerr != nil && err == nil {
		err = rerr // the day's spend is not settled: the request is tried again
	}
	if span.IsRecording() {
		if usage.model != "" {
			span.SetAttributes(semconv.GenAIResponseModel(usage.model))
		}
		span.SetAttributes(semconv.GenAIUsageInputTokens(int(usage.input)), semconv.GenAIUsageOutputTokens(int(usage.output)))
		if usage.finish != "" {
			span.SetAttributes(semconv.GenAIResponseFinishReasons(usage.finish))
		}
		if err != nil {
			tracing.Fail(span, string(actionbus.CodeOf(err)))
		}
	}
	return msg, err
}

// requestBytes is the size of a call's messages and tools as sent: what
// its input tokens are estimated from.
func requestBytes(msgs []openai.ChatCompletionMessageParamUnion, tools []openai.ChatCompletionToolUnionParam) int {
	n := 0
	if b, err := json.Marshal(msgs); err == nil {
		n += len(b)
	}
	if len(tools) > 0 {
		if b, err := json.Marshal(tools); err == nil {
			n += len(b)
		}
	}
	return n
}

// replyBytes is the size of a reply's content and tool calls: what its
// output tokens are estimated from.
func replyBytes(msg openai.ChatCompletionMessage) int {
	n := len(msg.Content)
	for _, tc := range msg.ToolCalls {
		n += len(tc.Function.Name) + len(tc.Function.Arguments)
	}
	return n
}

// usage is what a chat-completions call reports of itself, for its span.
type usage struct {
	model         string
	input, output int64
	finish        string
}

// call is one chat-completions call, its errors typed (see complete).
func (p *OpenAI) call(ctx context.Context, model string, msgs []openai.ChatCompletionMessageParamUnion, tools []openai.ChatCompletionToolUnionParam, stream func(string)) (openai.ChatCompletionMessage, usage, error) {
	var u usage
	cctx, cancel := context.WithTimeout(ctx, p.cfg.CallTimeout)
	defer cancel()
	params := openai.ChatCompletionNewParams{Model: model, Messages: msgs, Tools: tools}
	var msg openai.ChatCompletionMessage
	var err error
	if stream == nil {
		var resp *openai.ChatCompletion
		if resp, err = p.client.Chat.Completions.New(cctx, params); err == nil {
			u = usage{model: resp.Model, input: resp.Usage.PromptTokens, output: resp.Usage.CompletionTokens}
			if len(resp.Choices) == 0 {
				return msg, u, actionbus.Errorf(actionbus.CodeProviderError, "the endpoint returned no choices").WithDetail("model", model)
			}
			msg, u.finish = resp.Choices[0].Message, resp.Choices[0].FinishReason
		}
	} else {
		s := p.client.Chat.Completions.NewStreaming(cctx, params)
		var acc openai.ChatCompletionAccumulator
		for s.Next() {
			chunk := s.Current()
			acc.AddChunk(chunk)
			if len(chunk.Choices) > 0 && chunk.Choices[0].Delta.Content != "" {
				stream(chunk.Choices[0].Delta.Content)
			}
		}
		err = s.Err()
		_ = s.Close()
		u = usage{model: acc.Model, input: acc.Usage.PromptTokens, output: acc.Usage.CompletionTokens}
		if err == nil && len(acc.Choices) > 0 {
			msg, u.finish = acc.Choices[0].Message, acc.Choices[0].FinishReason
		}
	}
	if err == nil {
		return msg, u, nil
	}
	if ctx.Err() != nil {
		return msg, u, ctx.Err()
	}
	if errors.Is(err, context.DeadlineExceeded) || cctx.Err() != nil {
		return msg, u, actionbus.Errorf(actionbus.CodeTimeout, "the planner's LLM call did not answer within %s", p.cfg.CallTimeout).
			WithDetail("stage", "planner").WithDetail("model", model)
	}
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		return msg, u, actionbus.Errorf(actionbus.CodeProviderError, "the LLM endpoint answered HTTP %d: %s", apiErr.StatusCode, apiErr.Message).
			WithDetail("status", apiErr.StatusCode).WithDetail("model", model)
	}
	return msg, u, actionbus.Errorf(actionbus.CodeProviderError, "the LLM endpoint could not be reached: %v", err).WithDetail("model", model)
}

// toolsRejected reports an endpoint refusing a request because of its
// tools (no function-calling support).
func toolsRejected(err error) bool {
	var abErr *actionbus.Error
	if !errors.As(err, &abErr) || abErr.Code != actionbus.CodeProviderError {
		return false
	}
	status, _ := abErr.Details["status"].(int)
	msg := strings.ToLower(abErr.Message)
	return (status == 400 || status == 404 || status == 422 || status == 501) &&
		(strings.Contains(msg, "tool") || strings.Contains(msg, "function"))
}

func (p *OpenAI) tools(entries []actions.Entry, skill *events.SkillContext, native bool) []openai.ChatCompletionToolUnionParam {
	if !native {
		return nil
	}
	out := make([]openai.ChatCompletionToolUnionParam, 0, len(entries)+len(internalTools))
	for _, e := range distinctTools(entries) {
		desc := e.Description
		if e.Planner != nil && e.Planner.Guidance != "" {
			desc += " " + e.Planner.Guidance
		}
		out = append(out, openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
			Name: actions.ToolName(e.Name), Description: openai.String(desc), Parameters: ToolParameters(e)}))
	}
	for _, t := range append(slices.Clone(internalTools), skillTools(skill)...) {
		out = append(out, openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
			Name: t.name, Description: openai.String(t.description), Parameters: t.params}))
	}
	return out
}

// messages builds the conversation of a planning call: the system prompt
// of the mode, the request, the results so far and the dispatcher's
// feedback on the previous decision.
func (p *OpenAI) messages(in Input, native bool) []openai.ChatCompletionMessageParamUnion {
	req := in.Request
	var system string
	if native {
		system = nativePrompt
	} else {
		system = envelopePrompt(in.Actions)
	}
	msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system)}
	if sp := skillPrompt(req.Skill, native); sp != "" {
		msgs = append(msgs, openai.SystemMessage(sp))
	}
	if wp := workspacePrompt(req.Workspace); wp != "" {
		msgs = append(msgs, openai.SystemMessage(wp))
	}
	msgs = append(msgs, openai.UserMessage(req.Prompt))
	if len(req.Observations) > 0 {
		obs, _ := json.Marshal(req.Observations)
		msgs = append(msgs, openai.UserMessage("Results of the actions run so far (JSON, in order):\n"+string(obs)))
	}
	if req.Feedback != nil {
		fb, _ := json.Marshal(req.Feedback)
		msgs = append(msgs, openai.UserMessage("Your previous decision was not run. Correct it. Reason (JSON):\n"+string(fb)))
	}
	return msgs
}

const nativePrompt = `You plan the next step of a task by calling tools. Each turn, either call the one action that should run next, ` +
	`call several independent actions at once when they can run in parallel, ask the user a clarifying question with ask_clarification, ` +
	`or give the final answer with final_answer. Use tool calls, never tool calls written as text.`

// envelopePrompt lists the planner-visible actions and the envelope
// contract.
func envelopePrompt(entries []actions.Entry) string {
	var b strings.Builder
	b.WriteString("You plan the next step of a task. Reply with exactly one JSON envelope and nothing else.\n\nEnvelopes:\n")
	b.WriteString(`{"type":"action","name":"<action>","args":{...},"reasoning":"..."}` + "\n")
	b.WriteString(`{"type":"plan","actions":[{"type":"action","name":"<action>","args":{...}}, ...],"synthesize_instruction":"...","partial_ok":false,"reasoning":"..."}` + "\n")
	b.WriteString(`{"type":"clarify","question":"...","reasoning":"..."}` + "\n")
	b.WriteString(`{"type":"final","answer":"...","citations":["..."],"reasoning":"..."}` + "\n\n")
	b.WriteString("Rules: an action must name one of the actions below; args is an object; a plan holds only independent action envelopes " +
		"that need no approval; use clarify when you cannot continue without the user; use final when the task is done.\n\nActions:\n")
	sorted := slices.Clone(entries)
	slices.SortFunc(sorted, func(a, b actions.Entry) int { return strings.Compare(a.Name, b.Name) })
	for _, e := range sorted {
		fmt.Fprintf(&b, "- %s (%s): %s\n", e.Name, e.Mode, e.Description)
		if e.Planner != nil {
			if e.Planner.Guidance != "" {
				fmt.Fprintf(&b, "  when: %s\n", e.Planner.Guidance)
			}
			if e.Planner.ArgsExample != nil {
				ex, _ := json.Marshal(e.Planner.ArgsExample)
				fmt.Fprintf(&b, "  args example: %s\n", ex)
			}
		}
	}
	return b.String()
}

// ParseModelPool reads a model pool written "key=model,key2=model2".
func ParseModelPool(s string) (map[string]string, error) {
	pool := map[string]string{}
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		key, model, ok := strings.Cut(item, "=")
		if key, model = strings.TrimSpace(key), strings.TrimSpace(model); !ok || key == "" || model == "" {
			return nil, fmt.Errorf("planner: model pool entry %q is not key=model", item)
		}
		pool[key] = model
	}
	return pool, nil
}

// APIKeyFromEnv is the provider's API key: ACTIONBUS_OPENAI_API_KEY, else
// OPENAI_API_KEY. Keys are read from the environment only, never from
// flags (flags show up in process lists).
func APIKeyFromEnv() string {
	if k := os.Getenv("ACTIONBUS_OPENAI_API_KEY"); k != "" {
		return k
	}
	return os.Getenv("OPENAI_API_KEY")
}
