package attack43_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
)

// ackTargets are subjects of the ACTIONBUS account that no executor user
// may publish on, each captured by a stream or bucket of the cluster: the
// catalog, the run states, the policy, the audit trail, another tenant's
// run (a terminal subject), another pool's work, idempotency records and
// artifacts.
var ackTargets = []struct {
	name, stream, subject string
}{
	{"catalog entry", "KV_ab_catalog", "$KV.ab_catalog.payments_refund"},
	{"run state", "KV_ab_runs", "$KV.ab_runs.acme.01JATTACKRUN0000000000000"},
	{"policy", "KV_ab_policy", "$KV.ab_policy.acme"},
	{"limits", "KV_ab_limits", "$KV.ab_limits.acme"},
	{"audit record of another tenant", "AB_AUDIT", "ab.audit.acme.01JATTACKRUN0000000000000.rec"},
	{"terminal event of another tenant's run", "AB_RUNS", "ab.run.acme.01JATTACKRUN0000000000000.completed"},
	{"another pool's work", "AB_WORK", "ab.pool.other.request"},
	{"another pool's idempotency record", "KV_ab_idempotency_other", "$KV.ab_idempotency_other.k"},
	{"another pool's artifact metadata", "OBJ_ab_artifacts_other", "$O.ab_artifacts_other.M.x"},
}

// TestASiteWritesNothingOutsideItsSubjectsThroughJetStreamAcks attacks the
// claim of deploy/nats/leaf.conf ("everything this node and whatever
// connects to it can send ... through the hub is what that executor user
// may: nothing else of the cluster is reachable from the site"). The
// executor user may publish on ab.rejected.>, a subject the AB_REJECTED
// stream captures, with any reply subject: NATS permissions never look at
// the reply. JetStream answers every stored message with a publish ack on
// its reply subject, published by the server inside the ACTIONBUS account,
// where it is captured like any message: so whatever connects to the site
// (and the directly connected executor user alike) writes a message of its
// choosing of subject into every stream and bucket of the account — it
// overwrites catalog entries, run states, policies and limits, appends to
// another tenant's audit trail and run, and queues work for another pool.
//
// It failed while executors were users of ACTIONBUS: every target below
// got a message. Each pool's executors now live in an account of their
// own, and a reply they name crosses into ACTIONBUS as one the server made
// up there (_R_…), so the ack comes back to them and lands nowhere else.
func TestASiteWritesNothingOutsideItsSubjectsThroughJetStreamAcks(t *testing.T) {
	h := hub(t)
	_, siteConn := site(t, h, "executor")
	direct, err := nats.Connect(h.UserURL("executor"), nats.CustomInboxPrefix("_INBOX_executor"), nats.Name(t.Name()))
	require.NoError(t, err)
	t.Cleanup(direct.Close)
	// A run state the attack overwrites, as the dispatcher would have
	// stored it.
	ctx := ctxFor(t, 30*time.Second)
	runs, err := h.JS.KeyValue(ctx, "ab_runs")
	require.NoError(t, err)

	for _, party := range []struct {
		name string
		nc   *nats.Conn
	}{{"site", siteConn}, {"direct executor", direct}} {
		t.Run(party.name, func(t *testing.T) {
			// The control: the executor user stores on ab.rejected.> (and
			// the link carries it), so the ack comes.
			_, err = runs.Put(ctx, "acme.01JATTACKRUN0000000000000", []byte(`{"runId":"01JATTACKRUN0000000000000","phase":"acting"}`))
			require.NoError(t, err)
			had := map[string]uint64{}
			for _, tg := range ackTargets {
				had[tg.subject] = lastSeq(t, h.JS, tg.stream, tg.subject)
			}
			before := h.Stored(t, "AB_REJECTED", "ab.rejected.>")
			for _, tg := range ackTargets {
				require.NoError(t, party.nc.PublishMsg(&nats.Msg{Subject: "ab.rejected.attack43", Reply: tg.subject, Data: []byte(`{}`)}))
			}
			require.NoError(t, party.nc.Flush())
			require.Eventually(t, func() bool {
				return h.Stored(t, "AB_REJECTED", "ab.rejected.>") == before+len(ackTargets)
			}, 10*time.Second, 20*time.Millisecond, "the executor user stores on ab.rejected.>")
			for _, tg := range ackTargets {
				if seq := lastSeq(t, h.JS, tg.stream, tg.subject); seq != had[tg.subject] {
					m, err := h.JS.Stream(ctx, tg.stream)
					require.NoError(t, err)
					msg, err := m.GetMsg(ctx, seq)
					require.NoError(t, err)
					assert.Fail(t, tg.name+" written", "the %s user wrote %s into stream %s on %s", party.name, msg.Data, tg.stream, tg.subject)
				}
			}
			e, err := runs.Get(ctx, "acme.01JATTACKRUN0000000000000")
			require.NoError(t, err)
			assert.Contains(t, string(e.Value()), `"phase":"acting"`, "another tenant's run state was overwritten with %s", e.Value())
		})
	}
}

