package actionstore_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/actions/actionstore"
	"github.com/actionbus/actionbus/internal/bus"
)

// TestCatalogEntriesAreBoundToTheirPool: entries live under
// "<pool>.<name>" (so NATS permissions confine an executor user to its
// pool's keys); an entry claiming another pool than its key's is ignored,
// and a name published by two pools is refused, never resolved in favour
// of either.
func TestCatalogEntriesAreBoundToTheirPool(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	kv, err := srv.JS.KeyValue(ctx, bus.Topology{}.BucketCatalog())
	require.NoError(t, err)
	cat := actionstore.NewCatalog(kv)
	schema := json.RawMessage(`{"type":"object"}`)
	def := func(name, pool string, mode actions.Mode) actions.Definition {
		d := actions.Definition{Name: name, Pool: pool, Mode: mode, InputSchema: schema, Version: "1"}
		require.NoError(t, d.Normalize())
		return d
	}
	require.NoError(t, cat.Publish(ctx, def("pay.refund", "payments", actions.ModeMutate), "ex-p"))
	require.NoError(t, cat.Publish(ctx, def("docs.get", "default", actions.ModeRead), "ex-d"))
	_, err = kv.Get(ctx, "payments.pay.refund")
	require.NoError(t, err, "the key carries the pool")

	// Another pool publishes the same name as a read: refused for both.
	require.NoError(t, cat.Publish(ctx, def("pay.refund", "default", actions.ModeRead), "ex-d"))
	_, err = cat.Get(ctx, "pay.refund")
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeCatalogConflict})
	// An entry under the default pool's key claiming another pool, with
	// the hash of its definition: refused, whatever its hash.
	evil := def("docs.evil", "payments", actions.ModeRead)
	forged, _ := json.Marshal(actions.Entry{Definition: evil, Hash: evil.Hash(), PublishedAt: time.Now().UTC(), PublishedBy: "x"})
	_, err = kv.Put(ctx, "default.docs.evil", forged)
	require.NoError(t, err)
	_, err = cat.Get(ctx, "docs.evil")
	assert.ErrorIs(t, err, actionbus.ErrInvalidRecord)

	view, err := cat.Watch(ctx)
	require.NoError(t, err)
	_, err = view.Get(ctx, "pay.refund")
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeCatalogConflict})
	got, err := view.Get(ctx, "docs.get")
	require.NoError(t, err)
	assert.Equal(t, "default", got.Pool)
	for _, list := range [][]actions.Entry{view.List(), must(cat.List(ctx))} {
		var names []string
		for _, e := range list {
			names = append(names, e.Name)
		}
		assert.Equal(t, []string{"docs.get"}, names, "conflicting and forged entries are listed nowhere")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
