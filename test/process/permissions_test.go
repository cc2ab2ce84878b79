package process

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/internal/embedded"
	"github.com/actionbus/actionbus/internal/events"
)

// TestLeastPrivilegeUsersRunTheSystem starts a server with the accounts and
// users of deploy/nats, provisions as admin, runs every service as its own
// process with its own user, and completes runs as the client user. A
// permission missing from deploy/nats/accounts.conf fails a service or the
// run; a permission too many shows in the refusals checked at the end.
func TestLeastPrivilegeUsersRunTheSystem(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts four processes")
	}
	users := []string{"admin", "dispatcher", "planner", "executor", "auditor", "client"}
	for _, u := range users {
		t.Setenv(strings.ToUpper(u)+"_PASSWORD", "pw-"+u)
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "server.conf")
	// nats-server resolves includes relative to the including file.
	accounts, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "nats", "accounts.conf"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "accounts.conf"), accounts, 0o600))
	require.NoError(t, os.WriteFile(conf, []byte("include ./accounts.conf\n"), 0o600))
	ns, err := embedded.Start(embedded.Options{Port: -1, StoreDir: filepath.Join(dir, "js"), ConfigFile: conf})
	require.NoError(t, err)
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	port := ns.Addr().String()[strings.LastIndex(ns.Addr().String(), ":")+1:]
	url := func(user string) string { return fmt.Sprintf("nats://%s:pw-%s@127.0.0.1:%s", user, user, port) }

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	admin, err := nats.Connect(url("admin"))
	require.NoError(t, err)
	defer admin.Close()
	js, err := jetstream.New(admin)
	require.NoError(t, err)
	require.NoError(t, events.Topology{}.Provision(ctx, js))

	bin := buildServices(t)
	for _, svc := range []string{"dispatcher", "planner", "auditor", "executor"} {
		startService(t, filepath.Join(bin, svc), url(svc))
	}

	var refusals []string
	errCh := make(chan string, 16)
	nc, err := nats.Connect(url("client"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errCh <- err.Error():
		default:
		}
	}))
	require.NoError(t, err)
	defer nc.Close()
	c, err := client.New(nc)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		list, _ := c.Actions(ctx)
		return len(list) >= 4
	}, 30*time.Second, 50*time.Millisecond, "executor did not publish the catalog")

	res, err := c.Run(ctx, client.RunRequest{Scenario: "delivery-triage", Prompt: "triage"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)

	// The audit trail was written by the auditor user.
	stream, err := js.Stream(ctx, "AB_AUDIT")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := stream.Info(ctx)
		return err == nil && info.State.Msgs > 10
	}, 10*time.Second, 50*time.Millisecond)

	// The client user cannot impersonate a service.
	require.NoError(t, nc.Publish("ab.run.X.completed", []byte("{}")))
	require.NoError(t, nc.Publish("ab.pool.default.request", []byte("{}")))
	require.NoError(t, nc.Flush())
	deadline := time.After(5 * time.Second)
	for len(refusals) < 2 {
		select {
		case e := <-errCh:
			refusals = append(refusals, e)
		case <-deadline:
			t.Fatalf("the client user was not refused: %v", refusals)
		}
	}
	assert.Contains(t, strings.Join(refusals, "\n"), "Permissions Violation")
}
