package artifacts_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/artifacts"
	"github.com/actionbus/actionbus/internal/bus"
)

func TestOwned(t *testing.T) {
	cases := []struct {
		meta   map[string]string
		tenant string
		ok     bool
	}{
		{map[string]string{"tenant": "acme"}, "acme", true},
		{map[string]string{"tenant": "default"}, "", true},
		{map[string]string{"tenant": "acme"}, "globex", false},
		{map[string]string{"tenant": ""}, "", false},
		{nil, "default", false},
		{map[string]string{"run": "r"}, "default", false},
	}
	for _, c := range cases {
		assert.Equal(t, c.ok, artifacts.Owned(c.meta, c.tenant), "%v as %q", c.meta, c.tenant)
	}
}

// Read is the one way a tenant reads an artifact: its own, by reference,
// from an artifact store. Another tenant's object, an object without an
// owner, a store that is no artifact store, a missing id: all the same
// artifact_not_found; changed bytes: artifact_mismatch.
func TestReadGivesATenantOnlyItsOwnArtifacts(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{Pools: []string{"default", "gpu"}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	topo := bus.Topology{}
	gpu, err := artifacts.Open(ctx, srv.JS, topo.PoolArtifacts("gpu"))
	require.NoError(t, err)
	ref, err := artifacts.Put(ctx, gpu, artifacts.Owner{Tenant: "acme", RunID: "r1"}, "out-1", "output", "text/plain", []byte("acme's report"), 4)
	require.NoError(t, err)
	assert.Equal(t, topo.PoolArtifacts("gpu"), ref.Store)
	assert.Equal(t, "acme", ref.Preview)
	assert.True(t, ref.Truncated)

	a, err := artifacts.Read(ctx, srv.JS, topo, "acme", ref)
	require.NoError(t, err)
	assert.Equal(t, "acme's report", string(a.Data))
	assert.Equal(t, "text/plain", a.MediaType)
	assert.Equal(t, "r1", a.RunID)

	// An owner-less object (as stored before objects recorded one).
	_, err = gpu.OS.PutBytes(ctx, "legacy", []byte("x"))
	require.NoError(t, err)
	// A bucket that is not an artifact store.
	_, err = srv.JS.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "secrets"})
	require.NoError(t, err)

	notFound := map[string]struct {
		tenant string
		ref    events.ArtifactRef
	}{
		"another tenant":            {"globex", ref},
		"the default tenant":        {"", ref},
		"an owner-less object":      {"default", events.ArtifactRef{ID: "legacy", Store: ref.Store}},
		"not an artifact store":     {"acme", events.ArtifactRef{ID: "out-1", Store: "secrets"}},
		"the runs bucket":           {"acme", events.ArtifactRef{ID: "out-1", Store: topo.BucketRuns()}},
		"another pool's store name": {"acme", events.ArtifactRef{ID: "out-1", Store: topo.PoolArtifacts("default")}},
		"a pool never provisioned":  {"acme", events.ArtifactRef{ID: "out-1", Store: topo.PoolArtifacts("nowhere")}},
		"a missing id":              {"acme", events.ArtifactRef{ID: "nope", Store: ref.Store}},
		"no id":                     {"acme", events.ArtifactRef{Store: ref.Store}},
	}
	for name, c := range notFound {
		t.Run(name, func(t *testing.T) {
			_, err := artifacts.Read(ctx, srv.JS, topo, c.tenant, c.ref)
			require.Error(t, err)
			assert.ErrorIs(t, err, actionbus.ErrArtifactNotFound)
			assert.NotContains(t, err.Error(), "acme's")
		})
	}

	_, err = gpu.OS.Put(ctx, jetstream.ObjectMeta{Name: "out-1", Metadata: map[string]string{"tenant": "acme", "run": "r1"}}, strings.NewReader("changed"))
	require.NoError(t, err)
	_, err = artifacts.Read(ctx, srv.JS, topo, "acme", ref)
	assert.Equal(t, actionbus.CodeArtifactMismatch, actionbus.CodeOf(err))

	byID, err := artifacts.ReadByID(ctx, srv.JS, topo, "acme", "out-1")
	require.NoError(t, err)
	assert.Equal(t, "changed", string(byID.Data))
	_, err = artifacts.ReadByID(ctx, srv.JS, topo, "globex", "out-1")
	assert.ErrorIs(t, err, actionbus.ErrArtifactNotFound)
}
