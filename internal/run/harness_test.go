package run

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
)

const testRunID = "01JB0000000000000000000000"

// harness drives one run through the machine, as the dispatcher would,
// but without NATS: every transition's state goes through a JSON round
// trip (as it does through the runs bucket) and every effect is kept.
type harness struct {
	t   testing.TB
	env *memEnv
	m   *Machine
	st  *State
	// all are every effect so far; last those of the last transition.
	all, last []Effect
	seq       int
	// alarm makes the harness arm timers as the dispatcher does ([Arm]):
	// all and last keep the timers the machine asked for, alarms the
	// alarm schedules Arm armed.
	alarm  bool
	alarms []*Timer
	// admitWithin arms the admission's alarm as the dispatcher does
	// ([ArmAdmitted]); zero uses [Arm].
	admitWithin time.Duration
}

func newHarness(t testing.TB, lim events.RunLimits) *harness {
	env := newMemEnv(t)
	return &harness{t: t, env: env, m: New(env, Config{Limits: lim})}
}

func (h *harness) start(req events.RunRequested) *harness {
	h.t.Helper()
	req.RunID = testRunID
	st, out, err := h.m.Start(context.Background(), &req, "idkey")
	require.NoError(h.t, err)
	h.st = st
	out = h.settle(out)
	h.armWith(out, func(st *State, out []Effect, now time.Time) []Effect {
		if h.admitWithin > 0 {
			return ArmAdmitted(st, out, now, h.admitWithin)
		}
		return Arm(st, out, now)
	})
	h.record(out)
	return h
}

// admit admits another run with the harness's machine, as the dispatcher
// does: started, and what its admission asks of the shell carried out.
// The harness's own run is left as it is.
func (h *harness) admit(req *events.RunRequested, idKey string) (*State, []Effect, error) {
	st, out, err := h.m.Start(context.Background(), req, idKey)
	if err != nil {
		return nil, nil, err
	}
	out, err = h.m.Settle(context.Background(), h.env, st, out)
	return st, out, err
}

func (h *harness) agent() *harness { return h.start(events.RunRequested{Prompt: "help"}) }

func (h *harness) workflow(doc string) *harness {
	var wf map[string]any
	require.NoError(h.t, json.Unmarshal([]byte(doc), &wf))
	return h.start(events.RunRequested{Workflow: wf})
}

// record keeps a transition's effects and round-trips the state.
func (h *harness) record(out []Effect) {
	h.t.Helper()
	h.last = out
	h.all = append(h.all, out...)
	b, err := h.st.Encode()
	require.NoError(h.t, err)
	ref, err := json.Marshal(h.st)
	require.NoError(h.t, err)
	require.Equal(h.t, string(ref), string(b), "the stored form is what encoding/json writes")
	st, err := DecodeState(b)
	require.NoError(h.t, err)
	var want State
	require.NoError(h.t, json.Unmarshal(b, &want))
	require.Equal(h.t, want, st, "the stored form reads back as encoding/json reads it")
	h.st = &st
	for _, e := range out {
		switch e.Kind {
		case EffectTimer, EffectEvent, EffectStep, EffectWake, EffectSave:
			continue
		case EffectRelease:
			// The dispatcher releases the slot when it publishes.
			h.env.release(e.Key, e.CallID)
			continue
		}
		_, ok := Render(h.st, e)
		require.True(h.t, ok, "effect %s %s renders from the state stored with it", e.Kind, e.ID)
	}
}

// settle carries out what a transition's effects ask of the shell, as
// the dispatcher does ([Machine.Settle]), and returns the rest.
func (h *harness) settle(out []Effect) []Effect {
	h.t.Helper()
	rest, err := h.m.Settle(context.Background(), h.env, h.st, out)
	require.NoError(h.t, err)
	for _, e := range rest {
		require.NotContains(h.t, []EffectKind{EffectArtifact, EffectAcquire}, e.Kind, "settled effects ask nothing more of the shell")
	}
	return rest
}

// apply applies one event and returns its effects.
func (h *harness) apply(data any) []Effect {
	h.t.Helper()
	h.seq++
	before, err := json.Marshal(h.st)
	require.NoError(h.t, err)
	out, err := h.m.Apply(context.Background(), h.st, Event{ID: fmt.Sprintf("ev-%d", h.seq), Data: data})
	if errors.Is(err, ErrAhead) {
		// Handed back to be applied later: nothing changed.
		after, merr := json.Marshal(h.st)
		require.NoError(h.t, merr)
		require.JSONEq(h.t, string(before), string(after), "an event ahead of the run changes nothing")
		require.Empty(h.t, out)
		return nil
	}
	require.NoError(h.t, err)
	out = h.settle(out)
	if len(out) > 0 { // the dispatcher writes (and arms) only then
		h.arm(out)
	}
	h.record(out)
	return out
}

