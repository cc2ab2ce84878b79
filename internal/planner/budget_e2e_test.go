package planner_test

import (
	"context"
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
	"github.com/actionbus/actionbus/internal/planner"
)

// readsForever answers every planning call with one more read_url, each
// reporting usage: a loop that stays under the cycle limit for long.
func readsForever(prompt, completion int) func(llmtest.Request) llmtest.Reply {
	return func(llmtest.Request) llmtest.Reply {
		return llmtest.Reply{ToolCalls: []llmtest.ToolCall{llmtest.Call("read_url", map[string]any{"url": "https://a.example/nats"})},
			Usage: &llmtest.Usage{PromptTokens: prompt, CompletionTokens: completion}}
	}
}

var testPrices = map[string]events.Price{"test-model": {InputPerMillion: 2, OutputPerMillion: 8}}

// TestARunStopsAtItsTokenBudgetWithExactUsage: each planning call
// reports 10 000 + 100 tokens. With a budget of 15 000 tokens the second
// call (whose estimated input, well under 5 000, fits) goes over: the run
// ends budget_exceeded mid-loop, its second decision not acted on, with
// the usage of exactly two calls and their cost from the price table.
func TestARunStopsAtItsTokenBudgetWithExactUsage(t *testing.T) {
	llm := llmtest.New(t)
	llm.Respond(readsForever(10000, 100))
	var edition atomic.Int32
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{OpenAI: &actionbustest.OpenAIOptions{BaseURL: llm.URL, Prices: testPrices},
		Register: registerTestActions(&edition)})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Prompt: "Read it again and again.", Budget: &client.Budget{MaxTokens: 15000}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	require.ErrorIs(t, res.Error, actionbus.ErrBudgetExceeded)
	assert.Equal(t, "tokens", res.Error.Details["budget"])
	want := client.Usage{Calls: 2, InputTokens: 20000, OutputTokens: 200, CostUSD: 0.0416,
		ByModel: map[string]events.ModelUsage{"test-model": {Calls: 2, InputTokens: 20000, OutputTokens: 200, CostUSD: 0.0416}}}
	require.NotNil(t, res.Usage)
	assert.Equal(t, want, *res.Usage)
	assert.Equal(t, 2, res.Cycles)
	assert.Len(t, llm.Requests(), 2)

	// The audit: a usage entry per call on each decision's record, the
	// run's usage on its end.
	var recs []client.AuditRecord
	require.Eventually(t, func() bool {
		recs, err = st.Client.AuditRecords(ctxT(t), res.RunID)
		return err == nil && len(recs) > 0 && recs[len(recs)-1].Kind == "run" && recs[len(recs)-1].Status == "failed"
	}, 20*time.Second, 50*time.Millisecond)
	var calls []events.LLMUsage
	for _, r := range recs {
		if r.EventType == events.TypeDecisionMade {
			calls = append(calls, r.Usage...)
		}
	}
	assert.Equal(t, []events.LLMUsage{{Model: "test-model", InputTokens: 10000, OutputTokens: 100, CostUSD: 0.0208},
		{Model: "test-model", InputTokens: 10000, OutputTokens: 100, CostUSD: 0.0208}}, calls)
	assert.Equal(t, &want, recs[len(recs)-1].RunUsage)
}

