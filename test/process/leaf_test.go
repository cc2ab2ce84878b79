package process

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
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
	"github.com/actionbus/actionbus/internal/accounts"
)

// TestAnExecutorOnALeafNodeServesItsPoolAndSurvivesTheLinkCut runs the
// shipped deploy/nats/leaf.conf as a nats-server process whose link to
// the hub (a server with the deployed accounts, accepting leaf nodes)
// goes through a TCP proxy the test can cut; the test executor process
// connects to the leaf only, as the site's user. Keyed exec runs of a
// slow action are started, the link is cut while calls are in flight
// (their heartbeats, acknowledgements and results have nowhere to go; the
// hub redelivers their work after its ack wait) and restored three
// seconds later. Every run must complete, end exactly once, and no
// handler may have run twice for one call.
func TestAnExecutorOnALeafNodeServesItsPoolAndSurvivesTheLinkCut(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nats-server and executor processes")
	}
	srv := actionbustest.NewServer(t, actionbustest.Options{Users: true, LeafNodes: true, AckWait: 2 * time.Second})
	st := srv.StartStack(t, actionbustest.StackOptions{NoExecutors: true})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	hub, err := url.Parse(srv.LeafURL("executor"))
	require.NoError(t, err)
	link := actionbustest.NewLinkProxy(t, hub.Host)
	leafAddr := freeAddr(t)
	leaf := startLeaf(t, leafAddr, fmt.Sprintf(`["nats-leaf://executor:%s@%s"]`, passwordOf(hub), link.Addr()))
	require.Eventually(t, func() bool { return srv.NATS.NumLeafNodes() == 1 }, 30*time.Second, 20*time.Millisecond,
		"the leaf node never linked to the hub:\n%s", leaf.String())

	dir := t.TempDir()
	exe := buildTestExecutor(t)
	startTestExecutor(t, exe, "nats://executor:pw-site@"+leafAddr, dir, "edge-1", "SLOW_MS=1500", "SLOTS=8", "ACTIONBUS_JS_DOMAIN="+accounts.JetStreamDomain)
	waitCatalog(t, ctx, st.Client, "test.slow")

	const runs = 24
	ids := make([]string, runs)
	for i := range runs {
		ids[i], err = st.Client.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.slow",
			Args: map[string]any{"n": i}, IdempotencyKey: fmt.Sprintf("leaf-%d", i)}})
		require.NoError(t, err)
	}
	// Calls are running on the site: cut the link under them.
	lines(t, filepath.Join(dir, "invocations"), 4)
	link.Cut()
	require.Eventually(t, func() bool { return srv.NATS.NumLeafNodes() == 0 }, 30*time.Second, 20*time.Millisecond, "the hub never lost the leaf")
	select {
	case <-time.After(3 * time.Second): // the outage: longer than the ack wait, so work is redelivered
	case <-ctx.Done():
	}
	link.Restore()
	require.Eventually(t, func() bool { return srv.NATS.NumLeafNodes() == 1 }, 30*time.Second, 20*time.Millisecond, "the leaf never linked again")

	for i, id := range ids {
		res, err := st.Client.Wait(ctx, id)
		require.NoError(t, err, "run %d did not end", i)
		assert.Equal(t, client.StatusCompleted, res.Status, "run %d: %+v", i, res.Error)
		assert.EqualValues(t, 1, terminalsStored(t, ctx, srv.JS, id), "run %d ended exactly once", i)
	}
	calls := map[string]int{}
	for _, l := range lines(t, filepath.Join(dir, "invocations"), runs) {
		calls[strings.Fields(l)[1]]++
	}
	assert.Len(t, calls, runs, "every run's call ran on the site")
	for call, n := range calls {
		assert.Equal(t, 1, n, "the handler of call %s ran %d times", call, n)
	}
	assert.GreaterOrEqual(t, link.Accepted(), 2, "the leaf linked again through the proxy after the cut")

	// What the site reaches through the link is the pool's executor user's,
	// nothing more: its own stream's information, never the run states.
	site, err := nats.Connect("nats://executor:pw-site@"+leafAddr, nats.CustomInboxPrefix("_INBOX_executor"))
	require.NoError(t, err)
	defer site.Close()
	js, err := jetstream.NewWithDomain(site, accounts.JetStreamDomain)
	require.NoError(t, err)
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	_, err = js.Stream(sctx, "AB_WORK")
	require.NoError(t, err, "the executor user may read its work stream's information")
	_, err = js.Stream(sctx, "KV_ab_runs")
	assert.Error(t, err, "a site read the run states' stream through the leaf link")
	before := srv.Stored(t, "AB_RUNS", "ab.run.default.*.completed")
	require.NoError(t, site.Publish("ab.run.default."+ids[0]+".completed", []byte(`{}`)))
	// A request after it on the same connection and link: once answered,
	// the hub has handled the publish before it.
	_, err = js.Stream(sctx, "AB_WORK")
	require.NoError(t, err)
	assert.Equal(t, before, srv.Stored(t, "AB_RUNS", "ab.run.default.*.completed"), "a site published a terminal event through the leaf link")
}

// startLeaf runs deploy/nats/leaf.conf, as shipped but for its listen
// address, with the hub's leaf URLs and the site user's password
// ("pw-site") from the environment, as an operator would.
func startLeaf(t *testing.T, listen, hubURLs string) *actionbustest.LogBuffer {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "nats", "leaf.conf"))
	require.NoError(t, err)
	conf := strings.Replace(string(b), "listen: 127.0.0.1:4222", "listen: "+listen, 1)
	require.NotEqual(t, string(b), conf)
	path := filepath.Join(t.TempDir(), "leaf.conf")
	require.NoError(t, os.WriteFile(path, []byte(conf), 0o600))
	cmd := exec.Command(buildNATSServer(t, t.TempDir()), "-c", path)
	cmd.Env = append(os.Environ(), "HUB_LEAF_URLS="+hubURLs, "LEAF_EXECUTOR_PASSWORD=pw-site")
	out := &actionbustest.LogBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("leaf node output:\n%s", tail(out.String(), 8<<10))
		}
	})
	return out
}

// buildNATSServer builds nats-server from the module cache into dir.
func buildNATSServer(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "nats-server")
	build := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2")
	build.Dir = repoRoot(t)
	out, err := build.CombinedOutput()
	require.NoError(t, err, "build nats-server: %s", out)
	return bin
}

func passwordOf(u *url.URL) string {
	p, _ := u.User.Password()
	return p
}
