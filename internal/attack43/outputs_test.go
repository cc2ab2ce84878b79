package attack43_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
)

// acmeSecret is what acme's action answers: data of tenant acme, from
// the default pool.
const acmeSecret = "acme-ledger-balance-4711"

func registerLedger(ex *executor.Executor) error {
	return executor.Register(ex, executor.Action{Name: "ledger.balance", Description: "Read acme's ledger balance."},
		func(_ context.Context, _ struct{}, _ executor.Call) (executor.Result[map[string]string], error) {
			return executor.Result[map[string]string]{Output: map[string]string{"balance": acmeSecret}, Summary: "balance read"}, nil
		})
}

// TestASiteOfAnotherPoolReceivesNoTenantsRunOutputs attacks "nothing else
// of the cluster is reachable from the site": a site linked as the default
// pool's executor user subscribes, as that user may, to
// ab.run.*.*.completed (every executor user may, to stop the calls of
// ended runs). Tenant acme then runs an action of pool "other". The
// site, in whatever network it stands (a customer's), must not receive
// acme's run output: an executor needs to know that a run ended, not what
// it answered, and a run of another tenant on another pool is none of its
// business.
//
// It failed while the hole was open: run.completed carries the run's
// output (events.RunCompleted.Output) to every executor user of every
// pool, and so through every leaf link. Executors now hear the ids of
// ended runs with calls on their pool only (ab.pool.<pool>.ended).
func TestASiteOfAnotherPoolReceivesNoTenantsRunOutputs(t *testing.T) {
	h := hub(t)
	h.ServeIngress(t)
	h.StartStack(t, actionbustest.StackOptions{NoExecutors: true, NoPlanner: true})
	ex, err := executor.New(h.Connect(t), executor.Config{Pool: "other"})
	require.NoError(t, err)
	require.NoError(t, registerLedger(ex))
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- ex.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-ran })
	require.Eventually(t, func() bool { return lastSeq(t, h.JS, "KV_ab_catalog", "$KV.ab_catalog.>") > 0 },
		10*time.Second, 20*time.Millisecond, "pool other's executor announced ledger.balance")
	_, siteConn := site(t, h, "executor")
	seen := make(chan *nats.Msg, 64)
	_, err = siteConn.Subscribe("ab.run.*.*.completed", func(m *nats.Msg) { seen <- m })
	require.NoError(t, err)
	require.NoError(t, siteConn.Flush())
	// Since A43-3 the executor user may not subscribe there: the
	// subscription is refused, and a completed event of no run, published
	// by the dispatcher's user, never reaches the site (it did while the
	// hole was open).
	disp, err := nats.Connect(h.UserURL("dispatcher"), nats.CustomInboxPrefix("_INBOX_dispatcher"))
	require.NoError(t, err)
	t.Cleanup(disp.Close)
	require.NoError(t, disp.Publish("ab.run.default.01JNORUN000000000000000000.completed", nil))
	require.NoError(t, disp.Flush())

	acme, err := client.New(h.TenantConnect(t, "client-acme", "acme"), client.Options{Tenant: "acme"})
	require.NoError(t, err)
	ctx := ctxFor(t, 30*time.Second)
	res, err := acme.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "ledger.balance", Args: map[string]any{}}}, nil)
	require.NoError(t, err)
	require.Contains(t, mustJSON(t, res), acmeSecret, "the run answered acme's secret")

	// The run has ended: its completed event was published before the
	// client saw it. Take what reaches the site for three seconds.
	var leaked, reached []string
	deadline := time.After(3 * time.Second)
	for done := false; !done; {
		select {
		case m := <-seen:
			reached = append(reached, m.Subject)
			if strings.Contains(string(m.Data), acmeSecret) {
				leaked = append(leaked, m.Subject)
			}
		case <-deadline:
			done = true
		}
	}
	assert.Empty(t, reached, "terminal events reached a site")
	assert.Empty(t, leaked, "a site of pool default received acme's run output (%s) on %v", acmeSecret, leaked)
}
