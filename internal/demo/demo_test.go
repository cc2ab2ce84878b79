package demo_test

import (
	"context"
	"encoding/base64"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/demo"
)

var key = []byte("0123456789abcdef0123456789abcdef")

// The retry runs only with an approval bound to the dry run's hash, and a
// retried call with the same idempotency key changes nothing twice.
func TestExecuteRetryIsBoundToTheDryRun(t *testing.T) {
	store := demo.NewStore()
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "ab.run.>")
	st := srv.StartStack(t, actionbustest.StackOptions{ApprovalKeys: "k1:" + base64.StdEncoding.EncodeToString(key),
		Register: func(ex *executor.Executor) error { return demo.Register(ex, demo.Options{Store: store}) }})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run := func(hash map[string]any) *client.Result {
		wf := client.NewWorkflow("retry").
			Step("dry", "delivery.dryRunRetry", map[string]any{"jobIds": []any{"job_1041", "job_1042"}}).
			Step("retry", "delivery.executeRetry", map[string]any{"jobIds": []any{"job_1041", "job_1042"}, "dryRunHash": hash}).Build()
		id, err := st.Client.Start(ctx, client.RunRequest{AllowedModes: []string{"read", "dryRun", "mutate"}, Workflow: wf})
		require.NoError(t, err)
		var s events.RunStep
		rec.WaitFor(t, 20*time.Second, func(r actionbustest.Recorded) bool {
			return events.IsRunStep(r.Type()) && events.DataAs(r.Event, &s) == nil && s.RunID == id && s.Name == "awaiting-approval"
		})
		require.NoError(t, st.Client.Approve(ctx, s.Details["approvalId"].(string), "k1", key))
		res, err := st.Client.Wait(ctx, id)
		require.NoError(t, err)
		return res
	}
	res := run(map[string]any{"$fromStep": "dry", "path": "/dryRunHash"})
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	out := res.Output.(map[string]any)["outputByStep"].(map[string]any)["retry"].(map[string]any)
	assert.Equal(t, []any{"job_1041"}, out["retried"])
	j, _ := store.Job("job_1041")
	assert.Equal(t, "RETRY_QUEUED", j.Status)
	assert.Equal(t, 2, j.Attempts)

	// A dryRunHash that is not the approved dry run's is refused at the
	// mutation point.
	wrong := strings.Repeat("0", 64)
	wf := client.NewWorkflow("retry").
		Step("dry", "delivery.dryRunRetry", map[string]any{"jobIds": []any{"job_1043"}}).
		Step("retry", "delivery.executeRetry", map[string]any{"jobIds": []any{"job_1043"}, "dryRunHash": wrong}).Build()
	id, err := st.Client.Start(ctx, client.RunRequest{AllowedModes: []string{"read", "dryRun", "mutate"}, Workflow: wf})
	require.NoError(t, err)
	var s events.RunStep
	rec.WaitFor(t, 20*time.Second, func(r actionbustest.Recorded) bool {
		return events.IsRunStep(r.Type()) && events.DataAs(r.Event, &s) == nil && s.RunID == id && s.Name == "awaiting-approval"
	})
	require.NoError(t, st.Client.Approve(ctx, s.Details["approvalId"].(string), "k1", key))
	res, err = st.Client.Wait(ctx, id)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	// A failed workflow step fails the run with workflow_execution; the
	// step's own error is the handler's approval_invalid.
	assert.Equal(t, "workflow_execution", string(res.Error.Code))
	assert.Contains(t, res.Error.Message, "approval_invalid")
	assert.Contains(t, res.Error.Message, "not bound to the dry run")
	j, _ = store.Job("job_1043")
	assert.Equal(t, "FAILED", j.Status, "nothing changed")
}

