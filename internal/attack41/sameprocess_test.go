package attack41_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/metrics"
)

// TestAttack41_TwoDispatchersInOneProcessAreTwoMembers: two dispatchers
// run in one process with the default instance id (host-pid), as an
// embedding host or `actionbus dev`-style stack would start them. The
// presence key is meant to tell them apart ("a unique suffix, since two
// dispatchers in one process share a default instance id"), but the
// suffix is nuid.Next()[:8], which is the process-wide nuid prefix: the
// same for every call. Both write one key, each sees one member (itself)
// and owns every partition; the pins then split a run's three consumers
// between them (a run handled by two dispatchers at once), and the first
// to stop deletes the key the other still relies on. Safe: two keys, and
// the partitions split between them.
func TestAttack41_TwoDispatchersInOneProcessAreTwoMembers(t *testing.T) {
	const partitions = 4
	srv := actionbustest.NewServer(t, actionbustest.Options{Partitions: partitions})
	m1, m2 := metrics.New(), metrics.New()
	startDispatcher(t, srv, dispatch.Config{Metrics: m1})
	startDispatcher(t, srv, dispatch.Config{Metrics: m2})
	ctx := ctxFor(t, 20*time.Second)
	kv, err := srv.JS.KeyValue(ctx, "ab_dispatchers")
	if !assert.NoError(t, err) {
		return
	}
	owned := func(m *metrics.Metrics) float64 { return gauge(t, m, "actionbus_partitions_owned") }
	split := assert.Eventually(t, func() bool { return owned(m1) == partitions/2 && owned(m2) == partitions/2 }, 6*time.Second, 20*time.Millisecond,
		"two dispatchers share the partitions")
	if !split {
		keys, _ := kv.Keys(context.Background())
		t.Errorf("presence keys %v; partitions owned: first %v, second %v", keys, owned(m1), owned(m2))
	}
}