// TestACallThatWouldGoOverIsNotMade: each call reports 10 000 tokens and
// the budget is 10 300. The first call is made; the second call's
// estimated input (its messages and tools, over 1 200 bytes) would go
// over, so it is not made: the run ends budget_exceeded with the usage
// of the one call.
func TestACallThatWouldGoOverIsNotMade(t *testing.T) {
	llm := llmtest.New(t)
	llm.Respond(readsForever(10000, 0))
	var edition atomic.Int32
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{OpenAI: &actionbustest.OpenAIOptions{BaseURL: llm.URL, Prices: testPrices},
		Register: registerTestActions(&edition)})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Prompt: "Read it twice.", Budget: &client.Budget{MaxTokens: 10300}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	require.ErrorIs(t, res.Error, actionbus.ErrBudgetExceeded)
	assert.Len(t, llm.Requests(), 1, "the second call was not made")
	require.NotNil(t, res.Usage)
	assert.Equal(t, client.Usage{Calls: 1, InputTokens: 10000, CostUSD: 0.02,
		ByModel: map[string]events.ModelUsage{"test-model": {Calls: 1, InputTokens: 10000, CostUSD: 0.02}}}, *res.Usage)
	usage, _ := res.Error.Details["usage"].(map[string]any)
	assert.EqualValues(t, 10000, usage["inputTokens"], "the evidence is the run's usage")
}

// TestABudgetSmallerThanTheFirstCallMakesNoCall: a budget smaller than
// the first call's estimated input fails the run before any LLM call.
func TestABudgetSmallerThanTheFirstCallMakesNoCall(t *testing.T) {
	llm := llmtest.New(t)
	llm.Respond(readsForever(1, 1))
	var edition atomic.Int32
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{OpenAI: &actionbustest.OpenAIOptions{BaseURL: llm.URL}, Register: registerTestActions(&edition)})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Prompt: "Read it.", Budget: &client.Budget{MaxTokens: 10}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	require.ErrorIs(t, res.Error, actionbus.ErrBudgetExceeded)
	assert.Empty(t, llm.Requests(), "the call was not made")
	assert.Nil(t, res.Usage, "nothing was used")
}

// TestAProviderWithoutUsageGetsEstimatesMarkedAsEstimates: an endpoint
// that reports no usage; the run's usage is estimated from the bytes sent
// and received, and says so.
func TestAProviderWithoutUsageGetsEstimatesMarkedAsEstimates(t *testing.T) {
	llm := llmtest.New(t)
	llm.Script(llmtest.Reply{Content: `{"type":"final","answer":"Forty-two."}`, NoUsage: true})
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{OpenAI: &actionbustest.OpenAIOptions{BaseURL: llm.URL, Mode: "envelope", Prices: testPrices}})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Prompt: "What is the answer?"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	require.NotNil(t, res.Usage)
	assert.Equal(t, 1, res.Usage.Calls)
	assert.Equal(t, 1, res.Usage.EstimatedCalls)
	reqs := llm.Requests()
	require.Len(t, reqs, 1)
	assert.Greater(t, res.Usage.InputTokens, int64(len(reqs[0].All())/4)-1, "about four bytes a token of what was sent")
	assert.Equal(t, events.EstimateTokens(len(`{"type":"final","answer":"Forty-two."}`)), res.Usage.OutputTokens)
	assert.Positive(t, res.Usage.CostUSD)
}

// TestACallerCannotRaiseItsBudget: the host grants every run 5 000
// tokens; a request for 50 000 is refused before any call, and a request
// for 2 000 is kept.
func TestACallerCannotRaiseItsBudget(t *testing.T) {
	llm := llmtest.New(t)
	llm.Respond(func(llmtest.Request) llmtest.Reply {
		return llmtest.Reply{Content: `{"type":"final","answer":"ok"}`, Usage: &llmtest.Usage{PromptTokens: 10, CompletionTokens: 5}}
	})
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "")
	st := srv.StartStack(t, actionbustest.StackOptions{OpenAI: &actionbustest.OpenAIOptions{BaseURL: llm.URL, Mode: "envelope"},
		Limits: events.RunLimits{RunBudget: events.Budget{MaxTokens: 5000}}})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Prompt: "Spend freely.", Budget: &client.Budget{MaxTokens: 50000}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	require.ErrorIs(t, res.Error, actionbus.ErrBudgetExceeded)
	assert.Equal(t, "request", res.Error.Details["budget"])
	assert.Empty(t, llm.Requests())

	res, err = st.Client.Run(ctxT(t), client.RunRequest{Prompt: "Spend little.", Budget: &client.Budget{MaxTokens: 2000}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	r := rec.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
		var d events.DecisionRequested
		return r.Type() == events.TypeDecisionRequested && events.DataAs(r.Event, &d) == nil && d.RunID == res.RunID
	})
	var d events.DecisionRequested
	require.NoError(t, events.DataAs(r.Event, &d))
	require.NotNil(t, d.Budget)
	assert.Equal(t, int64(2000), d.Budget.MaxTokens, "the planner is asked within the run's own, lower budget")

	res, err = st.Client.Run(ctxT(t), client.RunRequest{Prompt: "No budget asked."}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, &client.Usage{Calls: 1, InputTokens: 10, OutputTokens: 5, UnpricedCalls: 1,
		ByModel: map[string]events.ModelUsage{"test-model": {Calls: 1, InputTokens: 10, OutputTokens: 5}}}, res.Usage)
}

