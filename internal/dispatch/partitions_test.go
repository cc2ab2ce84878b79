package dispatch_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/metrics"
)

// gauge reads one metric (a gauge or a counter) of m; 0 when unrecorded.
func gauge(t *testing.T, m *metrics.Metrics, name string) float64 {
	t.Helper()
	v, _ := m.Value(name)
	return v
}

// Dispatchers share the partitions of the runs: a second one takes half,
// one that stops hands its share back at once, and runs go through
// whichever partition they are in, with no state write conflicting.
func TestPartitionsMoveToTheDispatchersThatAreLive(t *testing.T) {
	const partitions = 4
	srv := actionbustest.NewServer(t, actionbustest.Options{Partitions: partitions})
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, Scenarios: echoScenario, Register: echoExecutor})
	m1, m2 := metrics.New(), metrics.New()
	startDispatcher(t, srv, dispatch.Config{InstanceID: "d1", Metrics: m1})
	owned := func(m *metrics.Metrics) float64 { return gauge(t, m, "actionbus_partitions_owned") }
	require.Eventually(t, func() bool { return owned(m1) == partitions }, 10*time.Second, 20*time.Millisecond, "one dispatcher owns every partition")

	stop2 := startDispatcher(t, srv, dispatch.Config{InstanceID: "d2", Metrics: m2})
	require.Eventually(t, func() bool { return owned(m1) == partitions/2 && owned(m2) == partitions/2 }, 10*time.Second, 20*time.Millisecond,
		"a second dispatcher takes half: d1 %v, d2 %v", owned(m1), owned(m2))

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run := func(n int) {
		ids := make([]string, n)
		for i := range ids {
			id, err := st.Client.Start(ctx, client.RunRequest{Scenario: "echo"})
			require.NoError(t, err)
			ids[i] = id
		}
		for _, id := range ids {
			res, err := st.Client.Wait(ctx, id)
			require.NoError(t, err)
			assert.Equal(t, client.StatusCompleted, res.Status, "run %s: %+v", id, res.Error)
		}
	}
	run(40)

	// A dispatcher that stops deletes its presence: the other takes its
	// partitions without waiting for the presence to expire.
	stopped := time.Now()
	stop2()
	require.Eventually(t, func() bool { return owned(m1) == partitions }, 3*time.Second, 20*time.Millisecond,
		"the stopped dispatcher's partitions move at once")
	t.Logf("partitions moved %s after the stop", time.Since(stopped).Round(time.Millisecond))
	run(20)
	assert.Zero(t, gauge(t, m1, "actionbus_run_state_conflicts_total"), "no run state write conflicted")
	assert.Zero(t, gauge(t, m2, "actionbus_run_state_conflicts_total"), "no run state write conflicted")
}
