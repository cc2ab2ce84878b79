package registrar_test

import (
	"context"
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
	"github.com/actionbus/actionbus/internal/skills"
)

func TestClaims(t *testing.T) {
	cases := []struct {
		name    string
		action  string
		aliases []string
		want    []string
	}{
		{"a plain name", "web_search", nil, []string{"web_search"}},
		{"dots become the tool name's __", "github.create_issue", nil, []string{"github__create_issue"}},
		{"an alias, in tool-name form", "web_search", []string{"search", "find.web"}, []string{"web_search", "search", "find__web"}},
		{"an alias equal to the tool name is one claim", "github.create_issue", []string{"github__create_issue", "gh.issue", "gh__issue"}, []string{"github__create_issue", "gh__issue"}},
		{"a long name is the planner's hashed form", "x.abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmnop", nil,
			[]string{actions.ToolName("x.abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijklmnop")}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := actions.Definition{Name: c.action}
			if c.aliases != nil {
				d.Planner = &actions.PlannerMeta{Aliases: c.aliases}
			}
			got := registrar.Claims(d)
			assert.Equal(t, c.want, got)
			for _, n := range got {
				assert.Regexp(t, `^[A-Za-z0-9_-]{1,64}$`, n)
			}
		})
	}
}

// TestDecideToolNames: the names a planner calls an action by are owned
// like action names: another pool's claim is catalog_conflict naming both
// pools, whatever the name as written.
func TestDecideToolNames(t *testing.T) {
	cases := []struct {
		name, pool, owner string
		holders           []string
		ok                bool
	}{
		{"the tool name of another pool's action", "evil", "default", []string{"default"}, false},
		{"another pool's alias", "evil", "default", nil, false},
		{"a name nobody calls", "evil", "", nil, true},
		{"its own alias again", "default", "default", nil, true},
		{"the tool name of another pool's entry from before tool claims", "evil", "", []string{"default"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := registrar.Decide(registrar.KindTool, "github__create_issue", c.pool, c.owner, c.holders)
			if c.ok {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, actionbus.ErrCatalogConflict)
			var e *actionbus.Error
			require.ErrorAs(t, err, &e)
			assert.Contains(t, e.Message, "pool default")
			assert.Contains(t, e.Message, "pool evil")
		})
	}
}

func TestBounds(t *testing.T) {
	names := func(prefix string, n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("%s%d", prefix, i)
		}
		return out
	}
	ann := func(acts, skills []string, removed ...string) *registrar.Announcement {
		a := &registrar.Announcement{Removed: removed}
		for _, n := range acts {
			a.Actions = append(a.Actions, actions.Definition{Name: n})
		}
		for _, n := range skills {
			a.Skills = append(a.Skills, skillNamed(n))
		}
		return a
	}
	cases := []struct {
		name  string
		err   error
		limit string
	}{
		{"size at the bound", registrar.CheckSize("p", registrar.MaxAnnouncementBytes), ""},
		{"size over it", registrar.CheckSize("p", registrar.MaxAnnouncementBytes+1), "announcement_bytes"},
		{"counts at the bounds", registrar.CheckCounts("p", registrar.MaxPoolActions, registrar.MaxPoolSkills), ""},
		{"too many actions", registrar.CheckCounts("p", registrar.MaxPoolActions+1, 0), "pool_actions"},
		{"too many skills", registrar.CheckCounts("p", 0, registrar.MaxPoolSkills+1), "pool_skills"},
		{"re-announcing what the pool holds", registrar.CheckPoolTotals("p", names("a", registrar.MaxPoolActions), names("s", registrar.MaxPoolSkills),
			ann(names("a", registrar.MaxPoolActions), names("s", registrar.MaxPoolSkills))), ""},
		{"one more action than the pool may hold", registrar.CheckPoolTotals("p", names("a", registrar.MaxPoolActions), nil, ann([]string{"new"}, nil)), "pool_actions"},
		{"one more, one removed", registrar.CheckPoolTotals("p", names("a", registrar.MaxPoolActions), nil, ann([]string{"new"}, nil, "a0")), ""},
		{"one more skill than the pool may hold", registrar.CheckPoolTotals("p", nil, names("s", registrar.MaxPoolSkills), ann(nil, []string{"new"})), "pool_skills"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.limit == "" {
				assert.NoError(t, c.err)
				return
			}
			require.ErrorIs(t, c.err, actionbus.ErrCatalogLimit)
			var e *actionbus.Error
			require.ErrorAs(t, c.err, &e)
			assert.Equal(t, c.limit, e.Details["limit"])
		})
	}
}

