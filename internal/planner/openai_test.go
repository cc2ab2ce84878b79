package planner

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/llmtest"
)

func entry(t *testing.T, name string, mode actions.Mode, tier int, schema string, pm *actions.PlannerMeta) actions.Entry {
	t.Helper()
	d := actions.Definition{Name: name, Description: name + " does its job", Mode: mode, Tier: tier, Version: "1", Pool: "default", Planner: pm}
	if schema != "" {
		d.InputSchema = json.RawMessage(schema)
	}
	if err := d.Normalize(); err != nil {
		t.Fatal(err)
	}
	return actions.Entry{Definition: d}
}

func testCatalog(t *testing.T) []actions.Entry {
	return []actions.Entry{
		entry(t, "web_search", actions.ModeRead, 0, `{"type":"object","required":["query"],"properties":{"query":{"type":"string","x-aliases":["q"]},"limit":{"type":"integer"}},"additionalProperties":false}`,
			&actions.PlannerMeta{Aliases: []string{"search", "websearch", "search_web"}}),
		entry(t, "read_url", actions.ModeRead, 0, `{"type":"object","required":["url"],"properties":{"url":{"type":"string"},"mode":{"enum":["auto","text","html_text","json"]}}}`,
			&actions.PlannerMeta{Aliases: []string{"browse", "fetch_url", "open_url", "fetch", "read_page"}}),
		entry(t, "delivery.searchJobs", actions.ModeRead, 0, `{"type":"object","properties":{"status":{"type":"string","x-aliases":["state"]},"filter":{"type":"object","properties":{"team":{"type":"string","x-aliases":["group"]}}}}}`, nil),
		entry(t, "delivery.executeRetry", actions.ModeMutate, 2, `{"type":"object","required":["jobId"],"properties":{"jobId":{"type":"string"}}}`, nil),
		entry(t, "notes.lookup", actions.ModeRead, 0, "", &actions.PlannerMeta{ArgsExample: map[string]any{"topic": "billing", "limit": 3.0}, ArgsSchemaOptOut: "free-form lookup"}),
	}
}

type harness struct {
	srv  *llmtest.Server
	prov *OpenAI
	cat  []actions.Entry
}

func newHarness(t *testing.T, mutate func(*OpenAIConfig)) *harness {
	srv := llmtest.New(t)
	cfg := OpenAIConfig{BaseURL: srv.URL, Model: "test-model", MaxRetries: -1, CallTimeout: 5 * time.Second}
	if mutate != nil {
		mutate(&cfg)
	}
	p, err := NewOpenAI(cfg)
	require.NoError(t, err)
	return &harness{srv: srv, prov: p, cat: testCatalog(t)}
}

func (h *harness) decide(t *testing.T, req *events.DecisionRequested) (events.Decision, []actionbus.Error, error) {
	t.Helper()
	if req.RunID == "" {
		req.RunID, req.Cycle = "01JRUN", 1
	}
	var diags []actionbus.Error
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dec, err := h.prov.Decide(ctx, Input{Request: req, Actions: h.cat, diagnostics: &diags})
	return dec, diags, err
}

func codes(diags []actionbus.Error) []actionbus.Code {
	out := []actionbus.Code{}
	for _, d := range diags {
		out = append(out, d.Code)
	}
	return out
}

func TestOpenAINativeSingleToolCall(t *testing.T) {
	h := newHarness(t, nil)
	h.srv.Script(llmtest.Reply{ToolCalls: []llmtest.ToolCall{llmtest.Call("delivery__searchJobs", map[string]any{"status": "failed"})}})
	dec, diags, err := h.decide(t, &events.DecisionRequested{Prompt: "which jobs failed?"})
	require.NoError(t, err)
	assert.Equal(t, events.Decision{Type: events.DecisionAction, Name: "delivery.searchJobs", Args: map[string]any{"status": "failed"}}, dec)
	assert.Empty(t, diags)
	req := h.srv.Requests()[0]
	assert.Equal(t, "test-model", req.Model)
	var names []string
	for _, tool := range req.Tools {
		names = append(names, tool.Function.Name)
	}
	assert.ElementsMatch(t, []string{"web_search", "read_url", "delivery__searchJobs", "delivery__executeRetry", "notes__lookup", "ask_clarification", "final_answer"}, names)
	assert.Equal(t, "which jobs failed?", req.Messages[1].Text())
}

