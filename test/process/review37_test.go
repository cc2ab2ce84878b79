package process

// Attack review 37 (branch i37-attack): tenancy as NATS accounts, the read
// service, the registrar. Each test asserts the secure behaviour: a test
// that fails is an attack that succeeds.

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/accounts"
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/limits"
	"github.com/actionbus/actionbus/internal/readapi"
)

// r37Echo registers an echo action on a stack's executors.
func r37Echo(ex *executor.Executor) error {
	return executor.Register(ex, executor.Action{Name: "r37.echo"},
		func(_ context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
			return executor.Result[map[string]any]{Output: in}, nil
		})
}

// A retry names the run it retries by id, and run ids are not namespaced:
// the dispatcher loads the named run whatever its tenant and checks its
// status before its tenant. A tenant that retries another tenant's
// completed (or still running) run is told "run X is completed; only a
// failed or canceled run is retried", where a run that does not exist, or
// is another tenant's, should get one answer: "no run X to retry". Run ids
// leak (TestReview37PublishAnswersLeakOtherTenantsRuns), and this tells
// acme whether each one is a live run and how it stands.
func TestReview37ARetryTellsAnotherTenantsRunsStatus(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a nats-server and the services")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := deployed(t, "acme", "globex")
	srv.StartStack(t, actionbustest.StackOptions{Register: r37Echo})
	globex, err := client.New(srv.TenantConnect(t, "client-globex", "globex"), client.Options{Tenant: "globex"})
	require.NoError(t, err)
	acme, err := client.New(srv.TenantConnect(t, "client-acme", "acme"), client.Options{Tenant: "acme"})
	require.NoError(t, err)
	waitCatalog(t, ctx, acme, "r37.echo")

	done, err := globex.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "r37.echo", Args: map[string]any{"x": 1}}, UserID: "u"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, done.Status, "%+v", done.Error)

	retry := func(of string) string {
		res, err := acme.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "r37.echo", Args: map[string]any{"x": 1}}, UserID: "u", RetryOf: of}, nil)
		require.NoError(t, err)
		require.Equal(t, client.StatusFailed, res.Status, "acme's retry of %s", of)
		return string(res.Error.Code) + ": " + strings.ReplaceAll(res.Error.Message, of, "RUN")
	}
	foreign := retry(done.RunID)
	missing := retry(events.NewID())
	assert.Equal(t, missing, foreign, "acme's retry of globex's run is answered otherwise than a retry of no run")
}

func r37Def(name string, aliases ...string) map[string]any {
	d := map[string]any{"name": name, "description": name, "mode": "read", "inputSchema": map[string]any{"type": "object"}}
	if len(aliases) > 0 {
		d["planner"] = map[string]any{"aliases": aliases}
	}
	return d
}

// Operator mode: `tenant remove acme` revokes acme's users and deletes its
// account, but acme's runs, events, audit records and artifacts stay in
// ACTIONBUS's streams, keyed by the name alone, until they expire. A new
// `tenant add acme` (the name given to another customer) would read all
// of it through the read service: the store remembers the removed name
// and refuses it (tenant add --reuse-name is the operator's explicit
// choice).
func TestReview37ATenantAddedUnderARemovedTenantsNameReadsItsRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a nats-server and the services")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := actionbustest.NewServer(t, actionbustest.Options{Operator: true})
	srv.StartStack(t, actionbustest.StackOptions{Register: r37Echo})
	old, err := client.New(srv.TenantAdd(t, "acme", actionbustest.TenantLimits{}), client.Options{Tenant: "acme"})
	require.NoError(t, err)
	waitCatalog(t, ctx, old, "r37.echo")
	res, err := old.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "r37.echo", Args: map[string]any{"card": "4111-old-acme"}}, UserID: "a"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	oldCreds, err := os.ReadFile(srv.TenantCredsFile(t, "acme", accounts.ClientUser("acme")))
	require.NoError(t, err)
	srv.TenantRemove(t, "acme")

	// Another customer asks for the name: refused while what the removed
	// acme left is stored under it, unless the operator says so.
	_, err = srv.AddTenant(t, "acme", actionbustest.TenantLimits{})
	require.Error(t, err, "the removed acme's name was given to a new tenant")
	assert.Contains(t, err.Error(), "was removed")
	// The removed tenant's creds stay refused.
	kept := filepath.Join(t.TempDir(), "old.creds")
	require.NoError(t, os.WriteFile(kept, oldCreds, 0o600))
	if nc, err := srv.DialCreds(kept); err == nil {
		nc.Close()
		assert.Fail(t, "the removed acme's creds connect again")
	}
	// A tenant under another name reads nothing of the removed acme's.
	next, err := client.New(srv.TenantAdd(t, "initech", actionbustest.TenantLimits{}), client.Options{Tenant: "initech"})
	require.NoError(t, err)
	stored, _ := next.StoredEvents(ctx, res.RunID)
	assert.Empty(t, stored, "initech reads the removed acme's run")
	recs, _ := next.AuditRecords(ctx, res.RunID)
	assert.Empty(t, recs, "initech reads the removed acme's audit records")
}

