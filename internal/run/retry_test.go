package run

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/events"
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
	h := newHarness(t, Limits{MaxPlanParallel: 1})
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
	st, out, err := h.m.Start(context.Background(), &events.RunRequested{RunID: retryRunID, Workflow: wf, UserID: "u1", RetryOf: testRunID}, "k2")
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
			st, out, err := h.m.Start(context.Background(), &events.RunRequested{RunID: retryRunID, Workflow: wf, UserID: tc.user, RetryOf: testRunID}, "k2")
			require.NoError(t, err)
			require.True(t, st.IsTerminal())
			assert.Equal(t, actionbus.CodeRetryRefused, st.Terminal.Error.Code)
			assert.False(t, has(out, EffectAct), "nothing runs")
		})
	}
}
