package attack41_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// unpartitioned turns srv's streams and dispatcher consumers into the
// layout of the release before partitions (cb308c1): run events stored on
// the subjects they were published on, and one consumer of each kind.
func unpartitioned(t *testing.T, srv *actionbustest.Server) {
	ctx := ctxFor(t, 20*time.Second)
	topo := bus.Topology{Prefix: srv.Prefix}
	s := topo.Subjects()
	for _, name := range []string{topo.StreamRuns(), topo.StreamTimers(), topo.StreamRequests()} {
		st, err := srv.JS.Stream(ctx, name)
		require.NoError(t, err)
		cfg := st.CachedInfo().Config
		cfg.SubjectTransform = nil
		if name == topo.StreamRequests() {
			cfg.SubjectTransform = &jetstream.SubjectTransformConfig{Source: s.Ingested("*", "*", "*"),
				Destination: s.Run("{{wildcard(1)}}", "{{wildcard(2)}}", "{{wildcard(3)}}")}
		}
		_, err = srv.JS.UpdateStream(ctx, cfg)
		require.NoError(t, err)
	}
	for _, c := range topo.DispatcherConsumers(0) {
		require.NoError(t, srv.JS.DeleteConsumer(ctx, c.Stream, c.Config.Durable))
	}
	old := func(stream, name string, filters ...string) {
		_, err := srv.JS.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: name, FilterSubjects: filters,
			AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: bus.HandlerMaxDeliver})
		require.NoError(t, err)
	}
	old(topo.StreamRuns(), bus.ConsumerDispatcher, s.AnyRun("decision"), s.AnyRun("result"), s.AnyRun("synthesized"))
	old(topo.StreamTimers(), bus.ConsumerDispatcherTimers, s.AnyRun("timer"))
	old(topo.StreamRequests(), bus.ConsumerDispatcherRequests, s.RequestSubjects()...)
	for _, c := range []struct{ stream, name, filter string }{
		{topo.StreamRuns(), bus.ConsumerAuditorRuns, s.AnyRun("*")},
		{topo.StreamRequests(), bus.ConsumerAuditorRequests, s.AnyRun("*")},
		{topo.StreamRuns(), bus.ConsumerPlanner, s.AnyRun("decide")},
	} {
		cons, err := srv.JS.Consumer(ctx, c.stream, c.name)
		require.NoError(t, err)
		cfg := cons.CachedInfo().Config
		cfg.FilterSubjects = []string{c.filter}
		if c.name == bus.ConsumerPlanner {
			cfg.FilterSubjects = append(cfg.FilterSubjects, s.AnyRun("synthesize"))
		}
		_, err = srv.JS.UpdateConsumer(ctx, c.stream, cfg)
		require.NoError(t, err)
	}
}

// drainLegacy acknowledges what the old layout's dispatcher consumers
// hold, as the dispatchers of the release before do when the runs in
// flight end before an upgrade.
func drainLegacy(t *testing.T, srv *actionbustest.Server) {
	ctx := ctxFor(t, 20*time.Second)
	topo := bus.Topology{Prefix: srv.Prefix}
	for stream, name := range map[string]string{topo.StreamRuns(): bus.ConsumerDispatcher, topo.StreamTimers(): bus.ConsumerDispatcherTimers,
		topo.StreamRequests(): bus.ConsumerDispatcherRequests} {
		cons, err := srv.JS.Consumer(ctx, stream, name)
		require.NoError(t, err)
		for cons.CachedInfo().NumPending > 0 {
			batch, err := cons.Fetch(100, jetstream.FetchMaxWait(time.Second))
			require.NoError(t, err)
			for m := range batch.Messages() {
				require.NoError(t, m.DoubleAck(ctx))
			}
			cons, err = srv.JS.Consumer(ctx, stream, name)
			require.NoError(t, err)
		}
	}
}

