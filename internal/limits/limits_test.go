package limits_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/internal/limits"
)

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func req(id string) limits.Request {
	return limits.Request{CallID: id, RunID: "R" + id, Tenant: "default", Lease: time.Minute}
}

func TestMaxInFlightGrantsFirstComeFirstServed(t *testing.T) {
	spec := limits.Spec{MaxInFlight: 2}
	var s limits.State
	assert.True(t, limits.Acquire(&s, spec, req("a"), t0).OK)
	assert.True(t, limits.Acquire(&s, spec, req("b"), t0).OK)
	g := limits.Acquire(&s, spec, req("c"), t0)
	assert.False(t, g.OK, "a third call waits")
	assert.Equal(t, 0, g.Position)
	assert.Equal(t, t0.Add(limits.PollInterval), g.RetryAt)
	g = limits.Acquire(&s, spec, req("d"), t0)
	assert.False(t, g.OK)
	assert.Equal(t, 1, g.Position, "queued behind c")

	assert.True(t, limits.Acquire(&s, spec, req("a"), t0).OK, "asking again while holding is harmless")
	assert.Equal(t, []string{"a", "b"}, s.Holding())

	require.True(t, limits.Release(&s, "a"))
	assert.Equal(t, []limits.Waiter{{CallID: "c", RunID: "Rc", Tenant: "default", Until: t0.Add(limits.PollInterval + 5*time.Second)}}, limits.Next(&s, 1))
	assert.False(t, limits.Acquire(&s, spec, req("d"), t0.Add(time.Second)).OK, "d may not jump the queue")
	assert.True(t, limits.Acquire(&s, spec, req("c"), t0.Add(time.Second)).OK, "c, first in line, gets the freed slot")
	assert.False(t, limits.Release(&s, "zzz"), "releasing what is not held changes nothing")
}

func TestAWaiterThatStopsAskingLosesItsPlace(t *testing.T) {
	spec := limits.Spec{MaxInFlight: 1}
	var s limits.State
	require.True(t, limits.Acquire(&s, spec, req("a"), t0).OK)
	require.False(t, limits.Acquire(&s, spec, req("gone"), t0).OK)
	require.False(t, limits.Acquire(&s, spec, req("b"), t0).OK)
	limits.Release(&s, "a")
	assert.False(t, limits.Acquire(&s, spec, req("b"), t0.Add(time.Second)).OK, "gone is still owed the slot")
	assert.True(t, limits.Acquire(&s, spec, req("b"), t0.Add(7*time.Second)).OK, "gone stopped asking; b is first now")
}

func TestAHolderWhoseLeaseEndedFreesItsSlot(t *testing.T) {
	spec := limits.Spec{MaxInFlight: 1}
	var s limits.State
	require.True(t, limits.Acquire(&s, spec, limits.Request{CallID: "a", Lease: time.Second}, t0).OK)
	assert.False(t, limits.Acquire(&s, spec, req("b"), t0.Add(500*time.Millisecond)).OK)
	assert.True(t, limits.Acquire(&s, spec, req("b"), t0.Add(2*time.Second)).OK, "a's dispatcher vanished; its lease ended")
}

func TestRateIsATokenBucket(t *testing.T) {
	spec := limits.Spec{Rate: &limits.Rate{Limit: 5, PerMs: 1000, Burst: 2}}
	var s limits.State
	assert.True(t, limits.Acquire(&s, spec, req("a"), t0).OK)
	assert.True(t, limits.Acquire(&s, spec, req("b"), t0).OK, "the burst")
	g := limits.Acquire(&s, spec, req("c"), t0)
	require.False(t, g.OK)
	assert.Equal(t, t0.Add(200*time.Millisecond), g.RetryAt, "one token every 200 ms")
	g = limits.Acquire(&s, spec, req("d"), t0)
	assert.Equal(t, t0.Add(400*time.Millisecond), g.RetryAt, "d waits for the second token")
	assert.False(t, limits.Acquire(&s, spec, req("c"), t0.Add(100*time.Millisecond)).OK)
	assert.True(t, limits.Acquire(&s, spec, req("c"), t0.Add(200*time.Millisecond)).OK)
	assert.False(t, limits.Acquire(&s, spec, req("d"), t0.Add(300*time.Millisecond)).OK)
	assert.True(t, limits.Acquire(&s, spec, req("d"), t0.Add(400*time.Millisecond)).OK)
	// Holders of a rate-only limit do not bound concurrency.
	assert.Len(t, s.Holding(), 4)
}

// Over a long run, calls asking as soon as they are told start at the
// configured rate.
func TestRateHoldsOverTime(t *testing.T) {
	spec := limits.Spec{Rate: &limits.Rate{Limit: 10, PerMs: 1000, Burst: 1}}
	var s limits.State
	now, started := t0, 0
	pending := []string{}
	for i := 0; i < 400; i++ {
		pending = append(pending, fmt.Sprint(i))
	}
	for now.Before(t0.Add(10 * time.Second)) {
		next := now.Add(time.Second)
		for len(pending) > 0 {
			g := limits.Acquire(&s, spec, req(pending[0]), now)
			if !g.OK {
				if g.RetryAt.Before(next) {
					next = g.RetryAt
				}
				break
			}
			started++
			pending = pending[1:]
		}
		now = next
	}
	assert.InDelta(t, 100, started, 2, "10 per second for 10 s")
}

func TestBucketKeysOfTwoKeysDiffer(t *testing.T) {
	assert.NotEqual(t, limits.BucketKey("crm.update|a"), limits.BucketKey("crm.update|b"))
}
