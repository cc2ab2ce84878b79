package dispatch_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
)

// A direct get answers with the stored message itself, which the server
// publishes inside the services' account on the request's reply subject,
// and no NATS permission checks a reply subject. A party that may both
// write a store and direct-get it can so have the server send a body of
// its choosing anywhere in the account: onto "$JS.API.CONSUMER.CREATE.AB_RUNS"
// (a consumer of another tenant's events delivered to its own inbox),
// "$JS.API.STREAM.PURGE.AB_RUNS" (every run's events gone), or another
// tenant's run state. (A JetStream API answer or publish ack reflected
// there is refused: the server decodes API requests strictly, and those
// documents carry fields no request has.) The rule that closes it
// (docs/security.md): no user but the dispatcher may direct-get a store it
// may write; artifact stores, the idempotency and limits buckets answer no
// direct gets at all. The attacks run as the deployed users, each on a
// store it writes.

// reflection is one store a deployed user writes, and the direct get that
// would hand what it wrote back.
type reflection struct {
	name, user, store, get string
}

var reflections = []reflection{
	{"the executor's idempotency bucket", "executor", "$KV.ab_idempotency_default.attack",
		"$JS.API.DIRECT.GET.KV_ab_idempotency_default.$KV.ab_idempotency_default.attack"},
	{"the planner's limits bucket", "planner", "$KV.ab_planner_limits.attack",
		"$JS.API.DIRECT.GET.KV_ab_planner_limits.$KV.ab_planner_limits.attack"},
	{"the executor's artifact store", "executor", "$O.ab_artifacts_default.C.attack",
		"$JS.API.DIRECT.GET.OBJ_ab_artifacts_default.$O.ab_artifacts_default.C.attack"},
	{"the auditor's audit stream", "auditor", "ab.audit.acme.01JATTACKRUN0000000000000.rec",
		"$JS.API.DIRECT.GET.AB_AUDIT.ab.audit.acme.01JATTACKRUN0000000000000.rec"},
}

// reflect stores body on r.store as r.user (waiting for the store's
// acknowledgement) and direct-gets it with the reply subject reply.
func (r reflection) reflect(t *testing.T, nc *nats.Conn, body, reply string) {
	t.Helper()
	_, err := nc.RequestMsg(&nats.Msg{Subject: r.store, Data: []byte(body), Header: nats.Header{"Nats-Sequence": {"1"}}}, 5*time.Second)
	require.NoError(t, err, "%s stores on %s", r.user, r.store)
	require.NoError(t, nc.PublishMsg(&nats.Msg{Subject: r.get, Reply: reply}))
	require.NoError(t, nc.Flush())
}

// connect connects as r.user, with its inbox prefix.
func (r reflection) connect(t *testing.T, srv *actionbustest.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(srv.UserURL(r.user), nats.CustomInboxPrefix("_INBOX_"+r.user))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

func TestNoServiceUserReflectsADirectGetOntoTheJetStreamAPI(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{Users: true, Tenants: []string{"acme"}})
	_, err := srv.JS.Publish(ctxT(t), "ab.run.acme.01JATTACKRUN0000000000000.decision", []byte(`{"secret":"acme's data"}`))
	require.NoError(t, err)
	for i, r := range reflections {
		t.Run(r.name, func(t *testing.T) {
			nc := r.connect(t, srv)
			inbox := fmt.Sprintf("_INBOX_%s.steal%d", r.user, i)
			got := make(chan *nats.Msg, 16)
			sub, err := nc.ChanSubscribe(inbox, got)
			require.NoError(t, err)
			defer sub.Unsubscribe() //nolint:errcheck
			r.reflect(t, nc, `{"stream_name":"AB_RUNS","config":{"deliver_subject":"`+inbox+
				`","deliver_policy":"all","ack_policy":"none","filter_subject":"ab.run.acme.>"}}`, "$JS.API.CONSUMER.CREATE.AB_RUNS")
			assert.Never(t, func() bool { return len(got) > 0 }, 2*time.Second, 50*time.Millisecond,
				"the %s user read another tenant's run events through a consumer its direct get created", r.user)
		})
	}
}

func TestNoServiceUserPurgesAStreamThroughADirectGet(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{Users: true, Tenants: []string{"acme"}})
	ctx := ctxT(t)
	runs, err := srv.JS.Stream(ctx, "AB_RUNS")
	require.NoError(t, err)
	// stored may still run after assert.Never returned (testify runs the
	// condition on a goroutine of its own) and so must not report to t.
	stored := func(ctx context.Context) (uint64, error) {
		info, err := runs.Info(ctx)
		if err != nil {
			return 0, err
		}
		return info.State.Msgs, nil
	}
	for _, r := range reflections {
		t.Run(r.name, func(t *testing.T) {
			nc := r.connect(t, srv)
			_, err := srv.JS.Publish(ctx, "ab.run.acme.01JATTACKRUN0000000000000.decision", []byte(`{"secret":"acme's data"}`))
			require.NoError(t, err)
			before, err := stored(ctx)
			require.NoError(t, err)
			r.reflect(t, nc, `{}`, "$JS.API.STREAM.PURGE.AB_RUNS")
			assert.Never(t, func() bool {
				n, err := stored(ctx)
				return err != nil || n < before
			}, time.Second, 50*time.Millisecond,
				"the %s user purged every tenant's run events", r.user)
		})
	}
}

func TestNoServiceUserReflectsADirectGetOntoARunsState(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{Users: true, Tenants: []string{"acme"}})
	ctx := ctxT(t)
	runs, err := srv.JS.KeyValue(ctx, "ab_runs")
	require.NoError(t, err)
	for _, r := range reflections {
		t.Run(r.name, func(t *testing.T) {
			nc := r.connect(t, srv)
			key := "01JATTACKRUN0000000000000"
			_, err = runs.Put(ctx, key, []byte(`{"runId":"01JATTACKRUN0000000000000","tenant":"acme","phase":"acting"}`))
			require.NoError(t, err)
			r.reflect(t, nc, `{"runId":"01JATTACKRUN0000000000000","tenant":"acme","phase":"forged"}`, "$KV.ab_runs."+key)
			assert.Never(t, func() bool {
				e, err := runs.Get(ctx, key)
				return err != nil || string(e.Value()) != `{"runId":"01JATTACKRUN0000000000000","tenant":"acme","phase":"acting"}`
			}, time.Second, 50*time.Millisecond, "the %s user overwrote another tenant's run state", r.user)
		})
	}
}
