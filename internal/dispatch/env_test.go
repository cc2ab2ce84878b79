package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/embedded"
	"github.com/actionbus/actionbus/internal/events"
)

// TestAStepOutputChangedInTheArtifactStoreIsRefused: the dispatcher keeps
// large step outputs as artifacts, which executors may also write. One
// overwritten after the dispatcher stored it (to change a later step's
// input) no longer matches the digest run state recorded, and is refused.
func TestAStepOutputChangedInTheArtifactStoreIsRefused(t *testing.T) {
	ns, err := embedded.Start(embedded.Options{Port: -1, StoreDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	nc, err := nats.Connect(ns.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topo := events.Topology{}
	require.NoError(t, topo.Provision(ctx, js))
	store, err := js.ObjectStore(ctx, topo.BucketArtifacts())
	require.NoError(t, err)
	e := env{&Dispatcher{artifacts: store}}

	ref, err := e.PutArtifact(ctx, "default", "out-1", []byte(`{"amount":10}`))
	require.NoError(t, err)
	got, err := e.GetArtifact(ctx, ref)
	require.NoError(t, err)
	assert.JSONEq(t, `{"amount":10}`, string(got))

	_, err = store.PutBytes(ctx, "out-1", []byte(`{"amount":10000}`)) // another writer
	require.NoError(t, err)
	_, err = e.GetArtifact(ctx, ref)
	require.Error(t, err)
	assert.Equal(t, actionbus.CodeArtifactMismatch, actionbus.CodeOf(err))
}
