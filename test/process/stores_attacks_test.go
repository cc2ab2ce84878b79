package process

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/artifacts"
	"github.com/actionbus/actionbus/internal/bus"
)

// storedCount is the number of messages a stream holds (read as admin).
func storedCount(t *testing.T, ctx context.Context, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	return info.State.Msgs
}

// rollup is a publish that asks the server to wipe every other message of
// the stream (the header a key-value purge uses, with "all").
func rollup(subject string) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header.Set("Nats-Rollup", "all")
	m.Data = []byte(`{"wiped":true}`)
	return m
}

// announcement is a pool.announced request as an executor user can craft
// it, on pool's announce subject.
func announcement(t *testing.T, pool string, defs ...map[string]any) *nats.Msg {
	t.Helper()
	e := event.New()
	e.SetID(events.NewID())
	e.SetType(events.TypePoolAnnounced)
	e.SetSource("/mallory")
	e.SetExtension(events.ExtPool, pool)
	require.NoError(t, events.SetData(&e, events.ContentTypeJSON, events.PoolAnnounced{Executor: "mallory", Pool: pool, Actions: defs}))
	msg, err := bus.Encode(events.MustSubjects("ab").Announce(pool), &e, bus.ModeBinary)
	require.NoError(t, err)
	return msg
}

