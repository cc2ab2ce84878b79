package run

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus/events"
)

func TestSummariesSayWhatARunWaitsFor(t *testing.T) {
	for _, tc := range []struct {
		name    string
		drive   func(h *harness)
		status  Status
		waiting string
	}{
		{"the planner", func(h *harness) {}, StatusRunning, "planner (cycle 1)"},
		{"actions", func(h *harness) { h.decide(plan(action("t.read", nil), action("t.other", nil))) }, StatusRunning, "2 action(s)"},
		{"input", func(h *harness) { h.decide(events.Decision{Type: events.DecisionClarify, Question: "which?"}) }, StatusAwaitingInput, "input"},
		{"an approval", func(h *harness) { h.decide(action("t.mutate", nil)) }, StatusAwaitingApproval, "approval " + testRunID + "-1-0"},
		{"nothing once ended", func(h *harness) { h.decide(events.Decision{Type: events.DecisionFinal, Answer: "ok"}) }, StatusCompleted, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, events.RunLimits{}).start(events.RunRequested{Prompt: "p", AllowedModes: allModes, UserID: "u1"})
			tc.drive(h)
			s := Summarize(h.st, h.env.Now().Add(90*time.Second))
			assert.Equal(t, tc.status, s.Status)
			assert.Equal(t, tc.waiting, s.Waiting)
			assert.Equal(t, 90*time.Second, s.Age)
			assert.Equal(t, KindAgent, s.Kind)
		})
	}
}

func TestAWorkflowWaitingForARetrySaysWhichStep(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).workflow(`{"workflowName": "w", "steps": [{"id": "a", "action": "t.read", "input": {}, "retry": {"maxAttempts": 2, "delayMs": 1000}}]}`)
	h.failCall(h.dispatched()[0].CallID, "upstream_down")
	assert.Equal(t, "retry of step a (attempt 2)", Summarize(h.st, h.env.Now()).Waiting)
}

func TestFilter(t *testing.T) {
	s := Summary{Kind: KindExec, Status: StatusFailed, UserID: "u1", Age: time.Minute}
	for _, tc := range []struct {
		f    Filter
		want bool
	}{
		{Filter{}, true},
		{Filter{Statuses: []Status{StatusFailed, StatusCanceled}}, true},
		{Filter{Statuses: []Status{StatusRunning}}, false},
		{Filter{Kinds: []Kind{KindExec}}, true},
		{Filter{Kinds: []Kind{KindAgent}}, false},
		{Filter{UserID: "u2"}, false},
		{Filter{MaxAge: time.Hour}, true},
		{Filter{MaxAge: time.Second}, false},
	} {
		assert.Equal(t, tc.want, tc.f.Match(s), "%+v", tc.f)
	}
}
