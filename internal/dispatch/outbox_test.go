package dispatch

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus/internal/run"
)

// A stored outbox is sent again only while it may be unsent: not when this
// dispatcher sent it, and never once it is older than half the streams'
// duplicate window (sending a work item again then would run it twice).
func TestAStoredOutboxIsSentAgainOnlyWhileItMayBeUnsent(t *testing.T) {
	outbox := []run.Effect{{Kind: run.EffectAct, ID: "work-1", CallID: "c1"}}
	for _, tc := range []struct {
		name     string
		age      time.Duration
		sentHere bool
		carried  bool
	}{
		{"young, written by another dispatcher or before a crash", 2 * time.Second, false, true},
		{"young, sent by this dispatcher", 2 * time.Second, true, false},
		{"past the freshness bound", 61 * time.Second, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &Dispatcher{cache: newStateCache(8), outboxFresh: time.Minute}
			st := &run.State{RunID: "R", UpdatedAt: time.Now().Add(-tc.age), Outbox: outbox}
			if tc.sentHere {
				d.cache.put(&run.State{RunID: "R"}, 7, 0)
			}
			got := d.carriedOutbox(st, 7)
			if tc.carried {
				assert.Equal(t, outbox, got)
			} else {
				assert.Empty(t, got)
			}
		})
	}
	// A publish that failed forgets what was sent.
	d := &Dispatcher{cache: newStateCache(8), outboxFresh: time.Minute}
	d.cache.put(&run.State{RunID: "R"}, 7, 0)
	d.cache.drop("R")
	assert.Equal(t, outbox, d.carriedOutbox(&run.State{RunID: "R", UpdatedAt: time.Now(), Outbox: outbox}, 7))
}
