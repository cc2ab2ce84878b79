package attack43_test

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
// It FAILS while the hole is open: every target below gets a message.
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