// TestATenantsDailyBudgetIsSharedByTwoPlanners: two planner services (each
// its own connection, sharing only the planners' limits bucket) serve ten
// runs of one tenant at once, every call reporting 5 000 tokens, under a
// daily budget of 60 000 tokens. The day's spend ends within one call's
// worth of the budget (measured: it is the sum of the runs' own usage),
// every run ends budget_exceeded, and a new run of the tenant is refused
// with the same code before any call is made.
func TestATenantsDailyBudgetIsSharedByTwoPlanners(t *testing.T) {
	const perCall, budget = 5000, 60000
	llm := llmtest.New(t)
	llm.Respond(readsForever(perCall, 0))
	var edition atomic.Int32
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{OpenAI: &actionbustest.OpenAIOptions{BaseURL: llm.URL},
		Register: registerTestActions(&edition), Limits: events.RunLimits{TenantBudgets: map[string]events.Budget{"*": {MaxTokens: budget}}}})
	startPlanner(t, srv, llm.URL)

	ctx := ctxT(t)
	results := make(chan *client.Result, 10)
	for range 10 {
		go func() {
			res, err := st.Client.Run(ctx, client.RunRequest{Prompt: "Read it again and again."}, nil)
			if err != nil {
				res = &client.Result{Status: "error: " + err.Error()}
			}
			results <- res
		}()
	}
	var spent int64
	for range 10 {
		res := <-results
		require.Equal(t, client.StatusFailed, res.Status)
		require.ErrorIs(t, res.Error, actionbus.ErrBudgetExceeded, "%+v", res.Error)
		if res.Usage != nil {
			spent += res.Usage.Tokens()
		}
	}
	calls := len(llm.Requests())
	assert.Equal(t, int64(calls*perCall), spent, "every call made is counted in its run")
	assert.LessOrEqual(t, spent, int64(budget+perCall), "the day's spend went over the budget by more than one call's worth")
	assert.GreaterOrEqual(t, spent, int64(budget-perCall), "the budget was not used")
	t.Logf("10 runs, 2 planners: %d calls, %d tokens spent of a %d budget", calls, spent, budget)

	res, err := st.Client.Run(ctx, client.RunRequest{Prompt: "One more?"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	require.ErrorIs(t, res.Error, actionbus.ErrBudgetExceeded)
	assert.Equal(t, "tenant", res.Error.Details["budget"])
	assert.Equal(t, calls, len(llm.Requests()), "the tenant over its daily budget makes no call")
}

// startPlanner runs one more planner service, on a connection of its own,
// with the stack's OpenAI endpoint, until the test ends.
func startPlanner(t *testing.T, srv *actionbustest.Server, url string) {
	t.Helper()
	provider, err := planner.NewOpenAI(planner.OpenAIConfig{BaseURL: url, Model: "test-model", MaxRetries: -1})
	require.NoError(t, err)
	p, err := planner.New(srv.Connect(t), planner.Config{Provider: provider})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}