func TestOpenAINativeToolSchemasAreTheActionSchemas(t *testing.T) {
	h := newHarness(t, nil)
	h.srv.Script(llmtest.Reply{Content: "Nothing to do."})
	_, _, err := h.decide(t, &events.DecisionRequested{Prompt: "hi"})
	require.NoError(t, err)
	got := map[string]map[string]any{}
	for _, tool := range h.srv.Requests()[0].Tools {
		got[tool.Function.Name] = tool.Function.Parameters
	}
	for _, e := range h.cat {
		var want map[string]any
		if len(e.InputSchema) > 0 {
			// The action's own schema, with x-aliases removed (and the
			// seed's optional web_search.query / read_url.url).
			s := strings.ReplaceAll(string(e.InputSchema), `,"x-aliases":["q"]`, "")
			s = strings.ReplaceAll(s, `,"x-aliases":["state"]`, "")
			s = strings.ReplaceAll(s, `,"x-aliases":["group"]`, "")
			s = strings.Replace(s, `"required":["query"]`, `"required":[]`, 1)
			s = strings.Replace(s, `"required":["url"]`, `"required":[]`, 1)
			require.NoError(t, json.Unmarshal([]byte(s), &want), s)
		} else {
			want = map[string]any{"type": "object", "properties": map[string]any{"topic": map[string]any{"type": "string"}, "limit": map[string]any{"type": "number"}}}
		}
		assert.Equal(t, want, got[actions.ToolName(e.Name)], e.Name)
	}
	assert.NotContains(t, mustJSON(t, got), "x-aliases")
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func TestOpenAINativeSeveralToolCallsBecomeOnePlan(t *testing.T) {
	h := newHarness(t, nil)
	h.srv.Script(llmtest.Reply{ToolCalls: []llmtest.ToolCall{
		llmtest.Call("web_search", map[string]any{"query": "nats jetstream"}),
		llmtest.Call("delivery__searchJobs", map[string]any{"status": "failed"}),
		llmtest.Call("read_url", map[string]any{"url": "https://example.com/a"}),
	}})
	dec, _, err := h.decide(t, &events.DecisionRequested{Prompt: "research"})
	require.NoError(t, err)
	require.Equal(t, events.DecisionPlan, dec.Type)
	require.Len(t, dec.Actions, 3)
	assert.Equal(t, []string{"web_search", "delivery.searchJobs", "read_url"}, []string{dec.Actions[0].Name, dec.Actions[1].Name, dec.Actions[2].Name})
	assert.Equal(t, "https://example.com/a", dec.Actions[2].Args["url"])
}

func TestOpenAINativeMixedAllowedAndAskCallsGoBack(t *testing.T) {
	h := newHarness(t, nil)
	h.srv.Script(
		llmtest.Reply{ToolCalls: []llmtest.ToolCall{
			llmtest.Call("delivery__searchJobs", map[string]any{"status": "failed"}),
			llmtest.Call("delivery__executeRetry", map[string]any{"jobId": "j-1"}),
		}},
		llmtest.Reply{ToolCalls: []llmtest.ToolCall{llmtest.Call("delivery__searchJobs", map[string]any{"status": "failed"})}},
	)
	dec, diags, err := h.decide(t, &events.DecisionRequested{Prompt: "retry failed jobs"})
	require.NoError(t, err)
	assert.Equal(t, events.DecisionAction, dec.Type)
	assert.Equal(t, "delivery.searchJobs", dec.Name)
	assert.Equal(t, []actionbus.Code{actionbus.CodePlanRejected}, codes(diags))
	reqs := h.srv.Requests()
	require.Len(t, reqs, 2)
	// The second call carries the refused reply, each tool call answered
	// as not executed, and the reason.
	msgs := reqs[1].Messages
	n := len(msgs)
	assert.Equal(t, "assistant", msgs[n-4].Role)
	assert.Len(t, msgs[n-4].ToolCalls, 2)
	assert.Equal(t, "tool", msgs[n-3].Role)
	assert.Equal(t, "call_1", msgs[n-3].ToolCallID)
	assert.Equal(t, "tool", msgs[n-2].Role)
	assert.Contains(t, msgs[n-1].Text(), "delivery.executeRetry (mode mutate, tier 2) need approval")
}

func TestOpenAIEnvelopeRepair(t *testing.T) {
	tests := []struct {
		name      string
		prompt    string
		reply     string
		want      events.Decision
		wantDiags []actionbus.Code
	}{
		{"exact envelope", "q", `{"type":"final","answer":"done"}`,
			events.Decision{Type: events.DecisionFinal, Answer: "done"}, []actionbus.Code{}},
		{"wrapped in prose", "q", `Sure! Here is my decision: {"type":"action","name":"web_search","args":{"query":"go {generics}"}} Hope that helps.`,
			events.Decision{Type: events.DecisionAction, Name: "web_search", Args: map[string]any{"query": "go {generics}"}}, []actionbus.Code{actionbus.CodePlannerRepaired}},
		{"in a code fence", "q", "```json\n{\"type\":\"clarify\",\"question\":\"Which team?\"}\n```",
			events.Decision{Type: events.DecisionClarify, Question: "Which team?"}, []actionbus.Code{actionbus.CodePlannerRepaired}},
		{"name alias", "q", `{"type":"action","name":"search","args":{"query":"x"}}`,
			events.Decision{Type: events.DecisionAction, Name: "web_search", Args: map[string]any{"query": "x"}}, []actionbus.Code{actionbus.CodePlannerRepaired}},
		{"read_url.url from the prompt", "summarize https://example.org/post?id=7, please", `{"type":"action","name":"read_url","args":{"mode":"text"}}`,
			events.Decision{Type: events.DecisionAction, Name: "read_url", Args: map[string]any{"mode": "text", "url": "https://example.org/post?id=7"}}, []actionbus.Code{actionbus.CodePlannerRepaired}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, func(c *OpenAIConfig) { c.Mode = ModeEnvelope })
			h.srv.Script(llmtest.Reply{Content: tt.reply})
			dec, diags, err := h.decide(t, &events.DecisionRequested{Prompt: tt.prompt})
			require.NoError(t, err)
			assert.Equal(t, tt.want, dec)
			assert.Equal(t, tt.wantDiags, codes(diags))
			req := h.srv.Requests()[0]
			assert.Empty(t, req.Tools, "envelope mode sends no tools")
			system := req.Messages[0].Text()
			assert.Contains(t, system, "- delivery.searchJobs (read): delivery.searchJobs does its job")
			assert.Contains(t, system, `args example: {"limit":3,"topic":"billing"}`)
		})
	}
}

