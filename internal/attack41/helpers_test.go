// Package attack41_test holds the independent attacks on the partitioned
// dispatchers (run events stored under their run's partition, one pinned
// consumer set per partition, ownership from the dispatchers' presence):
// each test plays a deployed party (a tenant's client, an executor, an
// operator re-provisioning) or a failure (a dispatcher paused, two
// dispatchers in one process) against a real embedded nats-server and
// real dispatchers, and asserts the safe behaviour, so that it fails
// while the hole it names is open.
package attack41_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/metrics"
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// runIDOf is a recorded event's run id (its runid extension).
func runIDOf(r actionbustest.Recorded) string {
	if r.Event == nil {
		return ""
	}
	id, _ := r.Event.Extensions()[events.ExtRunID].(string)
	return id
}

// startDispatcher runs a real dispatcher (internal/dispatch) on its own
// connection until the test ends or stop is called.
func startDispatcher(t *testing.T, srv *actionbustest.Server, cfg dispatch.Config) (stop func()) {
	t.Helper()
	d, err := dispatch.New(srv.Connect(t), cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("dispatcher: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("dispatcher not ready")
	}
	return stop
}

// gauge reads one metric (a gauge or a counter) of m; 0 when unrecorded.
func gauge(t *testing.T, m *metrics.Metrics, name string) float64 {
	t.Helper()
	v, _ := m.Value(name)
	return v
}
