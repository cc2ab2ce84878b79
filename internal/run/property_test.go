package run

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/limits"
)

// script turns fuzz bytes into choices; past its end every choice is 0.
type script struct {
	b []byte
	i int
}

func (s *script) pick(n int) int {
	if n <= 1 || s.i >= len(s.b) {
		return 0
	}
	v := int(s.b[s.i]) % n
	s.i++
	return v
}

func (s *script) done() bool { return s.i >= len(s.b) }

// maxStateBytes bounds the state of the property runs (small outputs, at
// most 40 events).
const maxStateBytes = 256 << 10

// playScript drives one run with events chosen by the script — decisions of
// every type, valid and stale; results for any call, duplicates included;
// timers of every kind, current and stale; cancels; grants, forged grants
// and denials; answers; synthesis parts; and replays of earlier events — and
// checks the invariants after every transition.
func playScript(t *testing.T, s *script) {
	playScriptH(t, s, newHarness(t, events.RunLimits{MaxPlanParallel: 2, MaxSectionParallel: 2, MaxCycles: 6}))
}

func playScriptH(t *testing.T, s *script, h *harness) {
	switch s.pick(3) {
	case 0:
		h.start(events.RunRequested{Prompt: "p", AllowedModes: allModes})
	case 1:
		var wf map[string]any
		require.NoError(t, json.Unmarshal([]byte(`{"workflowName": "w", "steps": [
			{"id": "a", "action": "t.read", "input": {}, "retry": {"maxAttempts": 2, "delayMs": 10}},
			{"id": "b", "action": "t.mutate", "input": {"x": {"$fromStep": "a", "path": "/v"}}, "allowedModes": ["mutate"], "retry": {"maxAttempts": 2}},
			{"id": "c", "action": "t.other", "input": {}, "continueOnError": true}]}`), &wf))
		h.start(events.RunRequested{Workflow: wf, AllowedModes: allModes})
	default:
		h.start(events.RunRequested{Action: &events.ActionCall{Name: []string{"t.read", "t.mutate", "t.query"}[s.pick(3)]}, AllowedModes: allModes})
	}
	check(t, h)
	var history []any
	for n := 0; n < 40 && !s.done(); n++ {
		ev := nextEvent(t, h, s, history)
		if ev == nil {
			continue
		}
		history = append(history, ev)
		if testing.Verbose() {
			j, _ := json.Marshal(ev)
			t.Logf("%T %s", ev, j)
		}
		wasTerminal := h.st.Terminal
		out := h.apply(ev)
		if wasTerminal != nil {
			require.NotNil(t, h.st.Terminal, "an ended run stays ended")
			assert.Equal(t, wasTerminal.Type, h.st.Terminal.Type, "an ended run keeps its terminal event")
			assert.False(t, has(out, EffectEnd), "an ended run publishes no second terminal event (%T)", ev)
			for _, e := range out {
				assert.Contains(t, []EffectKind{EffectEvent, EffectStep}, e.Kind, "an ended run only answers approvals (%T)", ev)
			}
		}
		check(t, h)
	}
}