// arm applies [Arm] to a transition's effects in alarm mode.
func (h *harness) arm(out []Effect) { h.armWith(out, Arm) }

func (h *harness) armWith(out []Effect, arm func(*State, []Effect, time.Time) []Effect) {
	if !h.alarm {
		return
	}
	for _, e := range arm(h.st, out, h.env.Now()) {
		if e.Kind == EffectTimer {
			require.Equal(h.t, alarmName, e.Timer.Name, "only the alarm is scheduled")
			h.alarms = append(h.alarms, e.Timer)
		}
	}
}

// fireAlarm advances the clock to the armed alarm and fires it.
func (h *harness) fireAlarm() []Effect {
	h.t.Helper()
	require.False(h.t, h.st.AlarmAt.IsZero(), "an alarm is armed")
	if at := h.st.AlarmAt; h.env.Now().Before(at) {
		h.env.advance(at.Sub(h.env.Now()) + time.Second)
	}
	return h.apply(&events.TimerFired{RunID: testRunID, Kind: events.TimerAlarm, Stage: "alarm", DueAt: h.st.AlarmAt})
}

func (h *harness) decide(d events.Decision) []Effect {
	return h.apply(&events.DecisionMade{RunID: testRunID, Cycle: h.st.Cycle, Decision: d})
}

func (h *harness) succeed(callID string, output any) []Effect {
	return h.apply(&events.ActionCompleted{RunID: testRunID, CallID: callID, Output: output, Executor: "x1"})
}

func (h *harness) failCall(callID string, code actionbus.Code) []Effect {
	return h.apply(&events.ActionFailed{RunID: testRunID, CallID: callID, Error: actionbus.Error{Code: code, Message: "it failed"}, Executor: "x1"})
}

// fire fires the last armed timer of the kind.
func (h *harness) fire(kind string) []Effect {
	h.t.Helper()
	tm := h.timer(kind)
	require.NotNil(h.t, tm, "a %s timer was armed", kind)
	f := tm.Fired
	f.DueAt = tm.At
	if h.env.Now().Before(tm.At) {
		h.env.advance(tm.At.Sub(h.env.Now()) + time.Second)
	}
	return h.apply(&f)
}

// timer returns the last armed timer of the kind.
func (h *harness) timer(kind string) *Timer {
	for i := len(h.all) - 1; i >= 0; i-- {
		if e := h.all[i]; e.Kind == EffectTimer && e.Timer.Fired.Kind == kind {
			return e.Timer
		}
	}
	return nil
}

// dispatched returns the calls the last transition dispatched, in order.
func (h *harness) dispatched() []CallState {
	var out []CallState
	for _, e := range h.last {
		if e.Kind == EffectAct {
			out = append(out, h.st.Calls[h.st.callIndex(e.CallID)])
		}
	}
	return out
}

// approvals returns the approval ids the last transition requested.
func (h *harness) approvals() []string {
	var out []string
	for _, e := range h.last {
		if e.Kind == EffectApproval {
			out = append(out, e.ApprovalID)
		}
	}
	return out
}

func stepNames(out []Effect) []string {
	var names []string
	for _, e := range out {
		if e.Kind == EffectStep {
			names = append(names, e.Step.Name)
		}
	}
	return names
}

func kinds(out []Effect) []EffectKind {
	var ks []EffectKind
	for _, e := range out {
		ks = append(ks, e.Kind)
	}
	return ks
}

func has(out []Effect, k EffectKind) bool {
	for _, e := range out {
		if e.Kind == k {
			return true
		}
	}
	return false
}

// code is the run's failure code ("" when it did not fail).
func (h *harness) code() actionbus.Code {
	if t := h.st.Terminal; t != nil && t.Error != nil {
		return t.Error.Code
	}
	return ""
}

func action(name string, args map[string]any) events.Decision {
	return events.Decision{Type: events.DecisionAction, Name: name, Args: args}
}

func plan(actions ...events.Decision) events.Decision {
	return events.Decision{Type: events.DecisionPlan, Actions: actions}
}
