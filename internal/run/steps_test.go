package run

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/events"
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
			// What an admission hands out while its state is written is
			// what goes out first, and the rest follows in the same order.
			work, rest := LeadingWork(tc.in)
			assert.Equal(t, tc.want, append(ids(work), ids(rest)...))
			for _, e := range work {
				assert.True(t, e.handsOutWork(), e.ID)
			}
			if len(rest) > 0 {
				assert.False(t, rest[0].handsOutWork(), "work after the leading work waits for a stored event before it")
			}
		})
	}
	// A recorded step before the work keeps it out of the leading work.
	work, _ := LeadingWork([]Effect{recorded("policy"), act("a1")})
	assert.Empty(t, work)
	work, rest := LeadingWork([]Effect{started, live("observe"), act("a1"), act("a2"), timer})
	assert.Equal(t, []string{"a1", "a2"}, ids(work))
	assert.Equal(t, []string{"started", "observe", "alarm"}, ids(rest))
	assert.Equal(t, ids(rest), ids(WorkFirst(rest)), "the rest is already in the order it is published")
}

func TestProgressFoldsATransitionsLiveStepsIntoOneEventInOrder(t *testing.T) {
	st := &State{RunID: "01J0000000000000000000000R", Tenant: "default", IDKey: "k"}
	live := func(id string) Effect {
		return Effect{Kind: EffectStep, ID: id, Step: &events.RunStep{RunID: st.RunID, Name: id}}
	}
	allowed := Effect{Kind: EffectStep, ID: "policy-allowed", Progress: true, Step: &events.RunStep{RunID: st.RunID, Name: string(StepPolicyEvaluated)}}
	recorded := Effect{Kind: EffectStep, ID: "policy", Step: &events.RunStep{RunID: st.RunID, Name: string(StepPolicyEvaluated)}}
	link := Effect{Kind: EffectStep, ID: "link", RunID: "01J0000000000000000000000P", Step: &events.RunStep{Name: string(StepAct)}}
	act := Effect{Kind: EffectAct, ID: "a1"}
	end := Effect{Kind: EffectEnd, ID: "end"}
	// shape names each effect: its id, or the steps of a progress event.
	shape := func(effects []Effect) []string {
		out := []string{}
		for _, e := range effects {
			if e.Kind != EffectProgress {
				out = append(out, e.ID)
				continue
			}
			names := []string{}
			for _, s := range e.Steps {
				names = append(names, s.Name)
			}
			out = append(out, "progress("+strings.Join(names, ",")+")")
		}
		return out
	}
	for _, tc := range []struct {
		name string
		in   []Effect
		want []string
	}{
		{"a one-action admission: every live step in one event, after the work item", []Effect{act, live("observe"), live("orient"), live("decide"), live("act"), live("action-dispatched")},
			[]string{"a1", "progress(observe,orient,decide,act,action-dispatched)"}},
		{"the progress stays ahead of the run's end", []Effect{live("action-completed"), live("evaluate"), end},
			[]string{"progress(action-completed,evaluate)", "end"}},
		{"an allowed call's policy evaluation is progress", []Effect{allowed, live("action-dispatched"), act},
			[]string{"progress(policy-evaluated,action-dispatched)", "a1"}},
		{"a recorded step between live ones goes ahead of them", []Effect{live("observe"), recorded, act, live("action-dispatched")},
			[]string{"policy", "a1", "progress(observe,action-dispatched)"}},
		{"a step for another run is not folded", []Effect{live("observe"), link, live("act")},
			[]string{"link", "progress(observe,act)"}},
		{"one live step stays a step", []Effect{live("observe"), end}, []string{"observe", "end"}},
		{"none", nil, []string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, shape(Progress(st, tc.in)))
		})
	}
}

func TestProgressEventIDIsDerivedFromItsSteps(t *testing.T) {
	st := &State{RunID: "01J0000000000000000000000R", Tenant: "default", IDKey: "k"}
	two := func(a, b string) []Effect {
		return []Effect{{Kind: EffectStep, ID: a, Step: &events.RunStep{Name: "observe"}}, {Kind: EffectStep, ID: b, Step: &events.RunStep{Name: "act"}}}
	}
	first := Progress(st, two("s1", "s2"))
	require.Len(t, first, 1)
	assert.Equal(t, first[0].ID, Progress(st, two("s1", "s2"))[0].ID, "the same effects (an outbox published again) make the same id")
	assert.NotEqual(t, first[0].ID, Progress(st, two("s1", "s3"))[0].ID, "other steps, another id")
	assert.NotContains(t, []string{"s1", "s2"}, first[0].ID, "not a step's own id")
}

func TestRenderedProgressCarriesItsStepsAsVersion2(t *testing.T) {
	st := &State{RunID: "01J0000000000000000000000R", Tenant: "default", IDKey: "k"}
	folded := Progress(st, []Effect{step(st, StepObserve, nil, "", "", ""), step(st, StepAct, nil, "", "1 call", "")})
	require.Len(t, folded, 1)
	em, ok := Render(st, folded[0])
	require.True(t, ok)
	assert.Equal(t, events.TypeRunProgress, em.Type)
	assert.Equal(t, &events.RunProgress{Version: 2, RunID: st.RunID, Steps: []events.RunStep{
		{RunID: st.RunID, Name: string(StepObserve)}, {RunID: st.RunID, Name: string(StepAct), Message: "1 call"}}}, em.Data)
	// A single live step is a progress event of one step.
	em, ok = Render(st, step(st, StepFinal, nil, "", "", ""))
	require.True(t, ok)
	assert.Equal(t, &events.RunProgress{Version: 2, RunID: st.RunID, Steps: []events.RunStep{{RunID: st.RunID, Name: string(StepFinal)}}}, em.Data)
}