func nextEvent(t *testing.T, h *harness, s *script, history []any) any {
	st := h.st
	cycle := st.Cycle
	if s.pick(5) == 0 {
		cycle += s.pick(3) - 1 // a stale or future cycle
	}
	switch s.pick(10) {
	case 0, 1: // a decision
		var d events.Decision
		switch s.pick(7) {
		case 0:
			d = events.Decision{Type: events.DecisionFinal, Answer: "done"}
		case 1:
			d = action([]string{"t.read", "t.mutate", "t.query", "t.nope", "t.denied"}[s.pick(5)], map[string]any{"q": "x"})
		case 2:
			d = events.Decision{Type: events.DecisionClarify, Question: "which?"}
		case 3:
			d = events.Decision{Type: "shrug"}
		default:
			var acts []events.Decision
			for i := 0; i <= s.pick(4); i++ {
				a := action([]string{"t.read", "t.other", "t.query"}[s.pick(3)], map[string]any{"i": i})
				a.Section = &events.Section{Prompt: "write"}
				acts = append(acts, a)
			}
			d = plan(acts...)
			d.PartialOK = s.pick(2) == 0
			d.SynthesizePerAction = s.pick(3) == 0
		}
		return &events.DecisionMade{RunID: testRunID, Cycle: cycle, Decision: d}
	case 2, 3, 4: // a result for any call, done or not
		if len(st.Calls) == 0 {
			return nil
		}
		c := st.Calls[s.pick(len(st.Calls))]
		if c.CallID == "" {
			return nil
		}
		switch s.pick(4) {
		case 0:
			return &events.ActionFailed{RunID: testRunID, CallID: c.CallID, Error: actionbus.Error{Code: "upstream_down", Message: "down"}}
		case 1:
			return &events.ActionCompleted{RunID: testRunID, CallID: c.CallID, Output: map[string]any{"resultKind": "final", "markdown": "md"}}
		}
		return &events.ActionCompleted{RunID: testRunID, CallID: c.CallID, Output: map[string]any{"v": "x"}}
	case 5: // a timer, armed or made up
		if h.alarm {
			// The alarm, at its time or (a redelivery, a clock ahead)
			// at another pending timer's.
			at := h.st.AlarmAt
			for _, tm := range h.st.Timers {
				if s.pick(3) == 0 {
					at = tm.At
				}
			}
			if at.IsZero() {
				return nil
			}
			if h.env.Now().Before(at) {
				h.env.advance(at.Sub(h.env.Now()))
			}
			return &events.TimerFired{RunID: testRunID, Kind: events.TimerAlarm, Stage: "alarm", DueAt: at}
		}
		var armed []*Timer
		for _, e := range h.all {
			if e.Kind == EffectTimer {
				armed = append(armed, e.Timer)
			}
		}
		tm := armed[s.pick(len(armed))]
		f := tm.Fired
		if s.pick(4) == 0 {
			f.Cycle = cycle
		}
		if h.env.Now().Before(tm.At) {
			h.env.advance(tm.At.Sub(h.env.Now()))
		}
		f.DueAt = tm.At
		return &f
	case 6: // an approval's answer, valid or forged
		for id, p := range st.Approvals {
			switch s.pick(3) {
			case 0:
				return &events.ApprovalGranted{RunID: testRunID, ApprovalID: id, Token: sign(t, p.Context)}
			case 1:
				return &events.ApprovalGranted{RunID: testRunID, ApprovalID: id, Token: "k1.forged"}
			}
			return &events.ApprovalDenied{RunID: testRunID, ApprovalID: id, Token: signDenial(t, id, "no"), Reason: "no"}
		}
		return &events.ApprovalGranted{RunID: testRunID, ApprovalID: testRunID + "-1-0", Token: "k1.x"}
	case 7: // a synthesis part
		if st.Agent == nil || st.Agent.Synthesis == nil {
			return &events.SynthesisCompleted{RunID: testRunID, Cycle: cycle, Part: events.PartSection, Index: s.pick(3), Markdown: "x"}
		}
		p := st.Agent.Synthesis.Parts[s.pick(len(st.Agent.Synthesis.Parts))]
		return &events.SynthesisCompleted{RunID: testRunID, Cycle: cycle, Part: p.Part, Index: p.Index, Markdown: "section"}
	case 8: // a cancel or an answer
		if s.pick(3) == 0 {
			return &events.CancelRequested{RunID: testRunID, Reason: "stop"}
		}
		return &events.InputProvided{RunID: testRunID, Answer: "that"}
	default: // an earlier event again
		if len(history) == 0 {
			return nil
		}
		return history[s.pick(len(history))]
	}
}