// TestARegistrarRefusesNamesThatCollideForThePlanner: a pool cannot
// record an action whose tool name, or an alias, is a name the planner
// calls another pool's action by; names released by their owner are free
// again; an announcement over a bound records nothing.
func TestARegistrarRefusesNamesThatCollideForThePlanner(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{Pools: []string{"default", "evil"}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
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
	aliased := func(name string, aliases ...string) map[string]any {
		return def(name, map[string]any{"planner": map[string]any{"aliases": aliases}})
	}
	require.Nil(t, announce("default", def("github.create_issue", nil), aliased("web_search", "search")).Error)

	for _, c := range []struct {
		name string
		defs []map[string]any
	}{
		{"the tool name of another pool's action", []map[string]any{def("github__create_issue", nil)}},
		{"another pool's alias", []map[string]any{aliased("zz_search", "search")}},
		{"another pool's action name as an alias", []map[string]any{aliased("zz_issue", "github.create_issue")}},
		{"another pool's tool name as an alias", []map[string]any{aliased("zz_issue", "github__create_issue")}},
		{"another pool's alias as an action name", []map[string]any{def("search", nil)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := announce("evil", append(c.defs, def("evil.fine", nil))...)
			require.NotNil(t, r.Error)
			assert.Equal(t, actionbus.CodeCatalogConflict, r.Error.Code)
			assert.Contains(t, r.Error.Message, "pool default")
			assert.Contains(t, r.Error.Message, "pool evil")
			_, err := cat.Get(ctx, "evil.fine")
			assert.ErrorIs(t, err, actionbus.ErrActionNotFound, "nothing of a refused announcement is recorded")
		})
	}
	t.Run("one announcement, two entries of one planner name", func(t *testing.T) {
		r := announce("evil", def("a.b", nil), def("a__b", nil))
		require.NotNil(t, r.Error)
		assert.Equal(t, actionbus.CodeInvalidDefinition, r.Error.Code)
	})
	t.Run("the owner re-announces", func(t *testing.T) {
		require.Nil(t, announce("default", def("github.create_issue", nil), aliased("web_search", "search")).Error)
	})
	t.Run("released by their owner, the names are free", func(t *testing.T) {
		r := reg.Register(ctx, "default", &events.PoolAnnounced{Executor: "d", Pool: "default", Removed: []string{"github.create_issue", "web_search"}})
		require.Nil(t, r.Error)
		r = announce("evil", def("github__create_issue", nil), aliased("zz_search", "search"))
		require.Nil(t, r.Error, "%+v", r.Error)
	})
	t.Run("a pool's actions are bounded", func(t *testing.T) {
		var defs []map[string]any
		for i := 0; i < registrar.MaxPoolActions-2; i++ { // evil holds 2
			defs = append(defs, def(fmt.Sprintf("evil.a%03d", i), nil))
		}
		require.Nil(t, announce("evil", defs...).Error)
		r := announce("evil", def("evil.one_more", nil))
		require.NotNil(t, r.Error)
		assert.Equal(t, actionbus.CodeCatalogLimit, r.Error.Code)
		assert.Equal(t, "pool_actions", r.Error.Details["limit"])
		_, err := cat.Get(ctx, "evil.one_more")
		assert.ErrorIs(t, err, actionbus.ErrActionNotFound)
	})
}

func skillNamed(n string) skills.Skill { return skills.Skill{Name: n} }
