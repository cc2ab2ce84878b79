package dispatch

import "context"

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
