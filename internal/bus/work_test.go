package bus_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// fanOut is the work items of one ten-wide plan of a run.
func fanOut(runID string, n int) []events.Emission {
	out := make([]events.Emission, n)
	for i := range out {
		callID := events.DerivedID(runID, "call", 1, i, 1)
		out[i] = events.Emission{Type: events.TypeActionRequested, ID: callID, Tenant: events.DefaultTenant, RunID: runID, Pool: bus.DefaultPool,
			Data: &events.ActionRequested{RunID: runID, CallID: callID, Cycle: 1, PlanIndex: i, Attempt: 1, Action: "test.echo",
				Args: map[string]any{"i": i}, Origin: events.OriginHost}}
	}
	return out
}

// ownBus is a bus on a connection of its own, whose counters tell what
// the server sent it.
func ownBus(t *testing.T, srv *actionbustest.Server) (*bus.Bus, *nats.Conn) {
	t.Helper()
	nc, err := nats.Connect(srv.URL)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	eb, err := bus.NewBus(js, bus.BusConfig{Source: "/actionbus/test"})
	require.NoError(t, err)
	return eb, nc
}

// storedWork returns the ids of the work items stored on the default
// pool, in stored order.
func storedWork(t *testing.T, srv *actionbustest.Server, eb *bus.Bus) []string {
	t.Helper()
	ctx := ctxT(t)
	c, err := srv.JS.OrderedConsumer(ctx, bus.Topology{}.StreamWork(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{eb.Subjects().PoolRequest(bus.DefaultPool)}})
	require.NoError(t, err)
	info, err := c.Info(ctx)
	require.NoError(t, err)
	var ids []string
	for range info.NumPending {
		m, err := c.Next(jetstream.FetchMaxWait(5e9))
		require.NoError(t, err)
		ids = append(ids, m.Headers().Get(jetstream.MsgIDHeader))
	}
	return ids
}

func ids(batch []events.Emission) []string {
	out := make([]string, len(batch))
	for i, e := range batch {
		out[i] = e.ID
	}
	return out
}

func TestAFanOutsWorkItemsAreStoredAsOneBatchAcknowledgedOnce(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	eb, nc := ownBus(t, srv)
	batch := fanOut(events.NewID(), 10)

	before := nc.Stats()
	require.NoError(t, eb.EmitAll(ctxT(t), batch))
	after := nc.Stats()

	assert.Equal(t, before.OutMsgs+10, after.OutMsgs, "ten items sent")
	assert.Equal(t, before.InMsgs+1, after.InMsgs, "one acknowledgement for the batch, where each item had its own")
	assert.Equal(t, ids(batch), storedWork(t, srv, eb), "each item stored once, in plan order")
}

func TestWorkItemsPublishedAgainAreStoredOnce(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	eb, _ := ownBus(t, srv)
	ctx := ctxT(t)
	batch := fanOut(events.NewID(), 10)

	// Three went out before a crash; the outbox is published again whole
	// (the server refuses a batch holding a stored id, and the items go
	// one by one, each deduplicated).
	require.NoError(t, eb.EmitAll(ctx, batch[:3]))
	require.NoError(t, eb.EmitAll(ctx, fanOut(batch[0].RunID, 10)))
	// And again, all stored already.
	require.NoError(t, eb.EmitAll(ctx, fanOut(batch[0].RunID, 10)))

	assert.Equal(t, ids(batch), storedWork(t, srv, eb))
}

func TestWorkItemsReachAStreamProvisionedWithoutAtomicPublish(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	eb, nc := ownBus(t, srv)
	ctx := ctxT(t)
	stream, err := srv.JS.Stream(ctx, bus.Topology{}.StreamWork())
	require.NoError(t, err)
	cfg := stream.CachedInfo().Config
	require.True(t, cfg.AllowAtomicPublish, "provisioned with it")
	cfg.AllowAtomicPublish = false // as a deployment provisioned before it
	_, err = srv.JS.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	batch := fanOut(events.NewID(), 4)

	before := nc.Stats()
	require.NoError(t, eb.EmitAll(ctx, batch))
	after := nc.Stats()

	assert.Equal(t, ids(batch), storedWork(t, srv, eb))
	assert.Equal(t, before.InMsgs+5, after.InMsgs, "the refused batch's answer, then one acknowledgement per item")
}
