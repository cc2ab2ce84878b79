package limitstore_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/limits"
	"github.com/actionbus/actionbus/internal/limits/limitstore"
)

// Stores of several processes share one bucket: concurrent acquires of
// one key never grant more than its bound.
func TestStoresSharingABucketNeverOvergrant(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := srv.JS.KeyValue(ctx, bus.Topology{}.BucketLimits())
	require.NoError(t, err)
	a, b := limitstore.New(kv), limitstore.New(kv)
	spec := limits.Spec{MaxInFlight: 3}
	var mu sync.Mutex
	granted := 0
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		store := a
		if i%2 == 1 {
			store = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := store.Acquire(ctx, "k", spec, limits.Request{CallID: fmt.Sprint(i), Lease: time.Minute})
			assert.NoError(t, err)
			if g.OK {
				mu.Lock()
				granted++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 3, granted)
	st, err := a.Get(ctx, "k")
	require.NoError(t, err)
	assert.Len(t, st.Holders, 3)
	assert.Len(t, st.Waiting, 17)

	next, err := b.Release(ctx, "k", st.Holding()[0], 1)
	require.NoError(t, err)
	require.Len(t, next, 1, "the first waiter is named, to be woken")
	g, err := a.Acquire(ctx, "k", spec, limits.Request{CallID: next[0].CallID, Lease: time.Minute})
	require.NoError(t, err)
	assert.True(t, g.OK)
}
