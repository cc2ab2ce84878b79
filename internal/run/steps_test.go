package run

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus/internal/events"
)

func TestStepsRenderAsRecordedOrLiveProgress(t *testing.T) {
	st := &State{RunID: "01J0000000000000000000000R", Tenant: "default"}
	for _, tc := range []struct {
		step StepName
		want string
	}{
		{StepPolicyEvaluated, events.TypeRunStep},
		{StepAwaitingApproval, events.TypeRunStep},
		{StepApprovalRefused, events.TypeRunStep},
		{StepActionFailed, events.TypeRunStep},
		{StepActionArgsAliasRewrite, events.TypeRunStep},
		{StepWaitingForCapacity, events.TypeRunStep},
		{StepRetried, events.TypeRunStep},
		{StepAct, events.TypeRunProgress},
		{StepActionDispatched, events.TypeRunProgress},
		{StepActionCompleted, events.TypeRunProgress},
		{StepObserve, events.TypeRunProgress},
		{StepFinal, events.TypeRunProgress},
		{StepSynthesizeStitchDone, events.TypeRunProgress},
	} {
		t.Run(string(tc.step), func(t *testing.T) {
			em, ok := Render(st, step(st, tc.step, nil, "", "", ""))
			assert.True(t, ok)
			assert.Equal(t, tc.want, em.Type)
		})
	}
	// Every progress step is a known step.
	for name := range progressSteps {
		assert.Contains(t, StepNames, name)
	}
}

func TestWorkFirstStartsWorkAheadOfProgressAndKeepsStoredOrder(t *testing.T) {
	live := func(id string) Effect {
		return Effect{Kind: EffectStep, ID: id, Step: &events.RunStep{Name: string(StepActionDispatched)}}
	}
	recorded := func(id string) Effect {
		return Effect{Kind: EffectStep, ID: id, Step: &events.RunStep{Name: string(StepPolicyEvaluated)}}
	}
	started := Effect{Kind: EffectEvent, ID: "started", Type: events.TypeRunStarted}
	act := func(id string) Effect { return Effect{Kind: EffectAct, ID: id} }
	timer := Effect{Kind: EffectTimer, ID: "alarm", Timer: &Timer{Name: alarmName}}
	end := Effect{Kind: EffectEnd, ID: "end"}
	decide := Effect{Kind: EffectDecide, ID: "decide"}
	ids := func(effects []Effect) []string {
		out := make([]string, len(effects))
		for i, e := range effects {
			out[i] = e.ID
		}
		return out
	}
	for _, tc := range []struct {
		name string
		in   []Effect
		want []string
	}{
		{"an admission: the work item before the start, its progress and the alarm",
			[]Effect{started, live("observe"), live("dispatched"), timer, act("a1")},
			[]string{"a1", "started", "observe", "dispatched", "alarm"}},
		{"a plan: every work item before the progress between them",
			[]Effect{live("executing"), live("d1"), act("a1"), live("d2"), act("a2")},
			[]string{"a1", "a2", "executing", "d1", "d2"}},
		{"a decision request ahead of the progress",
			[]Effect{live("observe"), live("deciding"), decide},
			[]string{"decide", "observe", "deciding"}},
		{"a recorded step stays ahead of the work after it, its progress ahead of it",
			[]Effect{live("observe"), recorded("policy"), live("dispatched"), act("a1")},
			[]string{"observe", "policy", "a1", "dispatched"}},
		{"the progress before the run's end stays before it",
			[]Effect{live("completed"), live("evaluate"), end},
			[]string{"completed", "evaluate", "end"}},
		{"nothing to hand out: the order is kept",
			[]Effect{live("a"), recorded("b"), live("c")},
			[]string{"a", "b", "c"}},
		{"none", nil, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, ids(WorkFirst(tc.in)))
		})
	}
}
