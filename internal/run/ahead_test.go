package run

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
)

// resultOf is the result an executor sends for call c: with where the
// call was made, as the executor copies it from the work item.
func resultOf(c CallState, cycle int) *events.ActionCompleted {
	return &events.ActionCompleted{RunID: testRunID, CallID: c.CallID, Cycle: cycle, PlanIndex: c.PlanIndex, Attempt: c.Attempt,
		Output: map[string]any{"name": c.StepID}, Executor: "x1"}
}

// applyAhead applies data to h's run and reports whether it was ahead;
// an event ahead must leave the state as it was.
func applyAhead(t *testing.T, h *harness, data any) bool {
	t.Helper()
	before, err := json.Marshal(h.st)
	require.NoError(t, err)
	out, err := h.m.Apply(context.Background(), h.st, Event{ID: "ahead", Data: data})
	if err == nil {
		h.record(h.settle(out))
		return false
	}
	require.ErrorIs(t, err, ErrAhead)
	after, err := json.Marshal(h.st)
	require.NoError(t, err)
	assert.JSONEq(t, string(before), string(after), "an event ahead changes nothing")
	return true
}

// A dispatcher that handed out a chain's steps without writing its state,
// and died, leaves their results to come again in any order: the second
// step's result, before the first's, is ahead (handed back), not stale
// (dropped — its step would never be asked again); after the first's, it
// counts. A result the run could not have asked for is stale either way.
func TestAResultOfAStepNotReachedYetIsAheadNotStale(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).workflow(`{"workflowName": "w", "steps": [
		{"id": "a", "action": "t.read", "input": {}},
		{"id": "b", "action": "t.query", "input": {"q": {"$fromStep": "a", "path": "/name"}}}]}`)
	first := h.dispatched()
	require.Len(t, first, 1)
	// What the run would make once a is done: b's call, as its executor
	// returns it.
	replay := newHarness(t, events.RunLimits{}).workflow(`{"workflowName": "w", "steps": [
		{"id": "a", "action": "t.read", "input": {}},
		{"id": "b", "action": "t.query", "input": {"q": {"$fromStep": "a", "path": "/name"}}}]}`)
	replay.apply(resultOf(replay.dispatched()[0], replay.st.Cycle))
	second := replay.dispatched()
	require.Len(t, second, 1)

	assert.True(t, applyAhead(t, h, resultOf(second[0], h.st.Cycle)), "b's result before a's")
	forged := resultOf(second[0], h.st.Cycle)
	forged.CallID = "not-derived"
	assert.False(t, applyAhead(t, h, forged), "a call id the run does not derive is stale")
	assert.False(t, applyAhead(t, h, resultOf(first[0], h.st.Cycle)), "a's result")
	require.Len(t, h.dispatched(), 1, "b is handed out")
	assert.False(t, applyAhead(t, h, resultOf(second[0], h.st.Cycle)), "b's result, again")
	assert.Equal(t, StatusCompleted, h.st.Status)
	assert.False(t, applyAhead(t, h, resultOf(second[0], h.st.Cycle)), "a duplicate of an ended run's result is stale")
}

// In an agent run, a plan's call beyond its parallelism is ahead until
// a place frees; the next cycle's decision is ahead of the result that
// asks for it.
func TestAPlansWaitingCallAndTheNextDecisionAreAhead(t *testing.T) {
	h := newHarness(t, events.RunLimits{MaxPlanParallel: 1}).agent()
	h.decide(plan(action("t.read", map[string]any{"n": 0}), action("t.other", nil)))
	out := h.dispatched()
	require.Len(t, out, 1)
	waiting := h.st.Calls[1]
	require.False(t, waiting.Dispatched)
	assert.True(t, applyAhead(t, h, resultOf(waiting, h.st.Cycle)), "the waiting call's result")
	assert.True(t, applyAhead(t, h, &events.DecisionMade{RunID: testRunID, Cycle: h.st.Cycle + 1,
		Decision: events.Decision{Type: events.DecisionFinal, Answer: "done"}}), "the next cycle's decision")
	assert.False(t, applyAhead(t, h, resultOf(out[0], h.st.Cycle)))
	assert.False(t, applyAhead(t, h, resultOf(waiting, h.st.Cycle)))
	assert.Equal(t, 2, h.st.Cycle, "both results in: the planner is asked again")
	failed := &events.ActionFailed{RunID: testRunID, CallID: waiting.CallID, Cycle: 1, PlanIndex: 1, Error: actionbus.Error{Code: "x", Message: "late"}}
	assert.False(t, applyAhead(t, h, failed), "a result of an earlier cycle is stale")
}
