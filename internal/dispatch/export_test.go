package dispatch

import (
	"context"
	"time"

	"github.com/actionbus/actionbus/internal/run"
)

// SetCrashAfterWrite makes d simulate a crash between storing a run's
// state and publishing its outbox whenever f returns true.
func SetCrashAfterWrite(d *Dispatcher, f func(runID string) bool) { d.crashAfterWrite = f }

// SetCrashHoldingAlarm makes d simulate a crash while it holds a new run's
// alarm whenever f returns true: the alarm is never armed and the run's
// request is handed back.
func SetCrashHoldingAlarm(d *Dispatcher, f func(runID string) bool) { d.deferred.crash = f }

// SetFailHandingOut makes d fail the hand-out of a run admitted without a
// state write, before it publishes, with the error f returns (nil: it
// publishes).
func SetFailHandingOut(d *Dispatcher, f func(runID string) error) { d.failHandingOut = f }

// SetArming tells f the id of each run whose held alarm's delay passed,
// before d arms it.
func SetArming(d *Dispatcher, f func(runID string)) { d.deferred.arming = f }

// ClaimRetry is d's run.Env.ClaimRetry.
func ClaimRetry(ctx context.Context, d *Dispatcher, priorID, retryID string) (string, error) {
	return env{d}.ClaimRetry(ctx, priorID, retryID)
}

// PriorRun is what d tells a retry of tenant naming runID (see
// run.Env.PriorRun).
func PriorRun(ctx context.Context, d *Dispatcher, tenant, runID string) (*run.State, error) {
	return env{d}.PriorRun(ctx, tenant, runID)
}

// EndedState is the ended state of tenant's run runID as d's readers (a
// retry, a replay) rebuild it (see Dispatcher.endedState).
func EndedState(ctx context.Context, d *Dispatcher, tenant, runID string) (*run.State, error) {
	return d.endedState(ctx, tenant, runID, false)
}

// HoldEndWaits takes n of d's places for readers waiting for an end in
// flight, as n waiting readers would, until the returned func gives them
// back.
func HoldEndWaits(d *Dispatcher, n int32) (release func()) {
	d.endWaits.Add(n)
	return func() { d.endWaits.Add(-n) }
}

// MaxEndWaits is how many readers wait for an end in flight at once.
const MaxEndWaits = maxEndWaits

// SetCrashAfterEnd makes d simulate a crash between publishing a run's
// end and writing its state whenever f returns true.
func SetCrashAfterEnd(d *Dispatcher, f func(runID string) bool) { d.crashAfterEnd = f }

// Typed is an event with its CloudEvent type and stored position
// ("<stream>:<sequence>"), as a dispatcher has it in hand.
type Typed struct {
	Type  string
	Event run.Event
	Pos   string
}

// EndedBy is the Ab-Ended-By header of an end published for events.
func EndedBy(events ...Typed) string {
	jobs := make([]*job, len(events))
	for i, e := range events {
		jobs[i] = &job{ev: e.Event, typ: e.Type, pos: e.Pos}
	}
	return endedBy(jobs)
}

// Recompute is the recomputation of d's repair of a run's ended state: st
// as read, end its stored end, whose Ab-Ended-By header is endedBy,
// inHand the events of the run in hand, of tenant. It returns the
// rebuilt state and whether it is kept.
func Recompute(ctx context.Context, d *Dispatcher, st *run.State, end *run.Terminal, endedBy string, inHand []Typed, tenant string) (*run.State, bool) {
	jobs := make([]*job, len(inHand))
	for i, e := range inHand {
		jobs[i] = &job{ev: e.Event, typ: e.Type, pos: e.Pos, tenant: tenant}
	}
	rebuilt, _ := d.recompute(ctx, st, &endInStream{Terminal: end, endedBy: parseEndedBy(endedBy)}, jobs)
	return rebuilt, rebuilt != nil
}

// SetCrashHandingOut makes d simulate a crash of an admission that handed
// its work out before its state was stored whenever f returns true.
func SetCrashHandingOut(d *Dispatcher, f func(runID string) bool) { d.crashHandingOut = f }

// IDKey is the id key d gives a new run of tenant.
func IDKey(d *Dispatcher, tenant, runID string) string { return d.idKey(tenant, runID) }

// ForgetStates drops every state d keeps decoded: the next transition of
// each run reads it from the bucket, as after a cache eviction.
func ForgetStates(d *Dispatcher) { d.cache.forgetStates() }

// Acquire asks for the slot of call c of run st as d does when it applies
// a transition, or, frozen, as it does when it applies one again to
// rebuild a run's end (frozenEnv).
func Acquire(ctx context.Context, d *Dispatcher, frozen bool, st *run.State, c run.CallState) (run.Capacity, error) {
	if frozen {
		return (&frozenEnv{env: env{d}, at: time.Now()}).Acquire(ctx, st, c)
	}
	return env{d}.Acquire(ctx, st, c)
}
