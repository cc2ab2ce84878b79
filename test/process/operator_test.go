package process

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/accounts"
	"github.com/actionbus/actionbus/internal/cli"
)

// TestATenantAddedToARunningDeploymentRunsFollowsAndReadsItsAudit is
// operator mode as deployed: a nats-server process started from
// `actionbus nats init`'s configuration, the four service binaries
// connected with their ACTIONBUS creds, and then — with no restart of
// anything — `actionbus tenant add acme`. Acme's client, with the creds
// tenant add wrote, starts a run, follows it to its end, and reads its
// audit records and its run's end through the read service; a second
// tenant added the same way sees none of acme's.
func TestATenantAddedToARunningDeploymentRunsFollowsAndReadsItsAudit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts nats-server and service processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	store := filepath.Join(dir, "operator")
	run := func(args ...string) string {
		t.Helper()
		var out, errOut strings.Builder
		code := cli.Execute(ctx, args, nil, &out, &errOut)
		require.Equal(t, 0, code, "actionbus %s: %s%s", strings.Join(args, " "), out.String(), errOut.String())
		return out.String()
	}
	run("nats", "init", "--dir", store)

	// nats-server, from the module cache, with the store's configuration.
	bin := filepath.Join(dir, "nats-server")
	build := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2")
	build.Dir = repoRoot(t)
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build nats-server: %s", out)
	operatorConf, err := os.ReadFile(filepath.Join(store, "server.conf"))
	require.NoError(t, err)
	addr := freeAddr(t)
	conf := filepath.Join(dir, "server.conf")
	require.NoError(t, os.WriteFile(conf, []byte("listen: "+addr+"\njetstream { store_dir: "+filepath.Join(dir, "js")+" }\n"+string(operatorConf)), 0o600))
	server := &clusterNode{name: "nats-server", conf: conf, url: "nats://" + addr}
	server.start(t, bin)
	t.Cleanup(func() {
		server.kill()
		if t.Failed() {
			t.Logf("nats-server output:\n%s", server.out.String())
		}
	})
	url := server.url
	creds := func(account, user string) string {
		return filepath.Join(store, "accounts", account, "users", user+".creds")
	}
	require.Eventually(t, func() bool {
		nc, err := nats.Connect(url, nats.UserCredentials(creds(accounts.ServiceAccount, "admin")))
		if err == nil {
			nc.Close()
		}
		return err == nil
	}, 30*time.Second, 20*time.Millisecond, "nats-server never took a connection")
	run("--nats", url, "--creds", creds(accounts.ServiceAccount, "admin"), "provision")

	services := buildServices(t)
	t.Setenv("NATS_CREDS", "")
	for _, svc := range []string{"dispatcher", "planner", "auditor"} {
		t.Setenv("NATS_CREDS", creds(accounts.AccountOf(svc), svc))
		startService(t, filepath.Join(services, svc), url)
	}
	startTestExecutor(t, buildTestExecutor(t), url, t.TempDir(), "ex-1", "NATS_CREDS="+creds(accounts.AccountOf("executor"), "executor"))

	// The deployment runs; now a tenant arrives.
	printed := run("--nats", url, "tenant", "add", "acme", "--dir", store)
	require.Contains(t, printed, filepath.Join(store, "accounts", "acme", "users"))
	connect := func(tenant string) *client.Client {
		nc, err := nats.Connect(url, nats.UserCredentials(creds(tenant, accounts.ClientUser(tenant))),
			nats.CustomInboxPrefix(client.InboxPrefix(tenant)))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		c, err := client.New(nc, client.Options{Tenant: tenant})
		require.NoError(t, err)
		return c
	}
	acme := connect("acme")
	waitCatalog(t, ctx, acme, "test.other")
	var seen []string
	res, err := acme.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.other", Args: map[string]any{}}, UserID: "a1"},
		func(e client.Event) { seen = append(seen, e.Type) })
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Contains(t, seen, events.TypeRunStarted, "acme followed its run live")
	assert.Contains(t, seen, events.TypeRunCompleted)

	ended, err := acme.Ended(ctx, res.RunID)
	require.NoError(t, err)
	require.NotNil(t, ended)
	assert.Equal(t, client.StatusCompleted, ended.Status)
	require.Eventually(t, func() bool {
		recs, err := acme.AuditRecords(ctx, res.RunID)
		if err != nil {
			return false
		}
		for _, r := range recs {
			if r.EventType == events.TypeRunCompleted {
				return r.Tenant == "acme"
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond, "acme reads its run's audit records")

	// Another tenant, added the same way, reads nothing of acme's.
	run("--nats", url, "tenant", "add", "globex", "--dir", store)
	globex := connect("globex")
	other, err := globex.Ended(ctx, res.RunID)
	assert.True(t, err != nil || other == nil, "globex read acme's run's end")
	recs, err := globex.AuditRecords(ctx, res.RunID)
	assert.True(t, err != nil || len(recs) == 0, "globex read acme's audit records")
}
