package audit

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/events"
)

// A flush asked for one batch appends that batch or nothing: the flush of
// a full batch, or its timer, that another flush beat to it (both waited
// on the chain's lock) leaves the chain's next batch, just started, to its
// own time; and a batch whose timer fires before it waited its time is
// not appended but waits on.
// FlushAfter is an hour, so that no timer fires by itself: the test fires
// them by calling flush as the timer does.
func TestAFlushAppendsTheBatchItWasAskedFor(t *testing.T) {
	var mu sync.Mutex
	var appended [][]string
	c := newChains(time.Hour, time.Hour, 64, 1<<20, func(_ context.Context, b *batch) error {
		mu.Lock()
		defer mu.Unlock()
		var ids []string
		for _, r := range b.records {
			ids = append(ids, r.EventID)
		}
		appended = append(appended, ids)
		return nil
	})
	add := func(id string) <-chan error {
		return c.add("X", "t", events.AuditRecorded{RunID: "r", EventID: id}, 1, time.Now(), false, nil)
	}
	pending := func() *batch {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.pending["X"]
	}
	done := add("a")
	first := pending()
	c.flush("X", first, false) // appended by another flush (full, say)
	require.NoError(t, <-done)
	next := add("b")
	second := pending()
	require.NotSame(t, first, second)

	c.flush("X", first, false) // first's flush when full, come late
	assert.Same(t, second, pending(), "the next batch waits on")
	c.flush("X", first, true) // first's timer, firing late
	assert.Same(t, second, pending(), "the next batch waits on")
	c.flush("X", second, true) // second's timer, before its time
	assert.Same(t, second, pending(), "a batch not due waits on")
	mu.Lock()
	assert.Equal(t, [][]string{{"a"}}, appended)
	mu.Unlock()

	c.stop() // appends what waits
	require.NoError(t, <-next)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, [][]string{{"a"}, {"b"}}, appended)
}
