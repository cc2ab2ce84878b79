package attack43_test

import (
	"context"
	"log/slog"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
)

// TestALinkCutLongerThanTheResultPatienceDuplicatesNoEffect attacks "A cut
// link loses and duplicates nothing" (docs/operations.md#leaf-nodes),
// proven there with a three-second cut. An executor on the site (the
// shipped leaf.conf, linked through a proxy the test cuts) runs a keyed
// call; the link is cut while the handler runs, and the handler then
// succeeds. The executor tries to store the idempotency record "done" for
// 30 s (resultPatience) and gives its claim up; the link comes back right
// then. The run must complete, and the effect must have happened once: a
// redelivery of the call, or the client calling again with the same key
// (as a retry does), must replay the stored result, not run the handler
// again.
//
// It failed while the hole was open: the record stayed "claimed", no
// longer this process's, so the redelivered call took it over as
// abandoned and ran the handler a second time with the same key. Now the
// executor keeps the claim and goes on storing the record until the link
// is back.
func TestALinkCutLongerThanTheResultPatienceDuplicatesNoEffect(t *testing.T) {
	if testing.Short() {
		t.Skip("cuts a link for 30 s")
	}
	h := actionbustest.NewServer(t, actionbustest.Options{Users: true, LeafNodes: true, Tenants: []string{"acme"}, AckWait: 6 * time.Second})
	h.ServeIngress(t)
	h.StartStack(t, actionbustest.StackOptions{NoExecutors: true, NoPlanner: true})
	hubURL, err := url.Parse(h.LeafURL("executor"))
	require.NoError(t, err)
	proxy := actionbustest.NewLinkProxy(t, hubURL.Host)
	hubURL.Host = proxy.Addr()

	var count atomic.Int64
	started := make(chan struct{}, 4)
	release := make(chan struct{})
	logs := &actionbustest.LogBuffer{}
	siteSrv, _ := siteAt(t, h, hubURL.String())
	nc, err := nats.Connect(siteSrv.ClientURL(), nats.UserInfo("executor", "pw-site"), nats.CustomInboxPrefix("_INBOX_executor"),
		nats.MaxReconnects(-1), nats.Name(t.Name()+"-executor"))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	ex, err := executor.New(nc, executor.Config{ID: "site-executor", JetStreamDomain: "actionbus",
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	require.NoError(t, err)
	require.NoError(t, executor.Register(ex, executor.Action{Name: "count.bump", Description: "Counts a key once per key."},
		func(ctx context.Context, _ struct {
			Key string `json:"key"`
		}, _ executor.Call) (executor.Result[map[string]int64], error) {
			n := count.Add(1)
			started <- struct{}{}
			if n == 1 {
				<-release
			}
			return executor.Result[map[string]int64]{Output: map[string]int64{"count": n}, Summary: "bumped"}, nil
		}))
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- ex.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-ran })

	acme, err := client.New(h.TenantConnect(t, "client-acme", "acme"), client.Options{Tenant: "acme"})
	require.NoError(t, err)
	ctx := ctxFor(t, 3*time.Minute)
	call := client.RunRequest{Action: &client.ActionCall{Name: "count.bump", Args: map[string]any{"key": "k"}, IdempotencyKey: "attack43-bump-k"}}
	var runID string
	require.Eventually(t, func() bool { // the executor has announced its action
		id, err := acme.Start(ctx, call)
		if err != nil {
			return false
		}
		select {
		case <-started:
			runID = id
			return true
		case <-time.After(time.Second):
			return false
		}
	}, 30*time.Second, 100*time.Millisecond, "the site's executor runs count.bump")

	proxy.Cut()
	close(release)
	// The outage outlasts the executor's 30 s of patience with a result
	// publish (after which it used to give the idempotency record up).
	select {
	case <-time.After(35 * time.Second):
	case <-ctx.Done():
	}
	proxy.Restore()

	res, err := acme.Wait(ctx, runID)
	require.NoError(t, err)
	require.Nil(t, res.Error, "%+v", res)
	again, err := acme.Run(ctx, call, nil)
	require.NoError(t, err)
	require.Nil(t, again.Error, "%+v", again)
	assert.Never(t, func() bool { return count.Load() > 1 }, 3*time.Second, 50*time.Millisecond,
		"the handler ran twice for one idempotency key after a long link cut; executor log:\n%s", idemLog(logs.String()))
}

// idemLog is the executor's log lines about idempotency records.
func idemLog(log string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "idempotency") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