func TestOpenAIInvalidThenCorrected(t *testing.T) {
	h := newHarness(t, func(c *OpenAIConfig) { c.Mode = ModeEnvelope })
	h.srv.Script(
		llmtest.Reply{Content: `{"type":"action","name":"delete_everything","args":{}}`},
		llmtest.Reply{Content: `{"type":"action","name":"delivery.searchJobs","args":{"status":"failed"}}`},
	)
	dec, diags, err := h.decide(t, &events.DecisionRequested{Prompt: "q"})
	require.NoError(t, err)
	assert.Equal(t, "delivery.searchJobs", dec.Name)
	assert.Equal(t, []actionbus.Code{actionbus.CodeActionNotFound}, codes(diags))
	second := h.srv.Requests()[1]
	assert.Contains(t, second.Last().Text(), `action "delete_everything" does not exist`)
	assert.Equal(t, "assistant", second.Messages[len(second.Messages)-2].Role)
}

func TestOpenAIInvalidTwiceFailsTheCycle(t *testing.T) {
	h := newHarness(t, func(c *OpenAIConfig) { c.Mode = ModeEnvelope })
	h.srv.Script(llmtest.Reply{Content: "I think we should search."}, llmtest.Reply{Content: `{"type":"plan","actions":[]}`})
	_, diags, err := h.decide(t, &events.DecisionRequested{Prompt: "q"})
	require.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodePlannerFailed})
	assert.Contains(t, err.Error(), "a plan needs a non-empty actions array")
	assert.Equal(t, []actionbus.Code{actionbus.CodeInvalidDecision, actionbus.CodeInvalidDecision}, codes(diags))
	assert.Len(t, h.srv.Requests(), 2)
}