// check asserts the invariants of the run after a transition.
func check(t *testing.T, h *harness) {
	t.Helper()
	ends := 0
	for _, e := range h.all {
		if e.Kind == EffectEnd {
			ends++
		}
	}
	require.LessOrEqual(t, ends, 1, "at most one terminal event")
	st := h.st
	b, err := json.Marshal(st)
	require.NoError(t, err)
	require.Less(t, len(b), maxStateBytes, "state stays within its bound")
	// A limit's slot is held only by a call of a running run that holds
	// it and is not done: no slot is taken for a call never handed out,
	// or kept past its call or its run.
	h.env.mu.Lock()
	for key, ls := range h.env.limits {
		for callID := range ls.Holders {
			i := st.callIndex(callID)
			holding := !st.IsTerminal() && i >= 0 && st.Calls[i].Holding && !st.Calls[i].Done
			assert.True(t, holding, "limit %s: slot held by call %s, which does not hold it", key, callID)
		}
	}
	h.env.mu.Unlock()
	if st.IsTerminal() {
		require.Equal(t, 1, ends, "an ended run published its terminal event")
		require.Contains(t, []Status{StatusCompleted, StatusFailed, StatusCanceled}, st.Status)
		return
	}
	require.NotNil(t, h.timer(events.TimerRunDeadline), "the run has a deadline")
	if h.alarm {
		// One armed alarm covers every pending timer, and the run's
		// deadline is among them until it ends.
		_, hasDeadline := st.Timers["run"]
		require.True(t, hasDeadline, "the run's deadline is pending")
		require.False(t, st.AlarmAt.IsZero(), "the alarm is armed")
		for name, tm := range st.Timers {
			require.False(t, tm.At.Before(st.AlarmAt.Add(-alarmSlack)), "timer %s (%s) comes before the alarm (%s)", name, tm.At, st.AlarmAt)
		}
		require.NotEmpty(t, h.alarms)
		require.Equal(t, st.AlarmAt, h.alarms[len(h.alarms)-1].At, "the last alarm scheduled is the armed one")
	}
	armed := func(kind string, match func(events.TimerFired) bool) bool {
		for _, e := range h.all {
			if e.Kind == EffectTimer && e.Timer.Fired.Kind == kind && match(e.Timer.Fired) {
				return true
			}
		}
		return false
	}
	switch st.Phase {
	case PhaseDeciding:
		require.True(t, armed(events.TimerDecision, func(f events.TimerFired) bool { return f.Cycle == st.Cycle }), "a decision wait has its deadline")
	case PhaseAwaitingInput:
		require.True(t, armed(events.TimerInput, func(f events.TimerFired) bool { return f.Cycle == st.Cycle }), "an input wait has its deadline")
	case PhaseSynthesizing:
		require.True(t, armed(events.TimerSynthesis, func(f events.TimerFired) bool { return f.Cycle == st.Cycle }), "a synthesis has its deadline")
	}
	// One schedule covers every call in flight: the last armed calls
	// timer (a later one replaces it) comes no later than any of their
	// deadlines.
	var calls *Timer
	for _, e := range h.all {
		if e.Kind == EffectTimer && e.Timer.Name == "calls" {
			calls = e.Timer
		}
	}
	for _, c := range st.Calls {
		if c.Dispatched && !c.Done && c.CallID != "" {
			require.NotNil(t, calls, "call %s has its deadline", c.CallID)
			require.False(t, c.DueAt.IsZero(), "call %s has its deadline", c.CallID)
			require.False(t, calls.At.After(c.DueAt), "call %s (due %s) is covered by the calls timer (%s)", c.CallID, c.DueAt, calls.At)
		}
	}
	for id := range st.Approvals {
		require.True(t, armed(events.TimerApproval, func(f events.TimerFired) bool { return f.ApprovalID == id }), "approval %s has its deadline", id)
	}
	if st.Workflow != nil {
		for i, sr := range st.Workflow.Steps {
			if sr.Status == StepStatusWaitingRetry {
				id := st.Workflow.Def.Steps[i].ID
				require.True(t, armed(events.TimerRetry, func(f events.TimerFired) bool { return f.StepID == id }), "step %s's retry is armed", id)
			}
		}
	}
}

// TestRandomEventSequencesKeepTheInvariants plays 500 random scripts: at
// most one terminal event, an ended run stays ended, every effect renders
// from the state stored with it, every wait has a deadline, state stays
// within its bound.
func TestRandomEventSequencesKeepTheInvariants(t *testing.T) {
	forEachScript(t, 7, func(t *testing.T, _ uint64, s *script) { playScript(t, s) })
}

// TestRandomEventSequencesKeepTheInvariantsUnderOneAlarm plays the same
// scripts with timers armed as the dispatcher arms them: one alarm per
// run, fired at its time or early.
func TestRandomEventSequencesKeepTheInvariantsUnderOneAlarm(t *testing.T) {
	forEachScript(t, 7, func(t *testing.T, seed uint64, s *script) {
		h := newHarness(t, events.RunLimits{MaxPlanParallel: 2, MaxSectionParallel: 2, MaxCycles: 6})
		h.alarm = true
		if seed%2 == 1 {
			h.admitWithin = 30 * time.Second // as the dispatcher admits
		}
		playScriptH(t, s, h)
	})
}

// TestRandomEventSequencesKeepTheInvariantsUnderALimit plays the same
// scripts under one alarm with t.read limited to one call at a time, so
// that calls wait for capacity, are asked for again by the capacity
// timer, and runs end with calls waiting or holding a slot.
func TestRandomEventSequencesKeepTheInvariantsUnderALimit(t *testing.T) {
	forEachScript(t, 11, func(t *testing.T, _ uint64, s *script) {
		h := limited(newHarness(t, events.RunLimits{MaxPlanParallel: 2, MaxSectionParallel: 2, MaxCycles: 6}), limits.Spec{MaxInFlight: 1})
		h.alarm = true
		playScriptH(t, s, h)
	})
}

// forEachScript plays 500 random scripts of 120 bytes, seeded 0 to 499
// on stream, each in a subtest named by its seed.
func forEachScript(t *testing.T, stream uint64, play func(t *testing.T, seed uint64, s *script)) {
	for seed := range uint64(500) {
		rng := rand.New(rand.NewPCG(seed, stream))
		b := make([]byte, 120)
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		t.Run(fmt.Sprint(seed), func(t *testing.T) { play(t, seed, &script{b: b}) })
	}
}

func FuzzTransitions(f *testing.F) {
	f.Add([]byte{0, 0, 0, 2, 1, 2, 3, 4})
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	f.Add([]byte{2, 0, 6, 0, 6, 1, 8, 0})
	f.Fuzz(func(t *testing.T, b []byte) { playScript(t, &script{b: b}) })
}
