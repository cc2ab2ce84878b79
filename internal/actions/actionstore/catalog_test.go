package actionstore_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
	srv, ctx, kv, cat := newCatalog(t)
	def := func(name string) actions.Definition { return readDef(t, name, "default") }
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
	srv, ctx, _, cat := newCatalog(t)
	view, err := cat.Follow(ctx, srv.JS, 20*time.Millisecond)
	require.NoError(t, err)
	assert.Empty(t, view.List())
	require.NoError(t, cat.Publish(ctx, readDef(t, "docs.get", "default"), "ex"))
	assert.Eventually(t, func() bool { return len(view.List()) == 1 }, 5*time.Second, 10*time.Millisecond)
}

// TestAFollowedViewTakesTheServersSequenceAndSubject: what the view reads
// is paged (more entries than one direct get asks for), and a stored
// message carrying Nats-Sequence or Nats-Subject headers of its own is
// read at the sequence and key the server stored it under — not read
// again for ever ("Nats-Sequence: 1"), not taken as another pool's
// entry.
func TestAFollowedViewTakesTheServersSequenceAndSubject(t *testing.T) {
	srv, ctx, _, cat := newCatalog(t)
	for i := range 300 {
		require.NoError(t, cat.Publish(ctx, readDef(t, fmt.Sprintf("docs.n%03d", i), "default"), "ex"))
	}
	// A valid entry of pool gpu for docs.n000, stored under another key:
	// read at its header's subject, it would make the name a conflict.
	gpu := readDef(t, "docs.n000", "gpu")
	forged, err := json.Marshal(actions.Entry{Definition: gpu, Hash: gpu.Hash(), PublishedAt: time.Now().UTC(), PublishedBy: "x"})
	require.NoError(t, err)
	for i, h := range []nats.Header{
		{"Nats-Sequence": {"1"}},
		{"Nats-Sequence": {"18446744073709551615"}},
		{"Nats-Subject": {"$KV.ab_catalog.gpu.docs.n000"}},
	} {
		_, err := srv.JS.PublishMsg(ctx, &nats.Msg{Subject: fmt.Sprintf("$KV.ab_catalog.evil.docs.forged%d", i), Data: forged, Header: h})
		require.NoError(t, err)
	}
	view, err := cat.Follow(ctx, srv.JS, time.Hour)
	require.NoError(t, err)
	assert.Len(t, view.List(), 300, "every page read, the forged entry refused")
	got, err := view.Get(ctx, "docs.n000")
	require.NoError(t, err)
	assert.Equal(t, "default", got.Pool, "no entry taken at a subject of its own header")

	require.NoError(t, cat.Publish(ctx, readDef(t, "docs.later", "default"), "ex"))
	_, err = view.Get(ctx, "docs.later")
	require.NoError(t, err, "the view reads on past the forged sequences")
}

// newCatalog returns an embedded server with the topology provisioned and
// a catalog over its bucket.
func newCatalog(t *testing.T) (*actionbustest.Server, context.Context, jetstream.KeyValue, *actionstore.Catalog) {
	t.Helper()
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	kv, err := srv.JS.KeyValue(ctx, bus.Topology{}.BucketCatalog())
	require.NoError(t, err)
	return srv, ctx, kv, actionstore.NewCatalog(kv)
}

// readDef is a normalized read action of pool.
func readDef(t *testing.T, name, pool string) actions.Definition {
	t.Helper()
	d := actions.Definition{Name: name, Pool: pool, Mode: actions.ModeRead, InputSchema: json.RawMessage(`{"type":"object"}`), Version: "1"}
	require.NoError(t, d.Normalize())
	return d
}
