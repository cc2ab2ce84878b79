package tracing_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/llmtest"
	"github.com/actionbus/actionbus/internal/tracing"
)

type lookupIn struct {
	Account string `json:"account"`
	Card    string `json:"card"`
}

// register hosts acct.lookup, whose audit policy keeps its input and
// output with the card and the token redacted; its handler opens a span of
// its own.
func register(ex *executor.Executor) error {
	return executor.Register(ex, executor.Action{Name: "acct.lookup", Description: "Look an account up by card.",
		AuditPolicy: &executor.AuditPolicy{Input: "redacted", Output: "full", RedactPaths: []string{"/card", "/token"}}},
		func(ctx context.Context, in lookupIn, _ executor.Call) (executor.Result[map[string]any], error) {
			_, span := tracing.Tracer().Start(ctx, "handler work")
			defer span.End()
			return executor.Result[map[string]any]{Output: map[string]any{"account": in.Account, "token": "SECRET-TOKEN-77", "balance": 5}}, nil
		})
}

// recordSpans installs a tracer provider with the SDK's in-memory
// exporter for the test.
func recordSpans(t *testing.T) *tracetest.InMemoryExporter {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() {
		otel.SetTracerProvider(prev)
		_ = tp.Shutdown(context.Background())
	})
	return exp
}

func attr(s tracetest.SpanStub, key string) string {
	for _, a := range s.Attributes {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}

// TestARunIsOneTraceAcrossTheServices runs an agent run (an LLM planner
// over a chat-completions server, one action) through the real services
// and checks the spans: one trace, the caller's; parents right from the
// caller's publish through the dispatcher, the planner and its LLM call,
// the executor and the handler, to the audit append; the GenAI attributes;
// and no redacted value in any attribute.
func TestARunIsOneTraceAcrossTheServices(t *testing.T) {
	exp := recordSpans(t)
	llm := llmtest.New(t)
	llm.Script(
		llmtest.Reply{ToolCalls: []llmtest.ToolCall{llmtest.Call("acct.lookup", map[string]any{"account": "A-1", "card": "4111-SECRET-CARD"})}},
		llmtest.Reply{Content: "Account A-1 holds 5."},
	)
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Register: register, OpenAI: &actionbustest.OpenAIOptions{BaseURL: llm.URL}})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ctx, caller := tracing.Tracer().Start(ctx, "caller")
	res, err := st.Client.Run(ctx, client.RunRequest{Prompt: "What does account A-1 hold?"}, nil)
	caller.End()
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)

	want := []string{"caller", "publish run.requested", "dispatcher run.requested", "invoke_agent openai", "chat test-model",
		"execute_tool acct.lookup", "handler work", "dispatcher action.completed", "audit append"}
	byName := map[string]tracetest.SpanStub{}
	// Spans end after the events they send: the run's end is seen before
	// the last ones are recorded, and audit appends wait FlushAfter.
	require.Eventually(t, func() bool {
		for _, s := range exp.GetSpans() {
			if _, seen := byName[s.Name]; !seen {
				byName[s.Name] = s
			}
		}
		for _, n := range want {
			if _, ok := byName[n]; !ok {
				return false
			}
		}
		return true
	}, 20*time.Second, 20*time.Millisecond, "spans recorded: %v", func() []string {
		var names []string
		for n := range byName {
			names = append(names, n)
		}
		return names
	}())

	traceID := caller.SpanContext().TraceID()
	for _, s := range exp.GetSpans() {
		if attr(s, "actionbus.run_id") == res.RunID || s.Name == "handler work" {
			assert.Equal(t, traceID, s.SpanContext.TraceID(), "span %q is not in the caller's trace", s.Name)
		}
	}
	parent := func(child string) string {
		c := byName[child]
		for _, s := range exp.GetSpans() {
			if s.SpanContext.SpanID() == c.Parent.SpanID() {
				return s.Name
			}
		}
		return "(none: " + c.Parent.SpanID().String() + ")"
	}
	assert.Equal(t, "caller", parent("publish run.requested"))
	assert.Equal(t, "publish run.requested", parent("dispatcher run.requested"))
	assert.True(t, strings.HasPrefix(parent("invoke_agent openai"), "dispatcher "), parent("invoke_agent openai"))
	assert.Equal(t, "invoke_agent openai", parent("chat test-model"))
	assert.True(t, strings.HasPrefix(parent("execute_tool acct.lookup"), "dispatcher "), parent("execute_tool acct.lookup"))
	assert.Equal(t, "execute_tool acct.lookup", parent("handler work"))
	assert.Equal(t, "execute_tool acct.lookup", parent("dispatcher action.completed"))

	tool := byName["execute_tool acct.lookup"]
	assert.Equal(t, trace.SpanKindInternal, tool.SpanKind)
	assert.Equal(t, "execute_tool", attr(tool, "gen_ai.operation.name"))
	assert.Equal(t, "acct.lookup", attr(tool, "gen_ai.tool.name"))
	assert.NotEmpty(t, attr(tool, "gen_ai.tool.call.id"))
	assert.Contains(t, attr(tool, "gen_ai.tool.call.arguments"), `"card":"[REDACTED]"`, "the audit policy keeps the input, redacted")
	assert.Contains(t, attr(tool, "gen_ai.tool.call.result"), `"token":"[REDACTED]"`)
	chat := byName["chat test-model"]
	assert.Equal(t, "chat", attr(chat, "gen_ai.operation.name"))
	assert.Equal(t, "openai", attr(chat, "gen_ai.provider.name"))
	assert.Equal(t, "test-model", attr(chat, "gen_ai.request.model"))
	assert.Equal(t, "1", attr(chat, "gen_ai.usage.input_tokens"))
	assert.Equal(t, "invoke_agent", attr(byName["invoke_agent openai"], "gen_ai.operation.name"))

	for _, s := range exp.GetSpans() {
		for _, a := range s.Attributes {
			assert.NotContains(t, a.Value.String(), "SECRET", "span %q attribute %s holds a redacted value", s.Name, a.Key)
		}
		assert.NotContains(t, s.Status.Description, "SECRET")
	}
}

