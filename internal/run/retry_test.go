package run

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/policy"
)

const fourSteps = `{"workflowName": "w", "steps": [
	{"id": "a", "action": "t.read", "input": {}},
	{"id": "b", "action": "t.other", "input": {}},
	{"id": "c", "action": "t.query", "input": {"q": "x"}},
	{"id": "d", "action": "t.read", "input": {"x": {"$fromStep": "a", "path": "/v"}}}]}`

const retryRunID = "01JB0000000000000000000002"

// failedRun runs the four-step workflow, one step at a time, until step c
// fails (a and b done, d not yet run) and stores it as a prior run of
// h.env.
func failedRun(t *testing.T, user string) (*harness, map[string]any) {
	var wf map[string]any
	require.NoError(t, json.Unmarshal([]byte(fourSteps), &wf))
	h := newHarness(t, events.RunLimits{MaxPlanParallel: 1})
	h.start(events.RunRequested{Workflow: wf, UserID: user})
	for !h.st.IsTerminal() {
		calls := h.dispatched()
		require.Len(t, calls, 1)
		if calls[0].StepID == "c" {
			h.failCall(calls[0].CallID, "upstream_down")
			continue
		}
		h.succeed(calls[0].CallID, map[string]any{"v": "from " + calls[0].StepID})
	}
	require.Equal(t, StatusFailed, h.st.Status)
	h.env.runs[testRunID] = h.st
	return h, wf
}

// TestARetryReusesTheCompletedStepsAndResumesAtTheFailedOne: only the
// failed step runs again; the others' outputs are reused.
func TestARetryReusesTheCompletedStepsAndResumesAtTheFailedOne(t *testing.T) {
	h, wf := failedRun(t, "u1")
	st, out, err := h.admit(&events.RunRequested{RunID: retryRunID, Workflow: wf, UserID: "u1", RetryOf: testRunID}, "k2")
	require.NoError(t, err)
	assert.Equal(t, testRunID, out[0].Data.(*events.RunStarted).RetryOf, "run.started names the retried run")
	var reused, dispatched []string
	for _, e := range out {
		if e.Kind == EffectStep && e.Step.Name == string(StepWorkflowStepReused) {
			reused = append(reused, e.Step.Details["step"].(string))
		}
		if e.Kind == EffectAct {
			dispatched = append(dispatched, st.Calls[st.callIndex(e.CallID)].StepID)
		}
	}
	assert.Equal(t, []string{"a", "b"}, reused)
	assert.Equal(t, []string{"c"}, dispatched, "the failed step runs again (one at a time)")
	h.st = st
	h.succeed(st.Calls[2].CallID, map[string]any{"v": "c again"})
	d := h.dispatched()
	require.Len(t, d, 1)
	assert.Equal(t, "d", d[0].StepID)
	assert.Equal(t, map[string]any{"x": "from a"}, d[0].Args, "a reused output feeds a later step")
	h.succeed(d[0].CallID, map[string]any{"v": "d"})
	require.Equal(t, StatusCompleted, h.st.Status)
	byStep := h.st.Terminal.Output.(map[string]any)["outputByStep"].(map[string]any)
	assert.Equal(t, map[string]any{"v": "from a"}, byStep["a"])
	assert.Equal(t, map[string]any{"v": "c again"}, byStep["c"])
}

func TestARetryIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		user  string
		prior func(h *harness)
		doc   string
	}{
		{"for another user", "u2", nil, fourSteps},
		{"for a run that does not exist", "u1", func(h *harness) { delete(h.env.runs, testRunID) }, fourSteps},
		{"for a run that completed", "u1", func(h *harness) { h.env.runs[testRunID].Status = StatusCompleted }, fourSteps},
		{"for another definition", "u1", nil, `{"workflowName": "w2", "steps": [{"id": "a", "action": "t.read", "input": {}}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := failedRun(t, "u1")
			if tc.prior != nil {
				tc.prior(h)
			}
			var wf map[string]any
			require.NoError(t, json.Unmarshal([]byte(tc.doc), &wf))
			st, out, err := h.admit(&events.RunRequested{RunID: retryRunID, Workflow: wf, UserID: tc.user, RetryOf: testRunID}, "k2")
			require.NoError(t, err)
			require.True(t, st.IsTerminal())
			assert.Equal(t, actionbus.CodeRetryRefused, st.Terminal.Error.Code)
			assert.False(t, has(out, EffectAct), "nothing runs")
		})
	}
}

// failedAgentRun runs an agent run whose first cycle succeeds and whose
// second cycle's action fails until the run gives up, and stores it.
func failedAgentRun(t *testing.T) *harness {
	h := newHarness(t, events.RunLimits{MaxFailedRounds: 1}).start(events.RunRequested{Prompt: "help", Scenario: "s", UserID: "u1"})
	h.decide(action("t.read", map[string]any{"i": 1}))
	h.succeed(h.dispatched()[0].CallID, map[string]any{"v": "first"})
	h.decide(action("t.other", map[string]any{}))
	h.failCall(h.dispatched()[0].CallID, "upstream_down")
	for !h.st.IsTerminal() {
		if h.st.Phase == PhaseDeciding {
			h.decide(action("t.other", map[string]any{}))
		} else {
			h.failCall(h.dispatched()[0].CallID, "upstream_down")
		}
	}
	require.Equal(t, StatusFailed, h.st.Status)
	h.env.runs[testRunID] = h.st
	return h
}

// TestARetriedAgentRunResumesAfterTheLastGoodCycle: the first cycle's
// result is kept (its action does not run again), the planner is asked
// for cycle 2, and the retried run gets a step naming its retry.
func TestARetriedAgentRunResumesAfterTheLastGoodCycle(t *testing.T) {
	h := failedAgentRun(t)
	st, out, err := h.admit(&events.RunRequested{RunID: retryRunID, Prompt: "help", Scenario: "s", UserID: "u1", RetryOf: testRunID}, "k2")
	require.NoError(t, err)
	require.False(t, st.IsTerminal())
	assert.Equal(t, 2, st.Cycle, "asks for cycle 2")
	require.Len(t, st.Agent.Observations, 1)
	assert.Equal(t, map[string]any{"v": "first"}, st.Agent.Observations[0].Output)
	assert.False(t, has(out, EffectAct), "cycle 1's action is not run again")
	assert.True(t, has(out, EffectDecide))
	assert.Contains(t, stepNames(out), string(StepRetryResumed))
	var link *Effect
	for i, e := range out {
		if e.Kind == EffectStep && e.Step.Name == string(StepRetried) {
			link = &out[i]
		}
	}
	require.NotNil(t, link, "the retried run is told who retries it")
	em, ok := Render(st, *link)
	require.True(t, ok)
	assert.Equal(t, testRunID, em.RunID, "published on the retried run's subject")
	assert.Equal(t, retryRunID, em.Data.(*events.RunStep).Details["retriedBy"])
}

func TestAnAgentRetryIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		req  events.RunRequested
		edit func(*State)
	}{
		{"with another prompt", events.RunRequested{Prompt: "other", Scenario: "s", UserID: "u1"}, nil},
		{"of another tenant's run", events.RunRequested{Prompt: "help", Scenario: "s", UserID: "u1"}, func(p *State) { p.Tenant = "acme" }},
		{"as another kind of run", events.RunRequested{Action: &events.ActionCall{Name: "t.read"}, UserID: "u1"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := failedAgentRun(t)
			if tc.edit != nil {
				tc.edit(h.env.runs[testRunID])
			}
			req := tc.req
			req.RunID, req.RetryOf = retryRunID, testRunID
			st, out, err := h.admit(&req, "k2")
			require.NoError(t, err)
			require.True(t, st.IsTerminal())
			assert.Equal(t, actionbus.CodeRetryRefused, st.Terminal.Error.Code)
			assert.False(t, has(out, EffectAct))
		})
	}
}

// A retry of another tenant's run is refused exactly as a retry of no run:
// whatever that run's status, the refusal tells nothing of it (run ids are
// not namespaced, so a status would tell a tenant that the id is a live
// or finished run of someone else).
func TestARetryOfAnotherTenantsRunIsRefusedAsAMissingOne(t *testing.T) {
	refusal := func(edit func(*State), retryOf string) string {
		h := failedAgentRun(t)
		if edit != nil {
			edit(h.env.runs[testRunID])
		}
		st, _, err := h.admit(&events.RunRequested{RunID: retryRunID, Prompt: "help", Scenario: "s", UserID: "u1", RetryOf: retryOf}, "k2")
		require.NoError(t, err)
		require.True(t, st.IsTerminal())
		return string(st.Terminal.Error.Code) + ": " + strings.ReplaceAll(st.Terminal.Error.Message, retryOf, "RUN")
	}
	missing := refusal(nil, events.NewID())
	for _, status := range []Status{StatusCompleted, StatusRunning, StatusFailed, StatusCanceled} {
		got := refusal(func(p *State) { p.Tenant, p.Status = "acme", status }, testRunID)
		assert.Equal(t, missing, got, "another tenant's %s run", status)
	}
}

// TestARunIsRetriedIntoOneRunOnly: once a retry has claimed the failed
// run, a second retry of it is refused, naming the first, and runs
// nothing; the first retry's admission computed again (a redelivered
// request) is still admitted.
func TestARunIsRetriedIntoOneRunOnly(t *testing.T) {
	const second = "01JB0000000000000000000003"
	for _, tc := range []struct {
		name   string
		failed func(t *testing.T) *harness
		req    func(wf map[string]any) events.RunRequested
	}{
		{"workflow", func(t *testing.T) *harness { h, _ := failedRun(t, "u1"); return h },
			func(wf map[string]any) events.RunRequested { return events.RunRequested{Workflow: wf, UserID: "u1"} }},
		{"agent", failedAgentRun,
			func(map[string]any) events.RunRequested {
				return events.RunRequested{Prompt: "help", Scenario: "s", UserID: "u1"}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.failed(t)
			var wf map[string]any
			require.NoError(t, json.Unmarshal([]byte(fourSteps), &wf))
			start := func(runID string) (*State, []Effect) {
				req := tc.req(wf)
				req.RunID, req.RetryOf = runID, testRunID
				st, out, err := h.admit(&req, "k-"+runID)
				require.NoError(t, err)
				return st, out
			}
			first, out := start(retryRunID)
			require.False(t, first.IsTerminal(), "%+v", first.Terminal)
			assert.Equal(t, testRunID, first.RetryOf)
			assert.Equal(t, retryRunID, h.env.runs[testRunID].RetriedBy, "the failed run's stored state names its retry")
			assert.Contains(t, stepNames(out), string(StepRetried))

			again, _ := start(retryRunID)
			assert.False(t, again.IsTerminal(), "the same retry admitted again is not refused")

			st, out := start(second)
			require.True(t, st.IsTerminal())
			assert.Equal(t, actionbus.CodeRetryRefused, st.Terminal.Error.Code)
			assert.Contains(t, st.Terminal.Error.Message, "already retried by run "+retryRunID)
			assert.Equal(t, retryRunID, st.Terminal.Error.Details["retriedBy"])
			assert.False(t, has(out, EffectAct), "nothing runs")
			assert.NotContains(t, stepNames(out), string(StepRetried), "the failed run is not told of a refused retry")
			assert.Equal(t, retryRunID, h.env.runs[testRunID].RetriedBy)

			// The refused retry holds nothing of the failed run, and
			// is not retried itself (from the start, it would repeat
			// what the first retry did).
			if st.Workflow != nil {
				for _, s := range st.Workflow.Steps {
					assert.NotEqual(t, StepStatusDone, s.Status, "a refused retry reuses no step")
				}
			}
			h.env.runs[second] = st
			req := tc.req(wf)
			req.RunID, req.RetryOf = "01JB0000000000000000000004", second
			third, out, err := h.admit(&req, "k-third")
			require.NoError(t, err)
			require.True(t, third.IsTerminal())
			assert.Equal(t, actionbus.CodeRetryRefused, third.Terminal.Error.Code)
			assert.Equal(t, retryRunID, third.Terminal.Error.Details["retriedBy"], "it names the retry to go on from")
			assert.False(t, has(out, EffectAct))
		})
	}
}

// A workflow retry that lost the claim (a concurrent retry got it between
// its read and its write) is refused by the claim, not by the read.
func TestAWorkflowRetryThatLosesTheClaimIsRefused(t *testing.T) {
	h, wf := failedRun(t, "u1")
	h.env.claimedFirst = "01JB0000000000000000000009"
	st, out, err := h.admit(&events.RunRequested{RunID: retryRunID, Workflow: wf, UserID: "u1", RetryOf: testRunID}, "k2")
	require.NoError(t, err)
	require.True(t, st.IsTerminal())
	assert.Equal(t, actionbus.CodeRetryRefused, st.Terminal.Error.Code)
	assert.Equal(t, "01JB0000000000000000000009", st.Terminal.Error.Details["retriedBy"])
	assert.False(t, has(out, EffectAct))
}

func TestRetriedAlready(t *testing.T) {
	for _, tc := range []struct {
		retriedBy string
		refused   bool
	}{{"", false}, {"R", false}, {"S", true}} {
		got := retriedAlready("P", "R", tc.retriedBy)
		assert.Equal(t, tc.refused, got != nil, "retriedBy %q", tc.retriedBy)
		if got != nil {
			assert.Equal(t, actionbus.CodeRetryRefused, got.Code)
			assert.Equal(t, map[string]any{"retryOf": "P", "retriedBy": "S"}, got.Details)
		}
	}
}

// failedExecRun runs a one-action run of t.read that fails, requested as
// req, and stores it as a prior run.
func failedExecRun(t *testing.T, req func(h *harness, runID string) events.RunRequested) *harness {
	h := newHarness(t, events.RunLimits{})
	h.start(req(h, testRunID))
	calls := h.dispatched()
	require.Len(t, calls, 1)
	h.failCall(calls[0].CallID, "upstream_down")
	require.Equal(t, StatusFailed, h.st.Status)
	h.env.runs[testRunID] = h.st
	return h
}

// viaGateway is a request of a one-action run of t.read that a gateway
// authenticated as alice.
func viaGateway(h *harness, runID string) events.RunRequested {
	claim := policy.PrincipalClaim{RunID: runID, Tenant: events.DefaultTenant, User: "alice", ExpiresAt: h.env.Now().Add(policy.PrincipalTTL)}
	token, err := policy.SignPrincipal("gw", testKey, claim)
	require.NoError(h.t, err)
	return events.RunRequested{RunID: runID, UserID: "alice", Action: &events.ActionCall{Name: "t.read", Args: map[string]any{}},
		Principal: &events.Principal{User: "alice", ExpiresAt: claim.ExpiresAt, Token: token}}
}

// TestARetryOfAGatewayUsersRunIsTheirsAlone: a tenant's NATS client that
// writes the user's id beside a retry of a run a gateway authenticated
// is refused, and claims nothing: the user's own retry, through the
// gateway, still runs.
func TestARetryOfAGatewayUsersRunIsTheirsAlone(t *testing.T) {
	h := failedExecRun(t, viaGateway)
	forged := events.RunRequested{RunID: retryRunID, UserID: "alice", RetryOf: testRunID, Action: &events.ActionCall{Name: "t.read", Args: map[string]any{}}}
	st, out, err := h.admit(&forged, "k2")
	require.NoError(t, err)
	require.True(t, st.IsTerminal())
	assert.Equal(t, actionbus.CodeRetryRefused, st.Terminal.Error.Code)
	assert.False(t, has(out, EffectAct), "nothing runs")
	assert.Empty(t, h.env.runs[testRunID].RetriedBy, "the refused retry claimed nothing")

	const ownRetry = "01JB0000000000000000000003"
	own := viaGateway(h, ownRetry)
	own.RetryOf = testRunID
	st, out, err = h.admit(&own, "k3")
	require.NoError(t, err)
	require.False(t, st.IsTerminal(), "%+v", st.Terminal)
	assert.True(t, has(out, EffectAct), "the user's own retry runs its action")
}

// TestAOneActionRetryRunsTheSameAction: a retry names the run it repeats;
// one that asks for another action, or the same with other arguments, is
// refused, so the chain of retries never records a different effect as
// the same one.
func TestAOneActionRetryRunsTheSameAction(t *testing.T) {
	plain := func(_ *harness, runID string) events.RunRequested {
		return events.RunRequested{RunID: runID, UserID: "u1", Action: &events.ActionCall{Name: "t.read", Args: map[string]any{}}}
	}
	for _, tc := range []struct {
		name    string
		action  string
		args    map[string]any
		refused bool
	}{
		{"another action", "t.query", map[string]any{}, true},
		{"other arguments", "t.read", map[string]any{"q": "x"}, true},
		{"the same call", "t.read", map[string]any{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := failedExecRun(t, plain)
			req := events.RunRequested{RunID: retryRunID, UserID: "u1", RetryOf: testRunID, Action: &events.ActionCall{Name: tc.action, Args: tc.args}}
			st, out, err := h.admit(&req, "k2")
			require.NoError(t, err)
			if !tc.refused {
				require.False(t, st.IsTerminal(), "%+v", st.Terminal)
				return
			}
			require.True(t, st.IsTerminal())
			assert.Equal(t, actionbus.CodeRetryRefused, st.Terminal.Error.Code)
			assert.Contains(t, st.Terminal.Error.Message, "a retry asks for the same action with the same arguments")
			assert.False(t, has(out, EffectAct), "nothing runs")
		})
	}
}
