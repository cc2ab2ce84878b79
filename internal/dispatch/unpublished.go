package dispatch

import (
	"context"
	"errors"
	"sync"
	"time"
)

// unpublished remembers runs whose outbox a publish failed to send (a
// stream electing a new leader answers nothing for seconds) and publishes
// them again in the background until it works. The redelivery of the
// event that produced the outbox would too, but each failed attempt
// spends a delivery of that event's budget, and a long enough election
// exhausts it: the outbox would then wait in the stored state, unsent,
// until the run's deadline.
type unpublished struct {
	mu   sync.Mutex
	runs map[string]time.Time // run id → when to try next
}

func newUnpublished() *unpublished { return &unpublished{runs: map[string]time.Time{}} }

func (u *unpublished) add(runID string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, ok := u.runs[runID]; !ok {
		u.runs[runID] = time.Now().Add(unpublishedRetry)
	}
}

// due returns the runs to try now, and schedules their next try.
func (u *unpublished) due(now time.Time) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []string
	for id, at := range u.runs {
		if !at.After(now) {
			out = append(out, id)
			u.runs[id] = now.Add(unpublishedRetry)
		}
	}
	return out
}

func (u *unpublished) done(runID string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.runs, runID)
}

// unpublishedRetry is how often an unsent outbox is tried again.
const unpublishedRetry = time.Second

// republish sends, every unpublishedRetry, the outboxes of the runs whose
// publish failed, until ctx ends.
func (d *Dispatcher) republish(ctx context.Context) {
	t := time.NewTicker(unpublishedRetry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for _, runID := range d.unsent.due(now) {
				unlock := d.locks.Lock(runID)
				err := d.flushStored(ctx, runID, true)
				unlock()
				if err == nil || errors.Is(err, errNotOwner) {
					// Sent, or the run's partition moved: its new owner
					// reads the stored outbox.
					d.unsent.done(runID)
				} else {
					d.log.Debug("outbox still not published; trying again", "run_id", runID, "err", err)
				}
			}
		}
	}
}