// TestTracingIsOffByDefault: with OpenTelemetry's no-op provider (nothing
// configured), no event carries trace context.
func TestTracingIsOffByDefault(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "ab.>")
	st := srv.StartStack(t, actionbustest.StackOptions{Register: register})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "acct.lookup", Args: map[string]any{"account": "A", "card": "c"}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status)
	rec.WaitForType(t, 10*time.Second, "io.actionbus.run.completed", res.RunID)
	for _, r := range rec.All() {
		assert.Empty(t, r.Header.Get("traceparent"), r.Subject)
		assert.Empty(t, r.Header.Get("ce-traceparent"), r.Subject)
	}
}

// TestACallersTraceIsJoinedWithTracingOff: a caller with a span of its own
// starts a run in a process that does not trace: the run's events carry
// the caller's context, so the caller's collector sees where it went.
func TestACallersTraceIsJoinedWithTracingOff(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "ab.run.>")
	st := srv.StartStack(t, actionbustest.StackOptions{Register: register})
	callerTrace, _ := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	callerSpan, _ := trace.SpanIDFromHex("b7ad6b7169203331")
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: callerTrace, SpanID: callerSpan, TraceFlags: trace.FlagsSampled, Remote: true}))
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "acct.lookup", Args: map[string]any{"account": "A", "card": "c"}}}, nil)
	require.NoError(t, err)
	done := rec.WaitForType(t, 10*time.Second, "io.actionbus.run.completed", res.RunID)
	assert.Contains(t, done.Header.Get("ce-traceparent"), callerTrace.String(), "the run's events carry the caller's trace")
}

// TestAnUntracedCallersRunIsOneTrace: a caller that does not trace (a
// client in another language, the CLI without OTEL_*) publishes a
// run.requested with no trace context; the dispatcher starts the run's
// trace, and every span of the run — the executor's and the auditor's
// append included — is in that one trace.
func TestAnUntracedCallersRunIsOneTrace(t *testing.T) {
	exp := recordSpans(t)
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	srv.StartStack(t, actionbustest.StackOptions{Register: register})
	rec := srv.Record(t, "")
	runID := events.NewID()
	body, err := json.Marshal(map[string]any{"runId": runID, "action": map[string]any{"name": "acct.lookup", "args": map[string]any{"account": "A", "card": "c"}}})
	require.NoError(t, err)
	msg := nats.NewMsg("ab.run.default." + runID + ".requested")
	for k, v := range map[string]string{"ce-specversion": "1.0", "ce-id": runID, "ce-source": "/untraced-caller", "ce-type": "io.actionbus.run.requested",
		"ce-datacontenttype": "application/json", "ce-runid": runID, "ce-tenant": "default", "Nats-Msg-Id": runID} {
		msg.Header.Set(k, v)
	}
	msg.Data = body
	nc := srv.Connect(t)
	_, err = nc.RequestMsg(msg, 10*time.Second)
	require.NoError(t, err, "the ingress stores the request")
	rec.WaitForType(t, 20*time.Second, "io.actionbus.run.completed", runID)

	want := []string{"dispatcher run.requested", "execute_tool acct.lookup", "dispatcher action.completed", "audit append"}
	var spans []tracetest.SpanStub
	require.Eventually(t, func() bool {
		spans = spans[:0]
		seen := map[string]bool{}
		for _, s := range exp.GetSpans() {
			if attr(s, "actionbus.run_id") == runID {
				spans = append(spans, s)
				seen[s.Name] = true
			}
		}
		for _, n := range want {
			if !seen[n] {
				return false
			}
		}
		return true
	}, 20*time.Second, 20*time.Millisecond, "the run's spans are recorded")
	var root tracetest.SpanStub
	for _, s := range spans {
		if s.Name == "dispatcher run.requested" {
			root = s
		}
	}
	assert.False(t, root.Parent.IsValid(), "the dispatcher starts the trace of a run whose caller does not trace")
	for _, s := range spans {
		assert.Equal(t, root.SpanContext.TraceID(), s.SpanContext.TraceID(), "span %q is in a trace of its own", s.Name)
		if s.Name != root.Name {
			assert.True(t, s.Parent.IsValid(), "span %q is a root", s.Name)
		}
	}
}

// TestAPlainHandlerErrorIsTheSameCodeOnTheEventAndTheSpan: a handler that
// returns an error of no code fails with handler_failed, and its span's
// error.type is that code too, not internal.
func TestAPlainHandlerErrorIsTheSameCodeOnTheEventAndTheSpan(t *testing.T) {
	exp := recordSpans(t)
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "acct.broken", Description: "Always fails with a plain error."},
			func(context.Context, lookupIn, executor.Call) (executor.Result[map[string]any], error) {
				return executor.Result[map[string]any]{}, errors.New("the ledger is down")
			})
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "acct.broken", Args: map[string]any{"account": "A", "card": "c"}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	require.NotNil(t, res.Error)
	assert.Equal(t, actionbus.CodeHandlerFailed, res.Error.Code)
	var span tracetest.SpanStub
	require.Eventually(t, func() bool {
		for _, s := range exp.GetSpans() {
			if s.Name == "execute_tool acct.broken" {
				span = s
				return true
			}
		}
		return false
	}, 20*time.Second, 20*time.Millisecond)
	assert.Equal(t, string(res.Error.Code), attr(span, "error.type"))
	assert.Equal(t, string(res.Error.Code), span.Status.Description)
}