// Static config: a tenant account's `limits` block (max connections) is
// applied by the server, as operator mode's JWT limits are: the 65th
// connection of acme's users is refused, and globex still connects.
// (Held.)
func TestReview37StaticTenantLimitsHold(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a nats-server")
	}
	srv := deployed(t, "acme", "globex")
	var refused error
	for i := 0; i < 65; i++ {
		nc, err := nats.Connect(srv.UserURL("client-acme"), nats.CustomInboxPrefix("_INBOX_acme"), nats.MaxReconnects(0))
		if err != nil {
			refused = err
			t.Logf("connection %d refused: %v", i+1, err)
			break
		}
		t.Cleanup(nc.Close)
	}
	require.Error(t, refused, "acme opened 65 connections")
	assert.Contains(t, refused.Error(), "maximum")
	srv.TenantConnect(t, "client-globex", "globex")
}

// The registrar answers an announcement on the announcement's reply
// subject, whatever it is, as the dispatcher's user — which may publish
// on run subjects of every tenant, run state, the catalog and its owners,
// the limits bucket and the purge of the timers stream. An executor user
// (any pool) sends an announcement (refused or not, it is answered) whose
// reply subject is one of those: the dispatcher's connection publishes
// the registrar's JSON answer there: another pool's catalog entry and its
// owner record (the action leaves the catalog and its pool can no longer
// announce it), any tenant's live run state (the run is corrupt), a
// message on another tenant's terminal subject. (The purge of the timers
// stream, aimed the same way, held.) Operator mode, every service as its
// own deployed user.
func TestReview37AnExecutorAimsTheRegistrarsAnswerAtTheSharedStores(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a nats-server and the services")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := actionbustest.NewServer(t, actionbustest.Options{Operator: true})
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		if err := r37Echo(ex); err != nil {
			return err
		}
		return executor.Register(ex, executor.Action{Name: "r37.slow", Timeout: time.Minute},
			func(ctx context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
				select {
				case <-release:
				case <-ctx.Done():
				}
				return executor.Result[map[string]any]{Output: in}, nil
			})
	}})
	globex, err := client.New(srv.TenantAdd(t, "globex", actionbustest.TenantLimits{}), client.Options{Tenant: "globex"})
	require.NoError(t, err)
	waitCatalog(t, ctx, globex, "r37.slow")
	mallory, err := srv.DialCreds(srv.ServiceCredsFile(t, "executor"), nats.CustomInboxPrefix("_INBOX_executor"))
	require.NoError(t, err)
	t.Cleanup(mallory.Close)
	aim := func(reply string) {
		m := announcement(t, "default", r37Def("mallory.x"))
		m.Reply = reply
		require.NoError(t, mallory.PublishMsg(m))
		// The registrar handles announcements in order: once a proper one
		// is answered, the aimed one has been handled.
		reg37Announce(t, mallory, "default", r37Def("mallory.barrier"))
	}
	info := func(stream string) jetstream.StreamState {
		s, err := srv.JS.Stream(ctx, stream)
		require.NoError(t, err)
		i, err := s.Info(ctx)
		require.NoError(t, err)
		return i.State
	}

	t.Run("the timers of every run", func(t *testing.T) {
		id, err := globex.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: "r37.slow", Args: map[string]any{}}, UserID: "g"})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return info("AB_TIMERS").Msgs > 0 }, 10*time.Second, 50*time.Millisecond,
			"globex's running run has its alarm in the timers stream")
		before := info("AB_TIMERS").Msgs
		aim("$JS.API.STREAM.PURGE.AB_TIMERS")
		assert.Equal(t, before, info("AB_TIMERS").Msgs, "the timers stream was purged (globex's run %s lost its alarm)", id)
	})

	t.Run("another pool's catalog entry", func(t *testing.T) {
		aim("$KV.ab_catalog.default.r37.echo")
		list, err := globex.Actions(ctx)
		require.NoError(t, err)
		found := false
		for _, a := range list {
			found = found || a.Name == "r37.echo"
		}
		assert.True(t, found, "r37.echo left the catalog: its entry now holds the registrar's answer")
	})

	t.Run("a name's owner record", func(t *testing.T) {
		aim("$KV.ab_catalog_owners.action.r37.echo")
		kv, err := srv.JS.KeyValue(ctx, "ab_catalog_owners")
		require.NoError(t, err)
		e, err := kv.Get(ctx, "action.r37.echo")
		require.NoError(t, err)
		assert.Equal(t, "default", string(e.Value()), "the owner record of r37.echo was overwritten: pool default can no longer announce it")
	})

	t.Run("a live run's state", func(t *testing.T) {
		id, err := globex.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: "r37.slow", Args: map[string]any{}}, UserID: "g"})
		require.NoError(t, err)
		kv, err := srv.JS.KeyValue(ctx, "ab_runs")
		require.NoError(t, err)
		require.Eventually(t, func() bool { _, err := kv.Get(ctx, id); return err == nil }, 10*time.Second, 50*time.Millisecond)
		aim("$KV.ab_runs." + id)
		e, err := kv.Get(ctx, id)
		require.NoError(t, err)
		assert.Contains(t, string(e.Value()), `"runId":"`+id+`"`, "globex's run state now holds the registrar's answer: %.120s", e.Value())
	})

	// The secret every run's id keys are derived from: who reads it forges
	// any run's end ids; who overwrites it makes a run admitted again hand
	// out its work under other ids (it would run twice).
	t.Run("the dispatchers' id secret", func(t *testing.T) {
		kv, err := srv.JS.KeyValue(ctx, "ab_runs")
		require.NoError(t, err)
		before, err := kv.Get(ctx, dispatch.IDSecretKey)
		require.NoError(t, err, "the dispatchers keep their id secret in the runs bucket")
		_, err = mallory.Request("$JS.API.DIRECT.GET.KV_ab_runs.$KV.ab_runs."+dispatch.IDSecretKey, nil, 2*time.Second)
		assert.Error(t, err, "the executor user read the dispatchers' id secret")
		aim("$KV.ab_runs." + dispatch.IDSecretKey)
		after, err := kv.Get(ctx, dispatch.IDSecretKey)
		require.NoError(t, err)
		assert.Equal(t, before.Revision(), after.Revision(), "the id secret was overwritten with the registrar's answer: %.120s", after.Value())
		assert.Equal(t, before.Value(), after.Value())
	})

	t.Run("the dispatchers' limits bookkeeping", func(t *testing.T) {
		key := limits.BucketKey("r37.echo")
		aim("$KV.ab_limits." + key)
		kv, err := srv.JS.KeyValue(ctx, "ab_limits")
		require.NoError(t, err)
		_, err = kv.Get(ctx, key)
		assert.ErrorIs(t, err, jetstream.ErrKeyNotFound, "the limits entry of r37.echo now holds the registrar's answer")
	})

	t.Run("another tenant's terminal subject", func(t *testing.T) {
		id, err := globex.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: "r37.slow", Args: map[string]any{}}, UserID: "g"})
		require.NoError(t, err)
		aim("ab.run.globex." + id + ".completed")
		assert.Equal(t, 0, srv.Stored(t, "AB_RUNS", "ab.run.globex."+id+".completed"), "a message was stored on globex's run's completed subject")
	})
}

