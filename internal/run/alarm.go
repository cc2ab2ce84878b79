package run

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/actionbus/actionbus/events"
)

// A run has one armed schedule, its alarm. The machine's transitions ask
// for named timers (the run's deadline, the planner's, the calls', an
// approval's expiry, a retry's delay); [Arm] keeps them in the state as
// pending timers and arms the alarm at the earliest of them — a new
// schedule only when none is armed or the earliest comes sooner than the
// armed one. When the alarm fires, the machine fires every pending timer
// that is due, in time order, and the alarm is armed again for the rest.
//
// A one-action run stores one schedule (the calls' deadline comes before
// the run's), instead of one per timer; a run that ends before its alarm
// leaves that one schedule, whose firing changes nothing.

// alarmName is the alarm's schedule name (one schedule subject per run).
const alarmName = "alarm"

// alarmSlack is how much sooner than the armed alarm a timer must come to
// arm the alarm again: schedules have a resolution of a second, so a timer
// a little sooner than the alarm fires with it.
const alarmSlack = time.Second

// Arm turns the timers among a transition's effects into pending timers of
// st, and returns the effects with, in their place, at most one timer: the
// run's alarm, when it has to be armed (again). A run that ended needs no
// timers: its pending ones are dropped. Effects of timers already
// scheduled under their own names (states from before the alarm) are
// unaffected: only the effects passed in are turned.
func Arm(st *State, out []Effect, now time.Time) []Effect {
	return arm(st, out, now, time.Time{})
}

// ArmAdmitted is [Arm] for a run's admission: the first alarm comes within
// `within` (the dispatcher passes its ActionGrace) even when the earliest
// timer is later. Every deadline a run sets while it goes on — a call's
// (its timeout plus that grace), the planner's — then comes after the
// alarm, so a run that ends before it (most do) stores one schedule, not
// one more for each sooner deadline; a run that lasts longer finds nothing
// due when it fires and arms it for its earliest timer.
func ArmAdmitted(st *State, out []Effect, now time.Time, within time.Duration) []Effect {
	return arm(st, out, now, now.Add(within))
}

// arm is Arm with the alarm at limit at the latest (zero: no limit).
func arm(st *State, out []Effect, now, limit time.Time) []Effect {
	kept := make([]Effect, 0, len(out))
	for _, e := range out {
		if e.Kind != EffectTimer || e.Timer.Name == alarmName {
			kept = append(kept, e)
			continue
		}
		if st.Timers == nil {
			st.Timers = map[string]Timer{}
		}
		st.Timers[e.Timer.Name] = *e.Timer
	}
	if st.IsTerminal() {
		st.Timers = nil
		return kept
	}
	next, ok := st.nextTimer()
	if !ok {
		return kept
	}
	if !limit.IsZero() && limit.Before(next) {
		next = limit
	}
	if st.alarmCovers(next, now) {
		return kept // the armed alarm comes no later than it must
	}
	st.AlarmAt = next
	f := events.TimerFired{Kind: events.TimerAlarm, Stage: "alarm", RunID: st.RunID, Cycle: st.Cycle}
	// The id names the time: a later schedule replaces the earlier one
	// instead of being dropped as its duplicate.
	id := st.derive("timer", alarmName, next.UnixMilli())
	return append(kept, Effect{Kind: EffectTimer, ID: id, Timer: &Timer{Name: alarmName, At: next, Fired: f}})
}

// nextTimer returns the earliest pending timer's time.
func (st *State) nextTimer() (time.Time, bool) {
	var next time.Time
	for _, t := range st.Timers {
		if next.IsZero() || t.At.Before(next) {
			next = t.At
		}
	}
	return next, !next.IsZero()
}

