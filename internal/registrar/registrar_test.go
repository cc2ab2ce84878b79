package registrar_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/actions/actionstore"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/registrar"
)

func TestDecide(t *testing.T) {
	cases := []struct {
		name    string
		pool    string
		owner   string
		holders []string
		ok      bool
	}{
		{"a fresh name", "a", "", nil, true},
		{"the owner re-announces", "a", "a", []string{"a"}, true},
		{"the owner, whatever entries say", "a", "a", []string{"a", "b"}, true},
		{"another pool owns it", "b", "a", []string{"a"}, false},
		{"another pool owns it, no entry left", "b", "a", nil, false},
		{"an entry from before owner records", "b", "", []string{"a"}, false},
		{"its own entry from before owner records", "a", "", []string{"a"}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := registrar.Decide(registrar.KindAction, "billing.refund", c.pool, c.owner, c.holders)
			if c.ok {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, actionbus.ErrCatalogConflict)
			var e *actionbus.Error
			require.ErrorAs(t, err, &e)
			assert.Contains(t, e.Message, c.pool)
			assert.Contains(t, e.Message, "a")
		})
	}
}

func def(name string, extra map[string]any) map[string]any {
	d := map[string]any{"name": name, "description": "d", "mode": "read", "tier": 0, "version": "1",
		"inputSchema": map[string]any{"type": "object"}}
	for k, v := range extra {
		d[k] = v
	}
	return d
}

func TestParseRefusesMalformedEntries(t *testing.T) {
	cases := []struct {
		name string
		ann  events.PoolAnnounced
		code actionbus.Code
	}{
		{"pool differs from the subject's", events.PoolAnnounced{Executor: "x", Pool: "b"}, actionbus.CodeSubjectMismatch},
		{"invalid name", events.PoolAnnounced{Executor: "x", Pool: "a", Actions: []map[string]any{def("has space", nil)}}, actionbus.CodeInvalidDefinition},
		{"entry of another pool", events.PoolAnnounced{Executor: "x", Pool: "a", Actions: []map[string]any{def("x.y", map[string]any{"pool": "b"})}}, actionbus.CodeInvalidDefinition},
		{"schema does not compile", events.PoolAnnounced{Executor: "x", Pool: "a", Actions: []map[string]any{def("x.y", map[string]any{"inputSchema": map[string]any{"type": 12}})}}, actionbus.CodeInvalidDefinition},
		{"unknown field", events.PoolAnnounced{Executor: "x", Pool: "a", Actions: []map[string]any{def("x.y", map[string]any{"owner": "a"})}}, actionbus.CodeInvalidDefinition},
		{"unknown mode", events.PoolAnnounced{Executor: "x", Pool: "a", Actions: []map[string]any{def("x.y", map[string]any{"mode": "destroy"})}}, actionbus.CodeInvalidDefinition},
		{"tier out of range", events.PoolAnnounced{Executor: "x", Pool: "a", Actions: []map[string]any{def("x.y", map[string]any{"tier": 9})}}, actionbus.CodeInvalidDefinition},
		{"reserved tenant", events.PoolAnnounced{Executor: "x", Pool: "a", Actions: []map[string]any{def("x.y", map[string]any{"tenants": []string{"a.b"}})}}, actionbus.CodeInvalidTenant},
		{"announced twice", events.PoolAnnounced{Executor: "x", Pool: "a", Actions: []map[string]any{def("x.y", nil), def("x.y", nil)}}, actionbus.CodeInvalidDefinition},
		{"removed and announced", events.PoolAnnounced{Executor: "x", Pool: "a", Actions: []map[string]any{def("x.y", nil)}, Removed: []string{"x.y"}}, actionbus.CodeInvalidDefinition},
		{"removed name invalid", events.PoolAnnounced{Executor: "x", Pool: "a", Removed: []string{"*"}}, actionbus.CodeInvalidDefinition},
		{"invalid skill", events.PoolAnnounced{Executor: "x", Pool: "a", Skills: []map[string]any{{"name": "UPPER", "description": "d"}}}, actionbus.CodeInvalidSkill},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := registrar.Parse("a", &c.ann)
			require.Error(t, err)
			assert.Equal(t, c.code, actionbus.CodeOf(err), "%v", err)
		})
	}
	ok, err := registrar.Parse("a", &events.PoolAnnounced{Executor: "x", Pool: "a", Actions: []map[string]any{def("x.y", map[string]any{"pool": "a"})}})
	require.NoError(t, err)
	require.Len(t, ok.Actions, 1)
	assert.Equal(t, "a", ok.Actions[0].Pool)
	assert.Equal(t, "fallback", ok.Actions[0].Permission.Source, "the permission is derived by the registrar, not taken from the announcement")
}

func FuzzParse(f *testing.F) {
	f.Add(`{"executor":"x","pool":"a","actions":[{"name":"x.y","mode":"read","inputSchema":{"type":"object"}}]}`)
	f.Add(`{"executor":"x","pool":"a","skills":[{"name":"s","description":"d","tools":[{"name":"t"}]}],"removed":["q"]}`)
	f.Add(`{"executor":"x","pool":"a","actions":[{"name":"x.y","mode":"read"},{"name":"z","mode":"read","planner":{"aliases":["x__y"]}}]}`)
	f.Fuzz(func(t *testing.T, doc string) {
		var a events.PoolAnnounced
		if json.Unmarshal([]byte(doc), &a) != nil {
			return
		}
		ann, err := registrar.Parse("a", &a)
		if err != nil {
			if actionbus.CodeOf(err) == actionbus.CodeInternal {
				t.Fatalf("untyped refusal: %v", err)
			}
			return
		}
		claimed := map[string]bool{}
		for _, d := range ann.Actions {
			if d.Pool != "a" || !actions.ValidName(d.Name) {
				t.Fatalf("accepted %+v", d)
			}
			for _, c := range registrar.Claims(d) {
				if claimed[c] {
					t.Fatalf("accepted two entries called %q by the planner", c)
				}
				claimed[c] = true
			}
		}
		for _, s := range ann.Skills {
			if s.Pool != "a" {
				t.Fatalf("accepted skill of pool %q", s.Pool)
			}
		}
	})
}