// Pagination tricks on the read service, as acme, with a globex run
// stored: a sequence at the top of the range (After+1 wraps to 0), a cut
// message continued at an offset on globex's run id, a page start long
// before anything was stored, the smallest page, every verb of the
// requests stream on globex's run, the last events of globex's run. No
// answer holds a subject of globex, and the service still answers.
// (Held.)
func TestReview37ReadServicePaginationTricksStayInTheTenant(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a nats-server and the services")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := deployed(t, "acme", "globex")
	srv.StartStack(t, actionbustest.StackOptions{Register: r37Echo})
	globex, err := client.New(srv.TenantConnect(t, "client-globex", "globex"), client.Options{Tenant: "globex"})
	require.NoError(t, err)
	waitCatalog(t, ctx, globex, "r37.echo")
	done, err := globex.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "r37.echo", Args: map[string]any{"g": 1}}, UserID: "g"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, done.Status, "%+v", done.Error)

	caller := readapi.NewCaller(srv.TenantConnect(t, "client-acme", "acme"), "ab", "acme")
	caller.RetryFor = 2 * time.Second
	old := time.Unix(0, 0)
	for name, c := range map[string]struct {
		op  string
		req readapi.Request
	}{
		"runs after the last sequence":  {readapi.OpRuns, readapi.Request{After: ^uint64(0)}},
		"audit after the last sequence": {readapi.OpAudit, readapi.Request{After: ^uint64(0)}},
		"runs since 1970":               {readapi.OpRuns, readapi.Request{Since: &old, Limit: readapi.MaxLimit}},
		"events at an offset":           {readapi.OpEvents, readapi.Request{Run: done.RunID, Offset: 3}},
		"requests of globex's run":      {readapi.OpEvents, readapi.Request{Run: done.RunID, Stream: readapi.StreamRequests, Verbs: []string{"requested", "cancel", "input", "approve", "deny"}}},
		"last of globex's run":          {readapi.OpEvents, readapi.Request{Run: done.RunID, Last: true, Verbs: []string{"completed", "failed"}}},
		"smallest page":                 {readapi.OpRuns, readapi.Request{MaxBytes: readapi.MinPageBytes, Limit: 1}},
		"audit of globex's run":         {readapi.OpAudit, readapi.Request{Run: done.RunID, After: ^uint64(0) - 1}},
	} {
		var p readapi.Page
		err := caller.Call(ctx, c.op, c.req, &p)
		t.Logf("%s: %d messages, err %v", name, len(p.Msgs), err)
		for _, m := range p.Msgs {
			assert.False(t, strings.Contains(m.Subject, "globex") || strings.Contains(string(m.Data), done.RunID), "%s: acme read %s", name, m.Subject)
		}
	}
	var p readapi.Page
	require.NoError(t, caller.Call(ctx, readapi.OpRuns, readapi.Request{}, &p), "the read service still answers")
}

