package attack42_test

import (
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/llmtest"
)

// readAgain is a planning reply that reads one more page, reporting u.
func readAgain(u llmtest.Usage) llmtest.Reply {
	return llmtest.Reply{ToolCalls: []llmtest.ToolCall{llmtest.Call("read_url", map[string]any{"url": "https://a.example/nats"})}, Usage: &u}
}

// TestAttack42_LyingEndpointRefundsARunsBudgetWithNegativeUsage: the LLM
// endpoint (or a proxy in front of it) answers the run's first call with
// a usage of minus a billion prompt tokens, then every call with 10 000
// real tokens. The planner takes the provider's numbers as they are, so
// the run's usage goes negative and its 15 000-token budget is never
// reached (observed instead: the dispatcher rejects the decision, schema
// minimum 0, and the run stalls until its deadline, never ending). Safe: a negative count is no
// refund (it counts as nothing, or as the estimate), so the run ends
// budget_exceeded by its third call.
func TestAttack42_LyingEndpointRefundsARunsBudgetWithNegativeUsage(t *testing.T) {
	llm := llmtest.New(t)
	var n atomic.Int32
	llm.Respond(func(llmtest.Request) llmtest.Reply {
		if n.Add(1) == 1 {
			return readAgain(llmtest.Usage{PromptTokens: -1_000_000_000, CompletionTokens: 0})
		}
		return readAgain(llmtest.Usage{PromptTokens: 10000, CompletionTokens: 0})
	})
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{OpenAI: &actionbustest.OpenAIOptions{BaseURL: llm.URL}, Register: registerReadURL, Logger: testLogger(t)})
	res, err := st.Client.Run(ctxFor(t, 30*time.Second), client.RunRequest{Prompt: "Read it again and again.", Budget: &client.Budget{MaxTokens: 15000}}, nil)
	require.NoError(t, err, "the run had not ended after %d LLM calls on a 15 000-token budget", len(llm.Requests()))
	t.Logf("status %s, error %v, usage %+v, LLM calls %d", res.Status, res.Error, res.Usage, len(llm.Requests()))
	require.Equal(t, client.StatusFailed, res.Status)
	require.ErrorIs(t, res.Error, actionbus.ErrBudgetExceeded)
	assert.LessOrEqual(t, len(llm.Requests()), 3, "calls made on a 15 000-token budget at 10 000 real tokens a call")
	if res.Usage != nil {
		assert.GreaterOrEqual(t, res.Usage.Tokens(), int64(0), "a run's usage is never negative")
	}
}

// TestAttack42_LyingEndpointOverflowsARunsUsagePastItsBudget: the
// endpoint reports MaxInt64 prompt tokens and 2 completion tokens. Their
// sum wraps int64 to a negative number, which no budget bound is above:
// the run goes on calling (observed: a second call is made, then the run
// stalls). Safe: a call that reported more than the
// run's budget ends the run budget_exceeded after that one call.
func TestAttack42_LyingEndpointOverflowsARunsUsagePastItsBudget(t *testing.T) {
	llm := llmtest.New(t)
	llm.Respond(func(llmtest.Request) llmtest.Reply {
		return readAgain(llmtest.Usage{PromptTokens: math.MaxInt64, CompletionTokens: 2})
	})
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{OpenAI: &actionbustest.OpenAIOptions{BaseURL: llm.URL}, Register: registerReadURL, Logger: testLogger(t)})
	res, err := st.Client.Run(ctxFor(t, 30*time.Second), client.RunRequest{Prompt: "Read it again and again.", Budget: &client.Budget{MaxTokens: 15000}}, nil)
	require.NoError(t, err, "the run had not ended after %d LLM calls on a 15 000-token budget", len(llm.Requests()))
	t.Logf("status %s, error %v, usage %+v, LLM calls %d", res.Status, res.Error, res.Usage, len(llm.Requests()))
	require.Equal(t, client.StatusFailed, res.Status)
	require.ErrorIs(t, res.Error, actionbus.ErrBudgetExceeded)
	assert.Len(t, llm.Requests(), 1, "no call after one that reported more than the budget")
}

// TestAttack42_LyingEndpointRefundsItsTenantsDay: the tenant's day holds
// 25 000 tokens. Run 1's call reports 10 000 tokens; run 2's call (the
// endpoint lies) reports minus a billion, which refunded the day's spend
// (and the decision carrying it was rejected, stalling run 2); run 3's
// call reports 10 000. Safe: the lie is counted as an estimate, run 2
// ends, and with 20 000 and more spent and a largest call of 10 000 run 4
// cannot reserve a call's worth: it ends budget_exceeded before any call.
func TestAttack42_LyingEndpointRefundsItsTenantsDay(t *testing.T) {
	llm := llmtest.New(t)
	var lie atomic.Bool
	llm.Respond(func(llmtest.Request) llmtest.Reply {
		u := llmtest.Usage{PromptTokens: 10000}
		if lie.Load() {
			u = llmtest.Usage{PromptTokens: -1_000_000_000}
		}
		return llmtest.Reply{Content: "Done.", Usage: &u}
	})
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{OpenAI: &actionbustest.OpenAIOptions{BaseURL: llm.URL}, Register: registerReadURL, Logger: testLogger(t),
		Limits: events.RunLimits{TenantBudgets: map[string]events.Budget{"*": {MaxTokens: 25000}}}})
	run := func(i int, lying bool) *client.Result {
		lie.Store(lying)
		before := len(llm.Requests())
		res, err := st.Client.Run(ctxFor(t, 30*time.Second), client.RunRequest{Prompt: "Say done."}, nil)
		require.NoError(t, err, "run %d had not ended after %d LLM calls", i, len(llm.Requests())-before)
		t.Logf("run %d: status %s, error %v, usage %+v, LLM calls %d", i, res.Status, res.Error, res.Usage, len(llm.Requests())-before)
		return res
	}
	require.Equal(t, client.StatusCompleted, run(1, false).Status)
	// Run 2's call reports negative usage: the planner does not believe
	// it (it counts an estimate, marked so), so nothing is refunded and
	// the run ends.
	lied := run(2, true)
	require.Equal(t, client.StatusCompleted, lied.Status)
	require.NotNil(t, lied.Usage)
	assert.Equal(t, 1, lied.Usage.EstimatedCalls, "the lie is replaced by an estimate")
	assert.Positive(t, lied.Usage.InputTokens)
	require.Equal(t, client.StatusCompleted, run(3, false).Status)
	before := len(llm.Requests())
	res := run(4, false)
	require.Equal(t, client.StatusFailed, res.Status, "run 4 runs on a day with 20 000 of 25 000 tokens spent and a largest call of 10 000")
	assert.ErrorIs(t, res.Error, actionbus.ErrBudgetExceeded)
	assert.Equal(t, before, len(llm.Requests()), "run 4 makes no call on a day already spent")
}