// TestAttack41_UpgradeKeepsTheRunsOfTheReleaseBefore: an operator
// upgrades a deployment of the release before partitions as the
// dispatcher's own error tells (bus.PartitionsOf: "run `actionbus
// provision` with the services drained").
//   - A run requested while the dispatchers were stopped is still in the
//     old dispatcher-requests consumer: provision must not strand it (no
//     consumer of the new layout matches a five-token subject). It
//     refuses, topology_busy, and changes nothing.
//   - Once the old consumers are empty, provision goes through, and a
//     run that completed before the upgrade (its events stored on
//     five-token subjects) is still read: the readers read both forms.
func TestAttack41_UpgradeKeepsTheRunsOfTheReleaseBefore(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	unpartitioned(t, srv)
	srv.ServeIngress(t)
	ctx := ctxFor(t, 60*time.Second)
	c, err := client.New(srv.Connect(t), client.Options{Prefix: srv.Prefix})
	require.NoError(t, err)
	topo := bus.Topology{Prefix: srv.Prefix}

	// A run the release before completed.
	done, err := c.Start(ctx, client.RunRequest{UserID: "ada", Action: &client.ActionCall{Name: "inv.count", Args: map[string]any{}}})
	require.NoError(t, err)
	b, err := bus.Open(srv.Connect(t), bus.BusConfig{Prefix: srv.Prefix, Source: "/dispatcher"})
	require.NoError(t, err)
	_, err = b.Emit(ctx, events.TypeRunCompleted, events.NewID(), events.DefaultTenant, done, "", &events.RunCompleted{RunID: done, Output: "42", Cycles: 1})
	require.NoError(t, err)
	require.Equal(t, 1, srv.Stored(t, "AB_RUNS", "ab.run.default."+done+".completed"))
	drainLegacy(t, srv)
	// A run requested while the dispatchers were stopped for the upgrade.
	waiting, err := c.Start(ctx, client.RunRequest{UserID: "ada", Action: &client.ActionCall{Name: "inv.count", Args: map[string]any{}}})
	require.NoError(t, err)

	// The consumer counts a stored message as pending a moment after the
	// stream stored it (the server signals its consumers asynchronously):
	// the operator provisions once the dispatchers are stopped, not in
	// that moment, and so does this test.
	require.Eventually(t, func() bool {
		cons, err := srv.JS.Consumer(ctx, topo.StreamRequests(), bus.ConsumerDispatcherRequests)
		return err == nil && cons.CachedInfo().NumPending == 1
	}, 10*time.Second, 10*time.Millisecond, "the old consumer holds the request")

	t.Run("provision refuses to strand a request stored before the upgrade", func(t *testing.T) {
		err := bus.Topology{Prefix: srv.Prefix}.Provision(ctx, srv.JS)
		require.ErrorIs(t, err, actionbus.ErrTopologyBusy)
		assert.Contains(t, err.Error(), bus.ConsumerDispatcherRequests)
		cons, err := srv.JS.Consumer(ctx, topo.StreamRequests(), bus.ConsumerDispatcherRequests)
		require.NoError(t, err, "the old consumer is kept")
		assert.Equal(t, uint64(1), cons.CachedInfo().NumPending, "with the request in it")
		st, err := srv.JS.Stream(ctx, topo.StreamRuns())
		require.NoError(t, err)
		assert.Nil(t, st.CachedInfo().Config.SubjectTransform, "the streams are as they were")
	})

	// The old dispatchers end the run in flight; then the upgrade goes on.
	drainLegacy(t, srv)
	_, err = b.Emit(ctx, events.TypeRunCompleted, events.NewID(), events.DefaultTenant, waiting, "", &events.RunCompleted{RunID: waiting, Output: "42", Cycles: 1})
	require.NoError(t, err)
	require.NoError(t, topo.Provision(ctx, srv.JS), "actionbus provision, drained")
	srv.StartStack(t, actionbustest.StackOptions{NoAuditor: true, NoPlanner: true, Register: registerEcho})

	t.Run("the result of a run before the upgrade is read", func(t *testing.T) {
		for _, id := range []string{done, waiting} {
			res, err := c.Ended(ctx, id)
			if assert.NoError(t, err) && assert.NotNil(t, res, "no result read for a run that completed before the upgrade") {
				assert.Equal(t, client.StatusCompleted, res.Status)
			}
		}
	})
	t.Run("a run after the upgrade goes through", func(t *testing.T) {
		res, err := c.Run(ctx, client.RunRequest{UserID: "ada", Action: &client.ActionCall{Name: "inv.count", Args: map[string]any{}}}, nil)
		require.NoError(t, err)
		assert.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	})
}