// docs/security.md (the users table, threat 6): the approver reads its
// runs' approvals and nothing else of them. Its user may call only the
// read service's approvals operation (ab.api.<tenant>.approvals), which
// serves a run's approval subject and nothing else: acme's approver reads
// no run's result and no audit record.
func TestReview37AnApproverReadsEveryRunOfItsTenant(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a nats-server and the services")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv := deployed(t, "acme")
	srv.StartStack(t, actionbustest.StackOptions{Register: r37Echo})
	acme, err := client.New(srv.TenantConnect(t, "client-acme", "acme"), client.Options{Tenant: "acme"})
	require.NoError(t, err)
	waitCatalog(t, ctx, acme, "r37.echo")
	res, err := acme.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "r37.echo", Args: map[string]any{"salary": "acme-ceo-991k"}}, UserID: "a"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)

	approver, err := client.New(srv.TenantConnect(t, "approver-acme", "acme"), client.Options{Tenant: "acme"})
	require.NoError(t, err)
	ended, err := approver.Ended(ctx, res.RunID)
	if err == nil && ended != nil {
		out, _ := json.Marshal(ended.Output)
		assert.NotContains(t, string(out), "acme-ceo-991k", "acme's approver reads a run's result")
	}
	recs, _ := approver.AuditRecords(ctx, res.RunID)
	assert.True(t, len(recs) == 0, "acme's approver reads %d audit records of a run that asked no approval", len(recs))
}

// An artifact read by id (client.Artifact, the read service) looks in
// every artifact store and refuses an id that two stores hold for the
// tenant, so that no pool shadows another's artifact. A pool's executor
// learns other tenants' artifact ids from the run.completed events its
// user receives (TestReview37ADedicatedPoolsExecutorReceivesOtherTenantsAnswers),
// and writes its own pool's store: executor-acme, a pool dedicated to
// acme, records an object under globex's artifact id with globex as its
// owner, and globex can no longer read its artifact.