func TestOpenAIToolMarkupWithoutToolCallsIsADiagnostic(t *testing.T) {
	h := newHarness(t, nil)
	h.srv.Script(
		llmtest.Reply{Content: `<tool_call>{"name": "web_search", "arguments": {"query": "x"}}</tool_call>`},
		llmtest.Reply{ToolCalls: []llmtest.ToolCall{llmtest.Call("web_search", map[string]any{"query": "x"})}},
	)
	dec, diags, err := h.decide(t, &events.DecisionRequested{Prompt: "q"})
	require.NoError(t, err)
	assert.Equal(t, "web_search", dec.Name, "not a silent final")
	assert.Equal(t, []actionbus.Code{actionbus.CodeNativeToolCallsEmpty}, codes(diags))

	h.srv.Script(llmtest.Reply{Content: `{"name": "web_search", "arguments": {"query": "x"}}`}, llmtest.Reply{Content: "<function=web_search>{}</function>"})
	_, diags, err = h.decide(t, &events.DecisionRequested{Prompt: "q"})
	require.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodePlannerFailed})
	assert.Equal(t, []actionbus.Code{actionbus.CodeNativeToolCallsEmpty, actionbus.CodeNativeToolCallsEmpty}, codes(diags))
}

func TestOpenAIPlainTextIsAFinalWithSources(t *testing.T) {
	h := newHarness(t, nil)
	h.srv.Script(llmtest.Reply{Content: "JetStream persists messages."})
	obs := []events.Observation{
		{Cycle: 1, Action: "read_url", OK: true, Output: map[string]any{"ok": true, "url": "https://docs.nats.io/js", "title": "JetStream"}},
		{Cycle: 1, Action: "read_url", OK: false},
		{Cycle: 1, Action: "web_search", OK: true, Output: map[string]any{"url": "https://ignored.example"}},
	}
	dec, _, err := h.decide(t, &events.DecisionRequested{Prompt: "what is jetstream?", Observations: obs})
	require.NoError(t, err)
	assert.Equal(t, events.Decision{Type: events.DecisionFinal, Answer: "JetStream persists messages.\n\nSources:\n1. [JetStream](https://docs.nats.io/js)",
		Citations: []string{"https://docs.nats.io/js"}}, dec)
}

func TestOpenAITypedFailures(t *testing.T) {
	t.Run("timeout", func(t *testing.T) {
		h := newHarness(t, func(c *OpenAIConfig) { c.CallTimeout = 300 * time.Millisecond })
		h.srv.Script(llmtest.Reply{Content: "late", Delay: 10 * time.Second})
		_, _, err := h.decide(t, &events.DecisionRequested{Prompt: "q"})
		require.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeTimeout})
		assert.Contains(t, err.Error(), "did not answer within 300ms")
	})
	t.Run("HTTP 500 after the client's retry", func(t *testing.T) {
		h := newHarness(t, func(c *OpenAIConfig) { c.MaxRetries = 1 })
		h.srv.Script(llmtest.Reply{Status: http.StatusInternalServerError, ErrorMessage: "boom"}, llmtest.Reply{Status: http.StatusInternalServerError, ErrorMessage: "boom again"})
		_, _, err := h.decide(t, &events.DecisionRequested{Prompt: "q"})
		var abErr *actionbus.Error
		require.ErrorAs(t, err, &abErr)
		assert.Equal(t, actionbus.CodeProviderError, abErr.Code)
		assert.Equal(t, 500, abErr.Details["status"])
		assert.Len(t, h.srv.Requests(), 2, "one retry")
	})
	t.Run("caller canceled is not a typed failure", func(t *testing.T) {
		h := newHarness(t, nil)
		h.srv.Script(llmtest.Reply{Content: "late", Delay: 10 * time.Second})
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		_, err := h.prov.Decide(ctx, Input{Request: &events.DecisionRequested{RunID: "r", Cycle: 1, Prompt: "q"}, Actions: h.cat})
		require.ErrorIs(t, err, context.Canceled)
	})
}

