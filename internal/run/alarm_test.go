package run

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
)

func TestArmKeepsOneScheduleForEveryTimer(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	timer := func(name string, in time.Duration) Effect {
		return Effect{Kind: EffectTimer, ID: "t-" + name, Timer: &Timer{Name: name, At: now.Add(in), Fired: events.TimerFired{Kind: events.TimerDecision}}}
	}
	step := Effect{Kind: EffectStep, ID: "s"}
	for _, tc := range []struct {
		name    string
		alarmAt time.Duration // the armed alarm, from now (0: none)
		pending map[string]time.Duration
		ended   bool
		out     []Effect
		// want: the alarm armed (0: none), the effects' kinds.
		wantAlarm time.Duration
		wantKinds []EffectKind
		wantNames []string // pending after
	}{
		{name: "no timer, no alarm", out: []Effect{step}, wantKinds: []EffectKind{EffectStep}},
		{name: "the first timer arms the alarm at it", out: []Effect{step, timer("run", 10*time.Minute), timer("calls", 30*time.Second)},
			wantAlarm: 30 * time.Second, wantKinds: []EffectKind{EffectStep, EffectTimer}, wantNames: []string{"calls", "run"}},
		{name: "a later timer needs no schedule", alarmAt: 30 * time.Second, pending: map[string]time.Duration{"run": 10 * time.Minute},
			out: []Effect{timer("decide", 2*time.Minute)}, wantNames: []string{"decide", "run"}},
		{name: "a sooner timer arms the alarm again", alarmAt: 2 * time.Minute, pending: map[string]time.Duration{"decide": 2 * time.Minute},
			out: []Effect{timer("calls", 30*time.Second)}, wantAlarm: 30 * time.Second, wantKinds: []EffectKind{EffectTimer}, wantNames: []string{"calls", "decide"}},
		{name: "a timer within the slack fires with the alarm", alarmAt: 30 * time.Second,
			out: []Effect{timer("calls", 29500*time.Millisecond)}, wantNames: []string{"calls"}},
		{name: "an alarm that came due has fired: armed again", alarmAt: -time.Second, pending: map[string]time.Duration{"run": 10 * time.Minute},
			out: []Effect{step}, wantAlarm: 10 * time.Minute, wantKinds: []EffectKind{EffectStep, EffectTimer}, wantNames: []string{"run"}},
		{name: "a timer of the same name replaces the pending one", alarmAt: time.Minute, pending: map[string]time.Duration{"decide": time.Minute},
			out: []Effect{timer("decide", 3*time.Minute)}, wantNames: []string{"decide"}},
		{name: "a run that ended keeps no timer", alarmAt: 30 * time.Second, pending: map[string]time.Duration{"run": 10 * time.Minute}, ended: true,
			out: []Effect{step, timer("calls", time.Second)}, wantKinds: []EffectKind{EffectStep}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &State{RunID: testRunID, IDKey: "k", Status: StatusRunning}
			if tc.alarmAt != 0 {
				st.AlarmAt = now.Add(tc.alarmAt)
			}
			for name, in := range tc.pending {
				if st.Timers == nil {
					st.Timers = map[string]Timer{}
				}
				st.Timers[name] = Timer{Name: name, At: now.Add(in)}
			}
			if tc.ended {
				st.Status, st.Terminal = StatusCompleted, &Terminal{Type: events.TypeRunCompleted}
			}
			before := st.AlarmAt
			out := Arm(st, tc.out, now)
			var kinds []EffectKind
			for _, e := range out {
				kinds = append(kinds, e.Kind)
				if e.Kind == EffectTimer {
					assert.Equal(t, alarmName, e.Timer.Name)
					assert.Equal(t, events.TimerAlarm, e.Timer.Fired.Kind)
					assert.Equal(t, st.AlarmAt, e.Timer.At)
				}
			}
			assert.Equal(t, tc.wantKinds, kinds)
			if tc.wantAlarm != 0 {
				assert.Equal(t, now.Add(tc.wantAlarm), st.AlarmAt)
			} else if !tc.ended {
				assert.Equal(t, before, st.AlarmAt, "the armed alarm stays")
			}
			var names []string
			for name := range st.Timers {
				names = append(names, name)
			}
			assert.ElementsMatch(t, tc.wantNames, names)
		})
	}
}

