package dispatch_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/run"
)

type lookupIn struct {
	DocumentNo string `json:"document_no" jsonschema_extras:"x-aliases=documentNo"`
	Limit      int    `json:"limit,omitempty"`
	Tenant     string `json:"tenant,omitempty"`
}

// lookupActions registers docs.lookup and records the input it receives.
func lookupActions(seen *[]lookupIn, mu *sync.Mutex) func(*executor.Executor) error {
	return func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "docs.lookup", Description: "Look a document up.", HostOnlyKeys: []string{"tenant"}},
			func(_ context.Context, in lookupIn, _ executor.Call) (executor.Result[lookupIn], error) {
				mu.Lock()
				*seen = append(*seen, in)
				mu.Unlock()
				return executor.Result[lookupIn]{Output: in, Summary: "found " + in.DocumentNo}, nil
			})
	}
}

const argsScenarios = `
scenarios:
  extra-keys:
    decisions:
      - {type: action, name: docs.lookup, args: {documentNo: D-1, tenant: evil, color: red}}
      - {type: final, answer: done}
  self-correct:
    decisions:
      - {type: action, name: docs.lookup, args: {document_no: D-2, limit: "ten"}}
      - {type: action, name: docs.lookup, args: {document_no: D-2, limit: 10}}
      - {type: final, answer: '{{ index .Results "docs.lookup" "limit" }}'}
  plan-invalid:
    decisions:
      - type: plan
        actions:
          - {type: action, name: docs.lookup, args: {document_no: D-3}}
          - {type: action, name: docs.lookup, args: {limit: 1}}
      - {type: final, answer: corrected}
`

func TestModelInputIsStrippedAndTheDiagnosticRecorded(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "")
	var mu sync.Mutex
	var seen []lookupIn
	st := srv.StartStack(t, actionbustest.StackOptions{Scenarios: argsScenarios, Register: lookupActions(&seen, &mu)})
	ctx := ctxT(t)
	res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "extra-keys"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	mu.Lock()
	assert.Equal(t, []lookupIn{{DocumentNo: "D-1"}}, seen, "the alias was rewritten; undeclared and host-only keys never reached the handler")
	mu.Unlock()

	diag := rec.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
		var s events.RunStep
		return events.IsRunStep(r.Type()) && events.DataAs(r.Event, &s) == nil && s.Name == "action.input.unexpected_keys_stripped"
	})
	var s events.RunStep
	require.NoError(t, events.DataAs(diag.Event, &s))
	assert.Equal(t, []any{"/color"}, s.Details["keys"])
	assert.Equal(t, []any{"/tenant"}, s.Details["hostOnlyKeys"])
	rec.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
		var s events.RunStep
		return events.IsRunStep(r.Type()) && events.DataAs(r.Event, &s) == nil && s.Name == "action-args-alias-rewrite"
	})

	// The diagnostic is part of the run's stored state too.
	kv, err := srv.JS.KeyValue(ctx, "ab_runs")
	require.NoError(t, err)
	entry, err := kv.Get(ctx, res.RunID)
	require.NoError(t, err)
	var state run.State
	require.NoError(t, json.Unmarshal(entry.Value(), &state))
	names := []string{}
	for _, d := range state.Diagnostics {
		names = append(names, d.Name)
	}
	assert.Equal(t, []string{"action-args-alias-rewrite", "action.input.unexpected_keys_stripped"}, names)
}

func TestInvalidArgsGoBackToThePlannerWhichCorrectsThem(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "")
	var mu sync.Mutex
	var seen []lookupIn
	st := srv.StartStack(t, actionbustest.StackOptions{Scenarios: argsScenarios, Register: lookupActions(&seen, &mu)})
	ctx := ctxT(t)
	res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "self-correct"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, "10", res.Answer)
	mu.Lock()
	assert.Equal(t, []lookupIn{{DocumentNo: "D-2", Limit: 10}}, seen, "the invalid call never ran")
	mu.Unlock()

	r := rec.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
		var d events.DecisionRequested
		return r.Type() == events.TypeDecisionRequested && events.DataAs(r.Event, &d) == nil && d.RunID == res.RunID && d.Cycle == 2
	})
	var req events.DecisionRequested
	require.NoError(t, events.DataAs(r.Event, &req))
	require.NotNil(t, req.Feedback)
	assert.ErrorIs(t, req.Feedback, actionbus.ErrArgsInvalid)
	require.Len(t, req.Observations, 1)
	obs := req.Observations[0]
	assert.False(t, obs.OK)
	issues := obs.Error.Details["issues"].([]any)
	require.Len(t, issues, 1)
	assert.Equal(t, map[string]any{"actionName": "docs.lookup", "key": "/limit", "reason": "type", "error": issues[0].(map[string]any)["error"]}, issues[0])
	// Seed 000: the details themselves are {actionName, key, reason, error}.
	d := obs.Error.Details
	assert.Equal(t, []any{"docs.lookup", "/limit", "type", issues[0].(map[string]any)["error"]}, []any{d["actionName"], d["key"], d["reason"], d["error"]})
	assert.NotContains(t, d, "planIndex", "a single action has no plan index")
}

func TestInvalidPlanActionHoldsBackTheWholePlan(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "")
	var mu sync.Mutex
	var seen []lookupIn
	st := srv.StartStack(t, actionbustest.StackOptions{Scenarios: argsScenarios, Register: lookupActions(&seen, &mu)})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Scenario: "plan-invalid"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	mu.Lock()
	assert.Empty(t, seen, "no action of the plan ran")
	mu.Unlock()
	r := rec.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
		var d events.DecisionRequested
		return r.Type() == events.TypeDecisionRequested && events.DataAs(r.Event, &d) == nil && d.RunID == res.RunID && d.Cycle == 2
	})
	var req events.DecisionRequested
	require.NoError(t, events.DataAs(r.Event, &req))
	require.Len(t, req.Observations, 1)
	require.NotNil(t, req.Observations[0].PlanIndex)
	assert.Equal(t, 1, *req.Observations[0].PlanIndex)
	issue := req.Observations[0].Error.Details["issues"].([]any)[0].(map[string]any)
	assert.Equal(t, "/document_no", issue["key"])
	assert.Equal(t, "missing", issue["reason"])
	assert.Equal(t, 1.0, issue["planIndex"])
	// The same flat details as the single-action path, plus planIndex.
	d := req.Observations[0].Error.Details
	assert.Equal(t, []any{"docs.lookup", "/document_no", "missing", 1.0}, []any{d["actionName"], d["key"], d["reason"], d["planIndex"]})
	assert.NotEmpty(t, d["error"])
	rec.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
		var s events.RunStep
		return events.IsRunStep(r.Type()) && events.DataAs(r.Event, &s) == nil && s.Name == "plan-validation-failed"
	})
}

func TestExecKeepsHostOnlyKeys(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	var mu sync.Mutex
	var seen []lookupIn
	st := srv.StartStack(t, actionbustest.StackOptions{Register: lookupActions(&seen, &mu)})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Action: &client.ActionCall{Name: "docs.lookup",
		Args: map[string]any{"document_no": "D-9", "tenant": "acme"}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	mu.Lock()
	assert.Equal(t, []lookupIn{{DocumentNo: "D-9", Tenant: "acme"}}, seen)
	mu.Unlock()
}
