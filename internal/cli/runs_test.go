package cli_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/cli"
	"github.com/actionbus/actionbus/internal/llmtest"
)

// TestRunsListsRunsWithWhatTheyWaitFor: a run the planner has not
// answered (no planner runs) and a completed exec run, listed and
// filtered.
func TestRunsListsRunsWithWhatTheyWaitFor(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{NoPlanner: true, Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "t.ping", Description: "Ping."},
			func(context.Context, struct{}, executor.Call) (executor.Result[struct{}], error) {
				return executor.Result[struct{}]{Summary: "pong"}, nil
			})
	}})
	rec := srv.Record(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waiting, err := st.Client.Start(ctx, client.RunRequest{Prompt: "anyone there?", UserID: "u1"})
	require.NoError(t, err)
	done, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "t.ping"}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, done.Status)
	_, err = rec.Await(ctx, func(r actionbustest.Recorded) bool {
		return r.Type() == "io.actionbus.decision.requested" && r.Subject == "ab.run.default."+waiting+".decide"
	})
	require.NoError(t, err)

	// Both are listed at once, though neither is in the run-state bucket
	// yet (a run is admitted unstored, and the completed one never will
	// be): from their requests and ends.
	var out, errOut bytes.Buffer
	require.Equal(t, 0, cli.Execute(ctx, []string{"--nats", srv.URL, "runs"}, nil, &out, &errOut), errOut.String())
	assert.Regexp(t, waiting+`\s+default\s+running\s+agent\s+\S+\s+\S.*\s+u1`, out.String())
	assert.Regexp(t, done.RunID+`\s+default\s+completed\s+exec\s+\S+\s+-\s+-`, out.String())

	// The waiting run outlives the dispatcher's alarm delay: its state is
	// stored, with what it waits for.
	kv, err := srv.JS.KeyValue(ctx, "ab_runs")
	require.NoError(t, err)
	require.Eventually(t, func() bool { _, err := kv.Get(ctx, waiting); return err == nil }, 10*time.Second, 20*time.Millisecond)
	out.Reset()
	require.Equal(t, 0, cli.Execute(ctx, []string{"--nats", srv.URL, "runs"}, nil, &out, &errOut), errOut.String())
	assert.Regexp(t, waiting+`\s+default\s+running\s+agent\s+\S+\s+planner \(cycle 1\)\s+u1`, out.String())
	assert.Regexp(t, done.RunID+`\s+default\s+completed\s+exec\s+\S+\s+-\s+-`, out.String())

	out.Reset()
	require.Equal(t, 0, cli.Execute(ctx, []string{"--nats", srv.URL, "runs", "--status", "completed"}, nil, &out, &errOut))
	assert.Contains(t, out.String(), done.RunID)
	assert.NotContains(t, out.String(), waiting)

	// Runs of another tenant are listed with it, and filtered by it.
	acme, err := client.New(srv.Connect(t), client.Options{Tenant: "acme"})
	require.NoError(t, err)
	other, err := acme.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "t.ping"}}, nil)
	require.NoError(t, err)
	out.Reset()
	require.Equal(t, 0, cli.Execute(ctx, []string{"--nats", srv.URL, "runs", "--only-tenant", "acme"}, nil, &out, &errOut))
	assert.Regexp(t, other.RunID+`\s+acme\s+completed`, out.String())
	assert.NotContains(t, out.String(), done.RunID)
}

// TestRunsIsRefusedToTheClientUser: run state holds each run's secret id
// key, so the deployed client user cannot list it.
func TestRunsIsRefusedToTheClientUser(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{Users: true})
	var out, errOut bytes.Buffer
	code := cli.Execute(context.Background(), []string{"--nats", srv.UserURL("client"), "runs"}, nil, &out, &errOut)
	assert.NotEqual(t, 0, code)
	out.Reset()
	errOut.Reset()
	assert.Equal(t, 0, cli.Execute(context.Background(), []string{"--nats", srv.UserURL("admin"), "runs"}, nil, &out, &errOut), errOut.String())
}

// TestRunAndRunsShowTheLLMUsageAndCost: an agent run whose one call
// reports 120 input and 30 output tokens, priced 2 and 8 USD per million:
// `run` prints the usage after the outcome, and `runs` lists its tokens
// and cost.
func TestRunAndRunsShowTheLLMUsageAndCost(t *testing.T) {
	llm := llmtest.New(t)
	llm.Respond(func(llmtest.Request) llmtest.Reply {
		return llmtest.Reply{ToolCalls: []llmtest.ToolCall{llmtest.Call("final_answer", map[string]any{"answer": "done"})},
			Usage: &llmtest.Usage{PromptTokens: 120, CompletionTokens: 30}}
	})
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	srv.StartStack(t, actionbustest.StackOptions{OpenAI: &actionbustest.OpenAIOptions{BaseURL: llm.URL,
		Prices: map[string]events.Price{"test-model": {InputPerMillion: 2, OutputPerMillion: 8}}}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	require.Equal(t, 0, cli.Execute(ctx, []string{"--nats", srv.URL, "run", "--max-tokens", "1000", "Is it done?"}, nil, &out, &errOut), errOut.String())
	assert.Contains(t, out.String(), "LLM usage: 150 tokens (120 in, 30 out) in 1 call(s), $0.0005")

	out.Reset()
	require.Equal(t, 0, cli.Execute(ctx, []string{"--nats", srv.URL, "runs"}, nil, &out, &errOut), errOut.String())
	assert.Regexp(t, `TOKENS\s+COST`, out.String())
	assert.Regexp(t, `completed\s+agent\s+.*\s150\s+\$0\.0005`, out.String())
}