// lastSeq is the sequence of the last message stream holds on subject,
// 0 for none.
func lastSeq(t *testing.T, js jetstream.JetStream, stream, subject string) uint64 {
	t.Helper()
	ctx := ctxFor(t, 10*time.Second)
	st, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	m, err := st.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0
	}
	require.NoError(t, err)
	return m.Sequence
}

// TestASiteCannotBreakAnotherPoolsActionThroughJetStreamAcks is the
// consequence of the hole above for one victim: pool "other" hosts
// ledger.balance, which tenant acme runs. A site of the default pool
// publishes one message on ab.rejected.> whose reply subject is that
// action's catalog entry ($KV.ab_catalog.<key>, the key being the action's
// name as the catalog stores it). The action must still run for acme.
//
// It failed while executors were users of ACTIONBUS: JetStream's publish
// ack replaced the catalog entry, and acme's run of the other pool's
// action failed.
func TestASiteCannotBreakAnotherPoolsActionThroughJetStreamAcks(t *testing.T) {
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
	ctx := ctxFor(t, 60*time.Second)
	catalog, err := h.JS.KeyValue(ctx, "ab_catalog")
	require.NoError(t, err)
	var key string
	require.Eventually(t, func() bool {
		keys, err := catalog.ListKeys(ctx)
		if err != nil {
			return false
		}
		for k := range keys.Keys() {
			if strings.Contains(k, "ledger") {
				key = k
			}
		}
		return key != ""
	}, 10*time.Second, 20*time.Millisecond, "pool other's executor announced ledger.balance")
	acme, err := client.New(h.TenantConnect(t, "client-acme", "acme"), client.Options{Tenant: "acme"})
	require.NoError(t, err)
	call := client.RunRequest{Action: &client.ActionCall{Name: "ledger.balance", Args: map[string]any{}}}
	res, err := acme.Run(ctx, call, nil)
	require.NoError(t, err)
	require.Nil(t, res.Error, "acme runs ledger.balance before the attack: %+v", res)

	_, siteConn := site(t, h, "executor")
	before, err := catalog.Get(ctx, key)
	require.NoError(t, err)
	_, err = siteConn.Request("ab.rejected.attack43", nil, 5*time.Second) // the link carries the site's publishes
	require.NoError(t, err)
	require.NoError(t, siteConn.PublishMsg(&nats.Msg{Subject: "ab.rejected.attack43", Reply: "$KV.ab_catalog." + key, Data: []byte(`{}`)}))
	_, err = siteConn.Request("ab.rejected.attack43", nil, 5*time.Second) // published after the attack: the attack has arrived
	require.NoError(t, err)
	after, err := catalog.Get(ctx, key)
	require.NoError(t, err)
	assert.Equal(t, before.Revision(), after.Revision(), "the site replaced pool other's catalog entry %s with %s", key, after.Value())

	res, err = acme.Run(ctx, call, nil)
	require.NoError(t, err)
	assert.Nil(t, res.Error, "acme's run of pool other's action after the site's attack: %+v", res.Error)
}
