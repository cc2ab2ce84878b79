// Package attack43_test holds the independent attacks on the changes of
// issue 41 item 2 (executors on NATS leaf nodes) and on schema-validated
// workflows: each test plays a deployed party (whatever connects to a
// site's leaf node, a tenant's client) against real embedded nats-servers
// with the deployed accounts (deploy/nats/accounts.conf) and the shipped
// deploy/nats/leaf.conf, and asserts the safe behaviour, so that it fails
// while the hole it names is open.
package attack43_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
)

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func repoRoot(t *testing.T) string {
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// hub is a cluster node with the deployed accounts, accepting leaf nodes
// with the deployment's JetStream domain; pools default and other, tenants
// default and acme.
func hub(t *testing.T) *actionbustest.Server {
	return actionbustest.NewServer(t, actionbustest.Options{Users: true, LeafNodes: true,
		Pools: []string{"default", "other"}, Tenants: []string{"acme"}})
}

// site runs the shipped deploy/nats/leaf.conf (in this process, but for
// its listen port) linked to hub as the hub user linkUser, with the site
// password "pw-site", and returns a connection to it as the site's
// executor user, as an executor at the site connects.
func site(t *testing.T, h *actionbustest.Server, linkUser string) (*server.Server, *nats.Conn) {
	t.Helper()
	return siteAt(t, h, h.LeafURL(linkUser))
}

var sites atomic.Int64

// siteAt is site linked to the hub by hubURL (a leaf URL with its user).
func siteAt(t *testing.T, h *actionbustest.Server, hubURL string) (*server.Server, *nats.Conn) {
	t.Helper()
	t.Setenv("HUB_LEAF_URLS", `["`+hubURL+`"]`)
	t.Setenv("LEAF_EXECUTOR_PASSWORD", "pw-site")
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "nats", "leaf.conf"))
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "leaf.conf")
	require.NoError(t, os.WriteFile(path, b, 0o600))
	before := h.NATS.NumLeafNodes()
	opts, err := server.ProcessConfigFile(path)
	require.NoError(t, err)
	opts.Port, opts.NoSigs, opts.NoLog = -1, true, true
	opts.ServerName = fmt.Sprintf("site-%d", sites.Add(1))
	ls, err := server.NewServer(opts)
	require.NoError(t, err)
	ls.Start()
	t.Cleanup(func() { ls.Shutdown(); ls.WaitForShutdown() })
	require.True(t, ls.ReadyForConnections(10*time.Second))
	require.Eventually(t, func() bool { return h.NATS.NumLeafNodes() > before && ls.NumLeafNodes() == 1 },
		10*time.Second, 20*time.Millisecond, "the site's link to the hub")
	nc, err := nats.Connect(ls.ClientURL(), nats.UserInfo("executor", "pw-site"),
		nats.CustomInboxPrefix("_INBOX_executor"), nats.Name(t.Name()), nats.MaxReconnects(-1))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return ls, nc
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// openHole skips a test whose hole is still open: it is named in the
// closing note of 2026-12-03 (issue 41). A43-1 was closed on 2026-12-07
// by putting executors in accounts of their own; A43-5 (the executors of
// a pool share one user) stays open. ACTIONBUS_ATTACK_OPEN=1 runs it,
// and it fails until the hole is closed.
func openHole(t *testing.T, what string) {
	t.Helper()
	if os.Getenv("ACTIONBUS_ATTACK_OPEN") == "" {
		t.Skipf("OPEN HOLE, not closed yet: %s (ACTIONBUS_ATTACK_OPEN=1 runs this test, which fails while it is open)", what)
	}
}
