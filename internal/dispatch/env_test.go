package dispatch

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/artifacts"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/embedded"
	"github.com/actionbus/actionbus/internal/run"
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
	topo := bus.Topology{}
	require.NoError(t, topo.Provision(ctx, js))
	store, err := js.ObjectStore(ctx, topo.BucketArtifacts())
	require.NoError(t, err)
	e := env{&Dispatcher{js: js, topo: topo, artifacts: artifacts.Store{Name: topo.BucketArtifacts(), OS: store}}}

	data := []byte(`{"amount":10}`)
	ref := events.NewArtifactRef(topo.BucketArtifacts(), "out-1", "output", "application/json", data, 0)
	require.NoError(t, e.PutArtifact(ctx, &run.ArtifactWrite{Tenant: "acme", RunID: "run-1", Ref: ref, Data: data}))
	got, err := e.GetArtifact(ctx, "acme", ref)
	require.NoError(t, err)
	assert.JSONEq(t, `{"amount":10}`, string(got))

	// another writer, recording the same owner
	_, err = store.Put(ctx, jetstream.ObjectMeta{Name: "out-1", Metadata: map[string]string{artifacts.MetaTenant: "acme", artifacts.MetaRun: "run-1"}},
		strings.NewReader(`{"amount":10000}`))
	require.NoError(t, err)
	_, err = e.GetArtifact(ctx, "acme", ref)
	require.Error(t, err)
	assert.Equal(t, actionbus.CodeArtifactMismatch, actionbus.CodeOf(err))
}