func TestOpenAIToolsRejectedFallsBackToEnvelopes(t *testing.T) {
	h := newHarness(t, nil)
	h.srv.RejectTools()
	h.srv.Script(llmtest.Reply{Content: `{"type":"action","name":"delivery.searchJobs","args":{}}`}, llmtest.Reply{Content: `{"type":"final","answer":"ok"}`})
	dec, diags, err := h.decide(t, &events.DecisionRequested{Prompt: "q"})
	require.NoError(t, err)
	assert.Equal(t, "delivery.searchJobs", dec.Name)
	assert.Equal(t, []actionbus.Code{actionbus.CodeToolsUnsupported}, codes(diags))
	reqs := h.srv.Requests()
	require.Len(t, reqs, 2)
	assert.NotEmpty(t, reqs[0].Tools)
	assert.Empty(t, reqs[1].Tools)
	assert.Contains(t, reqs[1].Messages[0].Text(), "Reply with exactly one JSON envelope")

	// The provider remembers: the next decision goes straight to envelopes.
	_, diags, err = h.decide(t, &events.DecisionRequested{Prompt: "q"})
	require.NoError(t, err)
	assert.Empty(t, diags)
	assert.Len(t, h.srv.Requests(), 3)
}

func TestOpenAIModelPool(t *testing.T) {
	h := newHarness(t, func(c *OpenAIConfig) {
		c.Model = ""
		c.Models = map[string]string{"task-main": "planner-large", "writer": "writer-small"}
		c.PlanningModelKey, c.SynthesisModelKey = "task-main", "writer"
	})
	h.srv.Script(llmtest.Reply{Content: "done"}, llmtest.Reply{Content: "A section."})
	_, _, err := h.decide(t, &events.DecisionRequested{Prompt: "q"})
	require.NoError(t, err)
	md, err := h.prov.Synthesize(context.Background(), &events.SynthesisRequested{RunID: "r", Part: events.PartSection, Instruction: "write"})
	require.NoError(t, err)
	assert.Equal(t, "A section.", md)
	reqs := h.srv.Requests()
	assert.Equal(t, "planner-large", reqs[0].Model)
	assert.Equal(t, "writer-small", reqs[1].Model)

	_, err = NewOpenAI(OpenAIConfig{BaseURL: "http://x", PlanningModelKey: "nope"})
	assert.ErrorContains(t, err, `model key "nope" is not in the model pool`)
}

func TestOpenAIFinalizeStreamsTokens(t *testing.T) {
	h := newHarness(t, nil)
	h.srv.Script(llmtest.Reply{Content: "Two jobs failed: j-1 and j-2."})
	var got []string
	var diags []actionbus.Error
	req := &events.DecisionRequested{RunID: "r", Cycle: 2, Prompt: "report", Synthesize: "Summarize the failures.",
		Observations: []events.Observation{{Cycle: 1, Action: "delivery.searchJobs", OK: true, Output: map[string]any{"jobs": []any{"j-1", "j-2"}}}}}
	dec, err := h.prov.Decide(context.Background(), Input{Request: req, Actions: h.cat, diagnostics: &diags, Stream: func(d string) { got = append(got, d) }})
	require.NoError(t, err)
	assert.Equal(t, events.Decision{Type: events.DecisionFinal, Answer: "Two jobs failed: j-1 and j-2."}, dec)
	assert.Greater(t, len(got), 3, "streamed in pieces")
	assert.Equal(t, dec.Answer, strings.Join(got, ""))
	sent := h.srv.Requests()[0]
	assert.True(t, sent.Stream)
	assert.Empty(t, sent.Tools)
	assert.Contains(t, sent.Messages[0].Text(), "Instruction: Summarize the failures.")
}

func TestParseModelPool(t *testing.T) {
	pool, err := ParseModelPool(" task-main=deepseek-chat, writer = gpt-4o-mini ,")
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"task-main": "deepseek-chat", "writer": "gpt-4o-mini"}, pool)
	for _, bad := range []string{"task-main", "=m", "k="} {
		_, err := ParseModelPool(bad)
		assert.Error(t, err, bad)
	}
}

func FuzzExtractJSON(f *testing.F) {
	for _, s := range []string{`{"type":"final"}`, "```json\n{\"a\":1}\n```", `say {"a":"}"} and {"b":2}`, `{{{`, `"}{"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		raw, ok := extractJSON(s)
		if ok && !json.Valid([]byte(raw)) {
			t.Fatalf("extractJSON(%q) returned invalid JSON %q", s, raw)
		}
	})
}