// An exec run stores one schedule: its call's deadline comes before the
// run's, and the alarm armed for it covers both.
func TestAnExecRunArmsOneAlarm(t *testing.T) {
	h := newHarness(t, events.RunLimits{})
	h.alarm = true
	h.start(events.RunRequested{Action: &events.ActionCall{Name: "t.read"}, AllowedModes: allModes})
	require.Len(t, h.alarms, 1, "one schedule at admission")
	assert.Equal(t, h.st.Timers["calls"].At, h.st.AlarmAt, "at the call's deadline")
	assert.Contains(t, h.st.Timers, "run")
	h.succeed(h.st.Calls[0].CallID, map[string]any{"v": 1.0})
	assert.True(t, h.st.IsTerminal())
	assert.Empty(t, h.st.Timers, "an ended run keeps no timers")
	assert.Len(t, h.alarms, 1, "nothing more was scheduled")
}

// The alarm fires the timers that are due, in time order, and is armed
// again for the rest: a silent call is sent once more, then stalls the run.
func TestTheAlarmFiresDueTimersAndArmsForTheRest(t *testing.T) {
	h := newHarness(t, events.RunLimits{})
	h.alarm = true
	h.agent()
	decideAt := h.st.Timers["decide"].At
	assert.Equal(t, decideAt, h.st.AlarmAt, "the planner's deadline comes first")
	h.decide(plan(action("t.read", nil), action("t.other", nil)))
	require.Len(t, h.dispatched(), 2)
	callsAt := h.st.Timers["calls"].At
	require.True(t, callsAt.Before(decideAt))
	assert.Equal(t, callsAt, h.st.AlarmAt, "a sooner deadline arms the alarm again")
	assert.Len(t, h.alarms, 2)

	h.succeed(h.dispatched()[0].CallID, nil)
	out := h.fireAlarm()
	assert.Len(t, h.dispatched(), 1, "the silent call is sent once more")
	assert.True(t, has(out, EffectAct))
	assert.False(t, h.st.IsTerminal())
	assert.Equal(t, earliest(h.st), h.st.AlarmAt, "armed again for the earliest pending timer")

	out = h.fireAlarm()
	assert.Equal(t, actionbus.CodeStageStalled, h.code())
	assert.True(t, has(out, EffectEnd))
	assert.Empty(t, h.st.Timers)
}

// An alarm that fires only stale timers publishes nothing, but the state
// changed: it is saved, and the alarm armed again for what is pending.
func TestAnAlarmOfStaleTimersIsSavedAndArmedAgain(t *testing.T) {
	h := newHarness(t, events.RunLimits{})
	h.alarm = true
	h.agent()
	h.decide(events.Decision{Type: events.DecisionClarify, Question: "which?"})
	require.Equal(t, PhaseAwaitingInput, h.st.Phase)
	// The first cycle's planner deadline is still pending; the wait for
	// input has its own.
	h.st.Timers["decide"] = Timer{Name: "decide", At: h.env.Now().Add(time.Second), Fired: events.TimerFired{Kind: events.TimerDecision, Cycle: 1}}
	h.st.AlarmAt = h.st.Timers["decide"].At
	out := h.fireAlarm()
	require.Len(t, out, 1)
	assert.Equal(t, EffectSave, out[0].Kind)
	assert.Equal(t, PhaseAwaitingInput, h.st.Phase, "the stale deadline changed nothing")
	assert.NotContains(t, h.st.Timers, "decide")
	assert.Contains(t, h.st.Timers, "input")
	assert.Equal(t, earliest(h.st), h.st.AlarmAt, "armed again for the earliest pending timer")

	// Fired again (a redelivery) once nothing is pending: nothing at all.
	h.st.Timers = nil
	assert.Empty(t, h.apply(&events.TimerFired{RunID: testRunID, Kind: events.TimerAlarm}))
}

// earliest is the time of st's earliest pending timer.
func earliest(st *State) time.Time {
	next, _ := st.nextTimer()
	return next
}

// At admission the alarm comes within the given grace: the deadlines the
// run sets while it goes on come after it and need no schedule of their
// own, and when it fires with nothing due it is armed for the earliest.
func TestTheFirstAlarmComesWithinTheGrace(t *testing.T) {
	const grace = 30 * time.Second
	h := newHarness(t, events.RunLimits{ActionGrace: grace})
	h.alarm, h.admitWithin = true, grace
	admitted := h.env.Now()
	h.agent()
	require.Len(t, h.alarms, 1)
	assert.Equal(t, admitted.Add(grace), h.st.AlarmAt, "within the grace, before the planner's deadline")
	h.decide(action("t.read", nil))
	require.Len(t, h.dispatched(), 1)
	assert.Len(t, h.alarms, 1, "the call's deadline comes after the alarm: no new schedule")
	h.succeed(h.dispatched()[0].CallID, nil)

	out := h.fireAlarm() // the run is still deciding
	require.Len(t, out, 1)
	assert.Equal(t, EffectSave, out[0].Kind, "nothing was due")
	assert.Equal(t, earliest(h.st), h.st.AlarmAt, "armed for the earliest pending timer")
	assert.Len(t, h.alarms, 2)
}
