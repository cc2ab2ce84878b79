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

// TestAFollowedViewReadsTheBucketWithoutAConsumer: a view that follows
// the catalog with direct gets loads what is stored, finds an action
// published after it started (Get reads before it reports one missing),
// lists what CatchUp read, drops deleted and purged keys and their skills —
// and the bucket's stream has no consumer at any point.
func TestAFollowedViewReadsTheBucketWithoutAConsumer(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	kv, err := srv.JS.KeyValue(ctx, bus.Topology{}.BucketCatalog())
	require.NoError(t, err)
	cat := actionstore.NewCatalog(kv)
	def := func(name string) actions.Definition {
		d := actions.Definition{Name: name, Pool: "default", Mode: actions.ModeRead, InputSchema: json.RawMessage(`{"type":"object"}`), Version: "1"}
		require.NoError(t, d.Normalize())
		return d
	}
	require.NoError(t, cat.Publish(ctx, def("docs.get"), "ex"))
	require.NoError(t, cat.Publish(ctx, def("docs.put"), "ex"))
	names := func(v *actionstore.View) []string {
		var out []string
		for _, e := range v.List() {
			out = append(out, e.Name)
		}
		return out
	}
	consumers := func() int {
		st, err := srv.JS.Stream(ctx, "KV_"+bus.Topology{}.BucketCatalog())
		require.NoError(t, err)
		info, err := st.Info(ctx)
		require.NoError(t, err)
		return info.State.Consumers
	}

	// An hour between reads: only Get and CatchUp read here.
	view, err := cat.Follow(ctx, srv.JS, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, []string{"docs.get", "docs.put"}, names(view), "loaded before Follow returns")

	require.NoError(t, cat.Publish(ctx, def("docs.new"), "ex"))
	got, err := view.Get(ctx, "docs.new")
	require.NoError(t, err, "a missing action is read before it is reported missing")
	assert.Equal(t, "docs.new", got.Name)
	_, err = view.Get(ctx, "docs.absent")
	assert.ErrorIs(t, err, actionbus.ErrActionNotFound)

	require.NoError(t, cat.Remove(ctx, "default", "docs.put"))
	require.NoError(t, kv.Purge(ctx, "default.docs.get"))
	_, err = kv.Put(ctx, "default."+actions.SkillKeyMarker+".s1", []byte(`{}`))
	require.NoError(t, err)
	view.CatchUp(ctx)
	assert.Equal(t, []string{"docs.new"}, names(view), "a deleted and a purged key are dropped")
	assert.True(t, view.HasSkills())
	require.NoError(t, kv.Delete(ctx, "default."+actions.SkillKeyMarker+".s1"))
	view.CatchUp(ctx)
	assert.False(t, view.HasSkills())
	assert.Zero(t, consumers(), "following creates no consumer")
}

// TestAFollowedViewReadsOnItsOwn: without CatchUp or a missed Get, the
// view reads what was published within its interval.
func TestAFollowedViewReadsOnItsOwn(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	kv, err := srv.JS.KeyValue(ctx, bus.Topology{}.BucketCatalog())
	require.NoError(t, err)
	cat := actionstore.NewCatalog(kv)
	view, err := cat.Follow(ctx, srv.JS, 20*time.Millisecond)
	require.NoError(t, err)
	assert.Empty(t, view.List())
	d := actions.Definition{Name: "docs.get", Pool: "default", Mode: actions.ModeRead, InputSchema: json.RawMessage(`{"type":"object"}`), Version: "1"}
	require.NoError(t, d.Normalize())
	require.NoError(t, cat.Publish(ctx, d, "ex"))
	assert.Eventually(t, func() bool { return len(view.List()) == 1 }, 5*time.Second, 10*time.Millisecond)
}
