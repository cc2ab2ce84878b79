package dispatch

import "context"

// SetCrashAfterWrite makes d simulate a crash between storing a run's
// state and publishing its outbox whenever f returns true.
func SetCrashAfterWrite(d *Dispatcher, f func(runID string) bool) { d.crashAfterWrite = f }

// ClaimRetry is d's run.Env.ClaimRetry.
func ClaimRetry(ctx context.Context, d *Dispatcher, priorID, retryID string) (string, error) {
	return env{d}.ClaimRetry(ctx, priorID, retryID)
}