// Security finding 1 of issue 37: the executor user could publish with
// `Nats-Rollup: all` into the catalog, idempotency and artifact stores of
// every pool (catalog 8 → 1 messages), then publish another pool's action
// under its own pool with mode read and tier 0. Now, as the deployed
// executor user against the real services: every such rollup is refused
// (no permission on shared and other pools' stores; the stream refuses it
// on its own idempotency bucket) and no other pool's stored count moves;
// an announcement of another pool's action is refused with
// catalog_conflict naming both pools, and the action still runs on its
// pool. The planner cannot roll up the dispatchers' limits.
func TestAnExecutorCannotWipeTheStoresOrTakeOverAnotherPoolsAction(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts service processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv := actionbustest.NewServer(t, actionbustest.Options{Users: true, Pools: []string{"default", "payments"}})
	url, adminJS := srv.UserURL, srv.JS
	bin := buildServices(t)
	dir := t.TempDir()
	startService(t, filepath.Join(bin, "dispatcher"), url("dispatcher"))
	startService(t, filepath.Join(bin, "planner"), url("planner"))
	testExec := buildTestExecutor(t)
	startTestExecutor(t, testExec, url("executor"), dir, "ex-default")
	// The victim pool's executor (the shipped config has no
	// executor-payments user; it connects as admin).
	startTestExecutor(t, testExec, url("admin"), t.TempDir(), "ex-payments", "POOL=payments")

	clientNC, _ := connectAs(t, url("client"), "_INBOX_default")
	c, err := client.New(clientNC, client.Options{})
	require.NoError(t, err)
	waitCatalog(t, ctx, c, "test.secret")
	waitCatalog(t, ctx, c, "billing.lookup")

	// What the other pool, the services and the tenants keep in the
	// stores.
	topo := bus.Topology{}
	payIdem, err := adminJS.KeyValue(ctx, topo.BucketIdempotency("payments"))
	require.NoError(t, err)
	_, err = payIdem.Put(ctx, "payments.default.k1", []byte(`{"state":"done"}`))
	require.NoError(t, err)
	ownIdem, err := adminJS.KeyValue(ctx, topo.BucketIdempotency("default"))
	require.NoError(t, err)
	_, err = ownIdem.Put(ctx, "default.default.k1", []byte(`{"state":"done"}`))
	require.NoError(t, err)
	for _, store := range []string{topo.PoolArtifacts("payments"), topo.BucketArtifacts()} {
		st, err := artifacts.Open(ctx, adminJS, store)
		require.NoError(t, err)
		_, err = artifacts.Put(ctx, st, artifacts.Owner{Tenant: "globex", RunID: "r1"}, "a1", "output", "text/plain", []byte("globex's"), 0)
		require.NoError(t, err)
	}
	limitsKV, err := adminJS.KeyValue(ctx, topo.BucketLimits())
	require.NoError(t, err)
	_, err = limitsKV.Put(ctx, "tenant.acme", []byte(`{"holders":[]}`))
	require.NoError(t, err)
	streams := []string{"KV_ab_catalog", "KV_ab_catalog_owners", "KV_" + topo.BucketIdempotency("payments"), "KV_" + topo.BucketIdempotency("default"),
		"KV_" + topo.BucketPresence("payments"), "OBJ_" + topo.PoolArtifacts("payments"), "OBJ_" + topo.BucketArtifacts(), "KV_ab_limits"}
	before := map[string]uint64{}
	for _, s := range streams {
		before[s] = storedCount(t, ctx, adminJS, s)
		require.NotZero(t, before[s], "%s holds something to wipe", s)
	}

	executorNC, executorRefused := connectAs(t, url("executor"), "_INBOX_executor")
	executorJS, err := jetstream.New(executorNC)
	require.NoError(t, err)
	short := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		t.Cleanup(cancel)
		return c
	}

	t.Run("rollups of the shared and other pools' stores are refused", func(t *testing.T) {
		for _, subject := range []string{
			"$KV.ab_catalog.default.x",
			"$KV.ab_catalog_owners.action.billing.lookup",
			"$KV." + topo.BucketIdempotency("payments") + ".payments.x",
			"$KV.ab_idempotency.default.x", // the shared bucket of before
			"$KV.ab_presence.default.x",
			"$KV." + topo.BucketPresence("payments") + ".payments.x",
			"$O.ab_artifacts.M.x",
			"$O." + topo.PoolArtifacts("payments") + ".M.x",
		} {
			_, err := executorJS.PublishMsg(short(), rollup(subject))
			assert.Error(t, err, "a rollup on %s was accepted", subject)
			executorRefused.waitFor(t, `Permissions Violation for Publish to "`+subject+`"`)
		}
	})
	t.Run("its own idempotency bucket refuses a rollup", func(t *testing.T) {
		_, err := executorJS.PublishMsg(short(), rollup("$KV."+topo.BucketIdempotency("default")+".default.x"))
		require.Error(t, err)
		assert.Contains(t, strings.ToLower(err.Error()), "rollup")
	})
	t.Run("no other pool's, nor the services', stored counts moved", func(t *testing.T) {
		for _, s := range streams {
			assert.Equal(t, before[s], storedCount(t, ctx, adminJS, s), "%s changed", s)
		}
		for _, store := range []string{topo.PoolArtifacts("payments"), topo.BucketArtifacts()} {
			a, err := artifacts.Read(ctx, adminJS, topo, "globex", events.ArtifactRef{ID: "a1", Store: store})
			require.NoError(t, err, "globex's artifact in %s", store)
			assert.Equal(t, "globex's", string(a.Data))
		}
		_, err := payIdem.Get(ctx, "payments.default.k1")
		assert.NoError(t, err, "the other pool's idempotency record is gone")
	})
	t.Run("announcing another pool's action is refused with catalog_conflict", func(t *testing.T) {
		reply, err := executorNC.RequestMsg(announcement(t, "default", map[string]any{"name": "billing.lookup", "description": "mine now",
			"mode": "read", "tier": 0, "version": "1", "inputSchema": map[string]any{"type": "object"}}), 10*time.Second)
		require.NoError(t, err)
		var r events.AnnounceReply
		require.NoError(t, json.Unmarshal(reply.Data, &r))
		require.NotNil(t, r.Error, "the registrar recorded another pool's action")
		assert.Equal(t, actionbus.CodeCatalogConflict, r.Error.Code)
		assert.Contains(t, r.Error.Message, "payments")
		assert.Contains(t, r.Error.Message, "default")
		// Nor may it announce on the other pool's subject.
		_, err = executorNC.RequestMsg(announcement(t, "payments"), time.Second)
		assert.Error(t, err)
		executorRefused.waitFor(t, `Permissions Violation for Publish to "ab.pool.payments.announce"`)

		res, err := c.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "billing.lookup", Args: map[string]any{}}}, nil)
		require.NoError(t, err)
		require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
		assert.Equal(t, map[string]any{"servedBy": "payments"}, res.Output, "the action no longer runs on its own pool")
	})
	t.Run("the planner cannot roll up the dispatchers' limits", func(t *testing.T) {
		plannerNC, plannerRefused := connectAs(t, url("planner"), "_INBOX_planner")
		plannerJS, err := jetstream.New(plannerNC)
		require.NoError(t, err)
		_, err = plannerJS.PublishMsg(short(), rollup("$KV.ab_limits.tenant.acme"))
		assert.Error(t, err)
		plannerRefused.waitFor(t, `Permissions Violation for Publish to "$KV.ab_limits.tenant.acme"`)
		assert.Equal(t, before["KV_ab_limits"], storedCount(t, ctx, adminJS, "KV_ab_limits"))
		_, err = limitsKV.Get(ctx, "tenant.acme")
		assert.NoError(t, err)
	})
}
