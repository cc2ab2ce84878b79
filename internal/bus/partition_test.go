package bus_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// storedSubjects returns the subjects stream stores on filter.
func storedSubjects(t *testing.T, srv *actionbustest.Server, stream, filter string) []string {
	t.Helper()
	st, err := srv.JS.Stream(ctxT(t), stream)
	require.NoError(t, err)
	info, err := st.Info(ctxT(t), jetstream.WithSubjectFilter(filter))
	require.NoError(t, err)
	var out []string
	for s := range info.State.Subjects {
		out = append(out, s)
	}
	return out
}

// Every event of a run is stored under the same partition in each of the
// three run streams (requests, services' events, fired timers), which is
// what lets one dispatcher own the run; the runs spread over every
// partition; a schedule is stored as published.
func TestARunsEventsAreStoredUnderOnePartitionInEveryStream(t *testing.T) {
	const partitions = 4
	srv := actionbustest.NewServer(t, actionbustest.Options{Partitions: partitions})
	srv.ServeIngress(t)
	ctx := ctxT(t)
	topo := bus.Topology{}
	s := topo.Subjects()
	eb := newBus(t, srv, bus.ModeBinary, "")
	seen := map[string]bool{}
	for range 40 {
		runID := events.NewID()
		_, err := eb.Emit(ctx, events.TypeRunRequested, events.NewID(), events.DefaultTenant, runID, "", &events.RunRequested{RunID: runID})
		require.NoError(t, err)
		_, err = eb.Emit(ctx, events.TypeRunCanceled, events.NewID(), events.DefaultTenant, runID, "", &events.RunCanceled{RunID: runID, Reason: "operator"})
		require.NoError(t, err)
		m := &nats.Msg{Subject: s.Schedule(events.DefaultTenant, runID, "alarm"), Header: nats.Header{}, Data: []byte(`{}`)}
		m.Header.Set(bus.HeaderSchedule, "@at "+time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
		m.Header.Set(bus.HeaderScheduleTarget, s.Run(events.DefaultTenant, runID, events.TimerVerb))
		_, err = srv.JS.PublishMsg(ctx, m)
		require.NoError(t, err)

		req := storedSubjects(t, srv, topo.StreamRequests(), s.RunEvents(events.DefaultTenant, runID))
		svc := storedSubjects(t, srv, topo.StreamRuns(), s.RunEvents(events.DefaultTenant, runID))
		require.Len(t, req, 1)
		require.Len(t, svc, 1)
		partition := req[0][strings.LastIndexByte(req[0], '.')+1:]
		assert.Equal(t, s.Run(events.DefaultTenant, runID, "requested")+"."+partition, req[0])
		assert.Equal(t, s.Run(events.DefaultTenant, runID, "canceled")+"."+partition, svc[0], "the same partition in both streams")
		assert.Equal(t, s.Run(events.DefaultTenant, runID, "canceled"), s.Canonical(svc[0]))
		assert.Equal(t, partition, strconv.Itoa(bus.RunPartition(runID, partitions)), "the dispatcher computes the server's partition of a run")
		assert.Equal(t, []string{s.Schedule(events.DefaultTenant, runID, "alarm")},
			storedSubjects(t, srv, topo.StreamTimers(), s.RunEvents(events.DefaultTenant, runID)), "a schedule is stored as published")
		seen[partition] = true
	}
	assert.Len(t, seen, partitions, "forty runs spread over every partition: %v", seen)

	runs, err := srv.JS.Stream(ctx, topo.StreamRuns())
	require.NoError(t, err)
	n, err := bus.PartitionsOf(runs.CachedInfo().Config)
	require.NoError(t, err)
	assert.Equal(t, partitions, n, "the dispatchers read the count back from the stream")
}

func TestPartitionsOfRefusesAStreamThatStoresNone(t *testing.T) {
	_, err := bus.PartitionsOf(jetstream.StreamConfig{Name: "AB_RUNS"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "provision")
	n, err := bus.PartitionsOf(jetstream.StreamConfig{SubjectTransform: &jetstream.SubjectTransformConfig{Destination: "ab.run.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}.{{partition(12,2)}}"}})
	require.NoError(t, err)
	assert.Equal(t, 12, n)
	_, err = bus.PartitionsOf(jetstream.StreamConfig{SubjectTransform: &jetstream.SubjectTransformConfig{Destination: "x.{{partition(0,2)}}"}})
	assert.Error(t, err, "zero partitions")
}

// Provisioning again without naming a count keeps the partitions; naming
// fewer removes the consumers of the partitions that are gone.
func TestProvisionKeepsThePartitionsUnlessToldAndRemovesStaleConsumers(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{Partitions: 4})
	ctx := ctxT(t)
	require.NoError(t, bus.Topology{Pools: []string{"default", "gpu"}}.Provision(ctx, srv.JS))
	runs, err := srv.JS.Stream(ctx, "AB_RUNS")
	require.NoError(t, err)
	n, err := bus.PartitionsOf(runs.CachedInfo().Config)
	require.NoError(t, err)
	assert.Equal(t, 4, n, "adding a pool kept the partitions")
	_, err = srv.JS.Consumer(ctx, "AB_TIMERS", bus.PartitionConsumer(bus.ConsumerDispatcherTimers, 3))
	require.NoError(t, err)

	require.NoError(t, bus.Topology{Partitions: 2}.Provision(ctx, srv.JS))
	for _, stream := range []string{"AB_RUNS", "AB_TIMERS", "AB_REQUESTS"} {
		st, err := srv.JS.Stream(ctx, stream)
		require.NoError(t, err)
		var names []string
		for name := range st.ConsumerNames(ctx).Name() {
			if strings.HasPrefix(name, "dispatcher") {
				names = append(names, name)
			}
		}
		assert.Len(t, names, 2, "%s keeps the consumers of partitions 0 and 1: %v", stream, names)
	}
}
