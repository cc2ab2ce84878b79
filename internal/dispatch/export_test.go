package dispatch

import (
	"context"

	"github.com/actionbus/actionbus/internal/run"
)

// SetCrashAfterWrite makes d simulate a crash between storing a run's
// state and publishing its outbox whenever f returns true.
func SetCrashAfterWrite(d *Dispatcher, f func(runID string) bool) { d.crashAfterWrite = f }

// SetCrashHoldingAlarm makes d simulate a crash while it holds a new run's
// alarm whenever f returns true: the alarm is never armed and the run's
// request is handed back.
func SetCrashHoldingAlarm(d *Dispatcher, f func(runID string) bool) { d.deferred.crash = f }

// ClaimRetry is d's run.Env.ClaimRetry.
func ClaimRetry(ctx context.Context, d *Dispatcher, priorID, retryID string) (string, error) {
	return env{d}.ClaimRetry(ctx, priorID, retryID)
}

// SetCrashAfterEnd makes d simulate a crash between publishing a run's
// end and writing its state whenever f returns true.
func SetCrashAfterEnd(d *Dispatcher, f func(runID string) bool) { d.crashAfterEnd = f }

// Recompute is the recomputation of d's repair of a run's ended state: st
// as read, end its stored end, ended by the events endedBy (in order),
// inHand the events of the run in hand, of tenant. It returns the
// rebuilt state and whether it is kept.
func Recompute(ctx context.Context, d *Dispatcher, st *run.State, end *run.Terminal, endedBy []string, inHand []run.Event, tenant string) (*run.State, bool) {
	jobs := make([]*job, len(inHand))
	for i, ev := range inHand {
		jobs[i] = &job{ev: ev, tenant: tenant}
	}
	rebuilt, _ := d.recompute(ctx, st, &endInStream{Terminal: end, endedBy: endedBy}, jobs)
	return rebuilt, rebuilt != nil
}