// A model dry-runs one job, then asks to retry three naming that dry
// run's hash: the approval context says the input to approve was not
// dry-run (dryRunMatches false, no dryRunHash), and the handler's re-check
// at the mutation point refuses even an approved call. The same retry of
// exactly the dry-run jobs names the dry run and runs.
func TestADryRunHashIsBoundToTheDryRunOfTheSameInput(t *testing.T) {
	store := demo.NewStore()
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "ab.run.>")
	st := srv.StartStack(t, actionbustest.StackOptions{ApprovalKeys: "k1:" + base64.StdEncoding.EncodeToString(key),
		Register: func(ex *executor.Executor) error { return demo.Register(ex, demo.Options{Store: store}) },
		Scenarios: `
scenarios:
  widen:
    decisions:
      - {type: action, name: delivery.dryRunRetry, args: {jobIds: [job_1043]}}
      - type: action
        name: delivery.executeRetry
        args: {jobIds: [job_1041, job_1043], dryRunHash: '{{ index .Results "delivery.dryRunRetry" "dryRunHash" }}'}
      - {type: final, answer: '{{ range .Last }}{{ if .Error }}{{ .Error.Code }}{{ else }}retried{{ end }}{{ end }}'}
  exact:
    decisions:
      - {type: action, name: delivery.dryRunRetry, args: {jobIds: [job_1041, job_1043]}}
      - type: action
        name: delivery.executeRetry
        args: {jobIds: [job_1041, job_1043], dryRunHash: '{{ index .Results "delivery.dryRunRetry" "dryRunHash" }}'}
      - {type: final, answer: '{{ range .Last }}{{ if .Error }}{{ .Error.Code }}{{ else }}retried{{ end }}{{ end }}'}
`})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run := func(scenario string) (events.ApprovalContext, *client.Result) {
		id, err := st.Client.Start(ctx, client.RunRequest{Scenario: scenario, Prompt: "retry", AllowedModes: []string{"read", "dryRun", "mutate"}})
		require.NoError(t, err)
		var req events.ApprovalRequested
		require.NoError(t, events.DataAs(rec.WaitForType(t, 20*time.Second, events.TypeApprovalRequested, id).Event, &req))
		require.NoError(t, st.Client.Approve(ctx, req.Context.ApprovalID, "k1", key))
		res, err := st.Client.Wait(ctx, id)
		require.NoError(t, err)
		require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
		return req.Context, res
	}

	widened, res := run("widen")
	assert.False(t, widened.DryRunMatches)
	assert.Empty(t, widened.DryRunHash, "the approver is not shown a dry run of other input")
	assert.Empty(t, widened.DryRunAction)
	assert.Equal(t, "approval_invalid", res.Answer, "refused at the mutation point")
	for _, id := range []string{"job_1041", "job_1043"} {
		j, _ := store.Job(id)
		assert.Equal(t, "FAILED", j.Status, "%s: nothing changed", id)
	}

	exact, res := run("exact")
	assert.True(t, exact.DryRunMatches)
	assert.Equal(t, "delivery.dryRunRetry", exact.DryRunAction)
	assert.Len(t, exact.DryRunHash, 64)
	assert.Equal(t, "retried", res.Answer)
	j, _ := store.Job("job_1041")
	assert.Equal(t, "RETRY_QUEUED", j.Status)
}

// The demo's scenarios run again on the state the demo leaves: after the
// retry of two of the three failed jobs, the search returns one, and the
// plans read that one (a forEach over the search), never an index past it.
func TestTheDemoScenariosRunAgainOnTheStateTheDemoLeaves(t *testing.T) {
	scenarios, err := os.ReadFile("scenarios/delivery.yaml")
	require.NoError(t, err)
	store := demo.NewStore()
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "ab.run.>")
	st := srv.StartStack(t, actionbustest.StackOptions{ApprovalKeys: "k1:" + base64.StdEncoding.EncodeToString(key), Scenarios: string(scenarios),
		Register: func(ex *executor.Executor) error { return demo.Register(ex, demo.Options{Store: store}) }})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run := func(scenario string, approve bool) *client.Result {
		t.Helper()
		id, err := st.Client.Start(ctx, client.RunRequest{Scenario: scenario, Prompt: "Which failed jobs can we retry?", AllowedModes: []string{"read", "draft", "dryRun", "mutate"}})
		require.NoError(t, err)
		if approve {
			var s events.RunStep
			rec.WaitFor(t, 20*time.Second, func(r actionbustest.Recorded) bool {
				return events.IsRunStep(r.Type()) && events.DataAs(r.Event, &s) == nil && s.RunID == id && s.Name == "awaiting-approval"
			})
			require.NoError(t, st.Client.Approve(ctx, s.Details["approvalId"].(string), "k1", key))
		}
		res, err := st.Client.Wait(ctx, id)
		require.NoError(t, err)
		require.Equal(t, client.StatusCompleted, res.Status, "%s: %+v", scenario, res.Error)
		return res
	}
	res := run("delivery-retry", true) // what the demo runs
	assert.Contains(t, res.Answer, "3 delivery jobs failed. Retried after approval: job_1041, job_1043; blocked: job_1042.")
	res = run("delivery-triage", false)
	assert.Contains(t, res.Answer, "1 delivery jobs failed.")
	assert.Contains(t, res.Answer, "Retryable now: none; blocked: job_1042.")
	res = run("delivery-retry", true)
	assert.Contains(t, res.Answer, "1 delivery jobs failed. Retried after approval: none; blocked: job_1042.")
}

// A scenario whose template indexes past what the search returned fails
// its run with scenario_failed, naming the scenario, the field and its
// line, never with reflect's panic text.
func TestAScenarioTemplatePastTheSearchFailsTheRunWithScenarioFailed(t *testing.T) {
	const scenarios = `scenarios:
  past:
    decisions:
      - {type: action, name: delivery.searchJobs, args: {status: [RETRY_QUEUED]}}
      - {type: action, name: delivery.getJob, args: {jobId: '{{ index (index .Results "delivery.searchJobs" "jobIds") 5 }}'}}
`
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Scenarios: scenarios,
		Register: func(ex *executor.Executor) error { return demo.Register(ex, demo.Options{Store: demo.NewStore()}) }})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "past", Prompt: "p"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	require.NotNil(t, res.Error)
	assert.Equal(t, "scenario_failed", string(res.Error.Code))
	assert.Contains(t, res.Error.Message, `scenario "past" cycle 2, decisions[1].args.jobId (line 5)`)
	assert.Contains(t, res.Error.Message, "index 5 out of range: the list has 0 item(s)")
	assert.NotContains(t, res.Error.Message, "reflect")
}
