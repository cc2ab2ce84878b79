package attack41_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/bus"
)

func registerEcho(ex *executor.Executor) error {
	return executor.Register(ex, executor.Action{Name: "inv.count", Description: "Count the inventory."},
		func(context.Context, struct{}, executor.Call) (executor.Result[string], error) {
			return executor.Result[string]{Output: "42"}, nil
		})
}

// TestAttack41_FewerPartitionsStrandNoStoredEvent: an operator lowers the
// partitions from 4 to 2 as docs/scaling.md says, with the dispatchers
// stopped ("drained"). Clients kept requesting runs meanwhile (the
// ingress is up; so would executors' results be stored for runs in
// flight): those events are stored under partitions 2 and 3.
// `provision --partitions 2` deletes the consumers of partitions 2 and 3
// (removeStaleDispatcherConsumers) with their events undelivered, and no
// consumer of the new layout matches a subject ending in .2 or .3: the
// runs never start, nothing says so. Safe: every stored run request is
// handled (or provision refuses while a removed consumer holds events).
func TestAttack41_FewerPartitionsStrandNoStoredEvent(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{Partitions: 4})
	srv.ServeIngress(t)
	rec := srv.Record(t, "")
	ctx := ctxFor(t, 60*time.Second)
	c, err := client.New(srv.Connect(t), client.Options{Prefix: srv.Prefix})
	require.NoError(t, err)

	const runs = 16
	ids := map[string]bool{}
	for range runs {
		id, err := c.Start(ctx, client.RunRequest{UserID: "ada", Action: &client.ActionCall{Name: "inv.count", Args: map[string]any{}}})
		require.NoError(t, err)
		ids[id] = true
	}
	topo := bus.Topology{Prefix: srv.Prefix}
	high := 0
	for p := 2; p < 4; p++ {
		high += srv.Stored(t, topo.StreamRequests(), topo.Subjects().InPartition("requested", p))
	}
	require.NotZero(t, high, "some requests are stored in partitions 2 and 3")

	err = bus.Topology{Prefix: srv.Prefix, Partitions: 2}.Provision(ctx, srv.JS)
	if err != nil {
		t.Logf("provision --partitions 2 refused: %v", err)
		return // refusing is safe
	}
	srv.StartStack(t, actionbustest.StackOptions{NoAuditor: true, NoPlanner: true, Register: registerEcho})
	ended := func(r actionbustest.Recorded) bool {
		return (r.Type() == events.TypeRunCompleted || r.Type() == events.TypeRunFailed) && ids[runIDOf(r)]
	}
	done := assert.Eventually(t, func() bool { return rec.Count(ended) == runs }, 15*time.Second, 50*time.Millisecond)
	if !done {
		t.Errorf("%d of %d runs ended; %d requests were stored in partitions 2 and 3, whose consumers provision removed", rec.Count(ended), runs, high)
		for _, name := range []string{bus.PartitionConsumer(bus.ConsumerDispatcherRequests, 2), bus.PartitionConsumer(bus.ConsumerDispatcherRequests, 3)} {
			_, err := srv.JS.Consumer(ctx, topo.StreamRequests(), name)
			t.Logf("consumer %s: %v", name, err)
		}
	}
}