// onAlarm fires the pending timers that are due, earliest first (by name
// between equals). [Arm], applied to what it returns, arms the alarm again
// for the timers still to come.
func (m *Machine) onAlarm(ctx context.Context, st *State) ([]Effect, error) {
	if st.IsTerminal() {
		return nil, nil
	}
	now := m.env.Now()
	st.AlarmAt = time.Time{} // it fired
	var due []string
	for name, t := range st.Timers {
		if !t.At.After(now) {
			due = append(due, name)
		}
	}
	if len(due) == 0 && len(st.Timers) == 0 {
		return nil, nil // fired before (a redelivery): nothing is pending
	}
	slices.SortFunc(due, func(a, b string) int {
		if c := st.Timers[a].At.Compare(st.Timers[b].At); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	var out []Effect
	for _, name := range due {
		t := st.Timers[name]
		delete(st.Timers, name)
		fired := t.Fired
		fired.DueAt = t.At
		effects, err := m.onTimer(ctx, st, &fired)
		if err != nil {
			return nil, err
		}
		out = append(out, effects...)
		if st.IsTerminal() {
			st.Timers = nil
			break
		}
	}
	// A request one timer asked for that a later one made moot (its
	// call stalled the run) is not sent.
	out = slices.DeleteFunc(out, func(e Effect) bool {
		switch e.Kind {
		case EffectDecide, EffectAct, EffectSynthesize, EffectApproval, EffectEnd:
			_, ok := Render(st, e)
			return !ok
		}
		return false
	})
	if len(out) == 0 {
		// Only stale timers were due, or none yet: nothing to publish,
		// but the state changed and the alarm is to be armed again.
		out = append(out, Effect{Kind: EffectSave, ID: st.derive("alarm-fired", now.UnixMilli())})
	}
	return out, nil
}

// AdmittedAlarm is the schedule name of a run's admission alarm when the
// shell defers arming it (see the dispatcher's Config.AlarmDelay): a
// schedule subject of its own, so that arming it late never replaces a
// sooner alarm a later transition armed meanwhile.
const AdmittedAlarm = "admitted"

// SplitAlarm takes the alarm out of effects: the rest, and the alarm
// effect (ok false when effects arm none).
func SplitAlarm(effects []Effect) (rest []Effect, alarm Effect, ok bool) {
	rest = make([]Effect, 0, len(effects))
	for _, e := range effects {
		if !ok && e.Kind == EffectTimer && e.Timer != nil && e.Timer.Name == alarmName {
			alarm, ok = e, true
			continue
		}
		rest = append(rest, e)
	}
	return rest, alarm, ok
}

// Deferred returns the alarm effect e under the admission alarm's
// schedule name ([AdmittedAlarm]), with its id.
func Deferred(e Effect) Effect {
	t := *e.Timer
	t.Name = AdmittedAlarm
	e.Timer = &t
	return e
}

// Rearm returns the admission alarm for the time the state says its alarm
// is armed at (ok false for a run that ended or has none): what a shell
// publishes again when it cannot tell whether an alarm it deferred was
// armed (its holder crashed). A schedule armed twice fires twice; the
// second finds nothing due.
func Rearm(st *State) (Effect, bool) {
	if st.IsTerminal() || st.AlarmAt.IsZero() {
		return Effect{}, false
	}
	f := events.TimerFired{Kind: events.TimerAlarm, Stage: "alarm", RunID: st.RunID, Cycle: st.Cycle}
	id := st.derive("timer", alarmName, st.AlarmAt.UnixMilli())
	return Effect{Kind: EffectTimer, ID: id, Timer: &Timer{Name: AdmittedAlarm, At: st.AlarmAt, Fired: f}}, true
}

// HandsOutHeld reports whether a transition that implies out may publish
// it while its state is held, written only with the run's next write (the
// dispatcher keeps the events it applied unacknowledged until then): out
// hands work out (an action call, a decision request) and implies nothing
// but that, live progress, and timers the armed alarm already covers — no
// stored event another service reads from the state, no slot released, no
// schedule to store. [Arm] applied to out then folds its timers into st
// and returns no schedule.
func HandsOutHeld(st *State, out []Effect, now time.Time) bool {
	work := false
	next, _ := st.nextTimer()
	for _, e := range out {
		switch {
		case e.Kind == EffectAct || e.Kind == EffectDecide:
			work = true
		case e.Kind == EffectStep && e.live():
		case e.Kind == EffectTimer && e.Timer.Name != alarmName:
			if next.IsZero() || e.Timer.At.Before(next) {
				next = e.Timer.At
			}
		default:
			return false
		}
	}
	return work && (next.IsZero() || st.alarmCovers(next, now))
}

// alarmCovers reports whether the armed alarm comes no later than a timer
// at next needs it: it is still ahead, and not more than alarmSlack after
// next.
func (st *State) alarmCovers(next, now time.Time) bool {
	return st.AlarmAt.After(now) && !next.Before(st.AlarmAt.Add(-alarmSlack))
}
