package process

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/client"
	natsconf "github.com/actionbus/actionbus/deploy/nats"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// TestATenantCannotReachAnotherTenantsRuns runs two tenants' client and
// approver users (deploy/nats/tenant-users.conf.tmpl) against the four
// real service binaries. Tenant acme tries to read, follow, cancel and
// approve what belongs to tenant globex: NATS refuses every attempt made
// on globex's subjects, the dispatcher rejects (run_not_found, as for no run) the ones
// made on acme's own subjects with globex's run ids, and globex's runs go
// on unaffected.
func TestATenantCannotReachAnotherTenantsRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts service processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	url, adminJS := deployedServer(t, ctx, "acme", "globex")
	bin := buildServices(t)
	dir := t.TempDir()
	for _, svc := range []string{"dispatcher", "planner", "auditor"} {
		startService(t, filepath.Join(bin, svc), url(svc))
	}
	startTestExecutor(t, buildTestExecutor(t), url("executor"), dir, "ex-1")

	type tenantUsers struct {
		c, approver *client.Client
		js          jetstream.JetStream
		refused     *refusals
	}
	as := func(tenant string) tenantUsers {
		nc, refused := connectAs(t, url(natsconf.ClientUser(tenant)), client.InboxPrefix(tenant))
		c, err := client.New(nc, client.Options{Tenant: tenant})
		require.NoError(t, err)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		anc, _ := connectAs(t, url(natsconf.ApproverUser(tenant)), client.InboxPrefix(tenant))
		a, err := client.New(anc, client.Options{Tenant: tenant})
		require.NoError(t, err)
		return tenantUsers{c: c, approver: a, js: js, refused: refused}
	}
	acme, globex := as("acme"), as("globex")
	waitCatalog(t, ctx, globex.c, "test.count")
	waitCatalog(t, ctx, globex.c, "test.other")

	// Globex: a finished run, and a mutation waiting for its approval.
	done, err := globex.c.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.other", Args: map[string]any{}}, UserID: "g1"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, done.Status, "%+v", done.Error)
	waiting, err := globex.c.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.count", Args: map[string]any{"useKey": false}},
		AllowedModes: []string{"read", "mutate"}, UserID: "g1"})
	require.NoError(t, err)
	approvalID := waiting + "-1-0"
	require.Eventually(t, func() bool {
		_, err := globex.approver.Approval(ctx, approvalID)
		return err == nil
	}, 20*time.Second, 20*time.Millisecond, "globex's mutation never waited for its approval")

	// Acme's own run works, and acme's audit records are readable to it.
	mine, err := acme.c.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.other", Args: map[string]any{}}, UserID: "a1"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, mine.Status, "%+v", mine.Error)
	require.Eventually(t, func() bool {
		recs, err := acme.c.AuditRecords(ctx, mine.RunID)
		return err == nil && len(recs) > 3
	}, 20*time.Second, 50*time.Millisecond, "acme reads its own audit records")

	// A client of acme's connection that names globex: every read and
	// write on globex's subjects is refused by NATS.
	intruderNC, intruderRefused := connectAs(t, url(natsconf.ClientUser("acme")), client.InboxPrefix("acme"))
	intruder, err := client.New(intruderNC, client.Options{Tenant: "globex"})
	require.NoError(t, err)
	short := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 3*time.Second)
		t.Cleanup(cancel)
		return c
	}
	t.Run("read and follow", func(t *testing.T) {
		_, err := intruder.Follow(short(), done.RunID, nil)
		assert.Error(t, err, "acme followed globex's run")
		intruderRefused.waitFor(t, `Permissions Violation for Subscription to "ab.run.globex.`+done.RunID+`.completed"`)
		ended, err := intruder.Ended(short(), done.RunID)
		assert.True(t, err != nil || ended == nil, "acme read globex's terminal event")
		// Reads go through the read service, on the tenant's own subject.
		intruderRefused.waitFor(t, `Permissions Violation for Publish to "ab.api.globex.events"`)
		_, err = intruder.AuditRecords(short(), done.RunID)
		assert.Error(t, err, "acme read globex's audit records")
		err = intruder.AuditStream(short(), client.AuditQuery{AllTenants: true}, func(uint64, client.AuditRecord) error { return nil })
		assert.Error(t, err, "acme read every tenant's audit records")
		_, err = acme.js.OrderedConsumer(short(), "AB_RUNS", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"ab.run.>"}})
		assert.Error(t, err, "acme read every tenant's runs")
		// A stream read by sequence names no subject: refused outright.
		_, err = acme.js.Conn().Request("$JS.API.STREAM.MSG.GET.AB_RUNS", []byte(`{"seq":1}`), time.Second)
		assert.Error(t, err)
		acme.refused.waitFor(t, `Permissions Violation for Publish to "$JS.API.STREAM.MSG.GET.AB_RUNS"`)
		_, err = acme.js.Conn().SubscribeSync("ab.run.globex.>")
		require.NoError(t, err)
		acme.refused.waitFor(t, `Permissions Violation for Subscription to "ab.run.globex.>"`)
		_, err = acme.js.Conn().SubscribeSync("_INBOX.>")
		require.NoError(t, err)
		acme.refused.waitFor(t, `Permissions Violation for Subscription to "_INBOX.>"`)
		_, err = acme.js.Conn().SubscribeSync("_INBOX_globex.>")
		require.NoError(t, err)
		acme.refused.waitFor(t, `Permissions Violation for Subscription to "_INBOX_globex.>"`)
	})

	t.Run("artifacts", func(t *testing.T) {
		res, err := acme.c.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.big", Args: map[string]any{"bytes": 3 << 20}}}, nil)
		require.NoError(t, err)
		require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
		out, _ := res.Output.(map[string]any)
		ref, _ := out["artifact"].(map[string]any)
		id, _ := ref["id"].(string)
		require.NotEmpty(t, id, "the 3 MiB output is an artifact: %v", res.Output)
		data, sum, err := acme.c.Artifact(ctx, id)
		require.NoError(t, err, "acme reads its artifact, in chunks under the max payload")
		assert.Len(t, data, len(`{"text":""}`)+3<<20)
		assert.Equal(t, ref["sha256"], sum)
		_, _, err = globex.c.Artifact(short(), id)
		assert.Equal(t, actionbus.CodeArtifactNotFound, actionbus.CodeOf(err), "globex read acme's artifact: %v", err)
		_, _, err = intruder.Artifact(short(), id)
		assert.Error(t, err, "acme's connection naming globex read acme's artifact")
	})

	t.Run("cancel and approve", func(t *testing.T) {
		assert.Error(t, intruder.Cancel(short(), waiting, "mallory"), "acme canceled globex's run")
		intruderRefused.waitFor(t, `Permissions Violation for Publish to "ab.run.globex.`+waiting+`.cancel"`)
		anc, approverRefused := connectAs(t, url(natsconf.ApproverUser("acme")), client.InboxPrefix("acme"))
		acmeApprover, err := client.New(anc, client.Options{Tenant: "globex"})
		require.NoError(t, err)
		assert.Error(t, acmeApprover.Approve(short(), approvalID, "k1", deployApprovalKey), "acme approved globex's call")
		approverRefused.waitFor(t, `Permissions Violation for Publish to "ab.api.globex.approvals"`)
		require.NoError(t, anc.Publish("ab.run.globex."+waiting+".approve", []byte("{}")))
		approverRefused.waitFor(t, `Permissions Violation for Publish to "ab.run.globex.`+waiting+`.approve"`)

		// On acme's own subjects, naming globex's run: NATS lets the
		// events through, the dispatcher rejects them.
		_, err = acme.js.PublishMsg(ctx, forged(t, "ab.run.acme."+waiting+".cancel", events.TypeCancelRequested, waiting, events.NewID(),
			map[string]any{"runId": waiting, "reason": "mallory"}))
		require.NoError(t, err)
		require.NoError(t, acme.c.Input(ctx, waiting, "mallory"))
		require.Eventually(t, func() bool {
			n := 0
			for _, r := range rejections(t, ctx, adminJS, waiting) {
				if r.Reason.Code == actionbus.CodeRunNotFound && r.Consumer == bus.PartitionConsumer(bus.ConsumerDispatcherRequests, 0) {
					n++
				}
			}
			return n == 2
		}, 20*time.Second, 50*time.Millisecond, "the dispatcher rejects events naming another tenant's run")
		ended, err := globex.c.Ended(ctx, waiting)
		require.NoError(t, err)
		assert.Nil(t, ended, "globex's run was ended by acme")
	})

	// Globex's runs are unaffected: its approver approves, the run
	// completes, and its audit trail is intact.
	require.NoError(t, globex.approver.Approve(ctx, approvalID, "k1", deployApprovalKey))
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	res, err := globex.c.Wait(wctx, waiting)
	require.NoError(t, err)
	assert.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	require.Eventually(t, func() bool {
		recs, err := globex.c.AuditRecords(ctx, waiting)
		if err != nil {
			return false
		}
		for _, r := range recs {
			if r.EventType == events.TypeRunCompleted {
				assert.Equal(t, "globex", r.Tenant)
				return true
			}
		}
		return false
	}, 20*time.Second, 50*time.Millisecond)
	assert.Equal(t, uint64(1), terminalsStoredOf(t, ctx, adminJS, "globex", waiting))
}