// TestARegistrarRefusesConflicts: a pool re-announcing its action updates
// it; another pool announcing the same name is refused with
// catalog_conflict naming both pools and changes nothing; a malformed
// announcement records nothing; a name its owner removed is free again.
func TestARegistrarRefusesConflicts(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{Pools: []string{"default", "payments"}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topo := bus.Topology{}
	eb, err := bus.Open(srv.Conn, bus.BusConfig{Source: "/actionbus/dispatcher/test"})
	require.NoError(t, err)
	catKV, err := srv.JS.KeyValue(ctx, topo.BucketCatalog())
	require.NoError(t, err)
	owners, err := srv.JS.KeyValue(ctx, topo.BucketCatalogOwners())
	require.NoError(t, err)
	reg := registrar.New(eb, catKV, owners, nil)
	cat := actionstore.NewCatalog(catKV)

	announce := func(pool string, defs ...map[string]any) events.AnnounceReply {
		return reg.Register(ctx, pool, &events.PoolAnnounced{Executor: pool + "-1", Pool: pool, Actions: defs})
	}
	r := announce("payments", def("billing.refund", map[string]any{"mode": "mutate", "tier": 2}))
	require.Nil(t, r.Error)
	assert.Equal(t, []string{"billing.refund"}, r.Actions)

	t.Run("the same pool re-announces: updated", func(t *testing.T) {
		r := announce("payments", def("billing.refund", map[string]any{"mode": "mutate", "tier": 2, "version": "2", "description": "v2"}))
		require.Nil(t, r.Error)
		e, err := cat.Get(ctx, "billing.refund")
		require.NoError(t, err)
		assert.Equal(t, "v2", e.Description)
		assert.Equal(t, "payments", e.Pool)
	})
	t.Run("another pool, same name: catalog_conflict", func(t *testing.T) {
		r := announce("default", def("billing.refund", nil), def("default.fine", nil))
		require.NotNil(t, r.Error)
		assert.Equal(t, actionbus.CodeCatalogConflict, r.Error.Code)
		assert.Contains(t, r.Error.Message, "payments")
		assert.Contains(t, r.Error.Message, "default")
		e, err := cat.Get(ctx, "billing.refund")
		require.NoError(t, err, "the owner's entry still resolves")
		assert.Equal(t, "payments", e.Pool)
		assert.Equal(t, actions.ModeMutate, e.Mode)
		_, err = cat.Get(ctx, "default.fine")
		assert.ErrorIs(t, err, actionbus.ErrActionNotFound, "nothing of a refused announcement is recorded")
	})
	t.Run("another pool cannot remove it", func(t *testing.T) {
		r := reg.Register(ctx, "default", &events.PoolAnnounced{Executor: "d", Pool: "default", Removed: []string{"billing.refund"}})
		require.Nil(t, r.Error)
		e, err := cat.Get(ctx, "billing.refund")
		require.NoError(t, err)
		assert.Equal(t, "payments", e.Pool)
	})
	t.Run("names it never published: removed without a write", func(t *testing.T) {
		// A delete stores a marker every reader of the catalog reads: an
		// executor naming junk to remove must not grow the catalog.
		lastSeq := func() uint64 {
			st, err := srv.JS.Stream(ctx, "KV_"+topo.BucketCatalog())
			require.NoError(t, err)
			return st.CachedInfo().State.LastSeq
		}
		before := lastSeq()
		junk := make([]string, registrar.MaxPoolActions)
		for i := range junk {
			junk[i] = fmt.Sprintf("junk.n%d", i)
		}
		r := reg.Register(ctx, "default", &events.PoolAnnounced{Executor: "d", Pool: "default", Removed: junk})
		require.Nil(t, r.Error)
		assert.Equal(t, before, lastSeq(), "nothing stored for names the pool never published")
		r = reg.Register(ctx, "default", &events.PoolAnnounced{Executor: "d", Pool: "default", Removed: append(junk, "junk.more")})
		require.NotNil(t, r.Error)
		assert.Equal(t, actionbus.CodeCatalogLimit, r.Error.Code, "more removals than a pool may hold actions")
	})
	t.Run("a malformed entry: refused, nothing recorded", func(t *testing.T) {
		r := announce("default", def("ok.one", nil), def("bad.one", map[string]any{"inputSchema": map[string]any{"type": 12}}))
		require.NotNil(t, r.Error)
		assert.Equal(t, actionbus.CodeInvalidDefinition, r.Error.Code)
		_, err := cat.Get(ctx, "ok.one")
		assert.ErrorIs(t, err, actionbus.ErrActionNotFound)
	})
	t.Run("removed by its owner, the name is free", func(t *testing.T) {
		r := reg.Register(ctx, "payments", &events.PoolAnnounced{Executor: "p", Pool: "payments", Removed: []string{"billing.refund"}})
		require.Nil(t, r.Error)
		_, err := cat.Get(ctx, "billing.refund")
		assert.ErrorIs(t, err, actionbus.ErrActionNotFound)
		r = announce("default", def("billing.refund", nil))
		require.Nil(t, r.Error)
	})
}
