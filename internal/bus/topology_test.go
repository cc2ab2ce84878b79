package bus_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

func TestProvisionIsIdempotent(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{SkipProvision: true})
	ctx := ctxT(t)
	topo := bus.Topology{Pools: []string{"default", "gpu"}}
	require.NoError(t, topo.Provision(ctx, srv.JS))
	require.NoError(t, topo.Provision(ctx, srv.JS), "provisioning twice changes nothing")
	for _, svc := range []string{"dispatcher", "planner", "auditor", "client"} {
		assert.NoError(t, topo.Check(ctx, srv.JS, topo.Needs(svc, "")), svc)
	}
	assert.NoError(t, topo.Check(ctx, srv.JS, topo.Needs("executor", "gpu")))

	for _, cs := range topo.Consumers() {
		cons, err := srv.JS.Consumer(ctx, cs.Stream, cs.Config.Durable)
		require.NoError(t, err)
		cfg := cons.CachedInfo().Config
		want, ackPolicy := bus.DefaultMaxAckPending, jetstream.AckExplicitPolicy
		// Action requests are run again only a few times (an executor
		// answers the last delivery delivery_exhausted); the services'
		// idempotent handlers are retried through a failover.
		wantDeliver, wantAckWait := bus.HandlerMaxDeliver, bus.DefaultAckWait
		switch {
		case strings.HasPrefix(cs.Config.Durable, "auditor-"):
			// Events wait while their records are batched, and are
			// acknowledged by position.
			want, ackPolicy = bus.AuditorMaxAckPending, jetstream.AckAllPolicy
		case strings.HasPrefix(cs.Config.Durable, "pool-"):
			wantDeliver = bus.DefaultMaxDeliver
		case strings.HasPrefix(cs.Config.Durable, "sink-"):
			// A sink copies every record, in order, one at a time, and
			// has one back within 10 s of a crash mid-write.
			want, wantDeliver, wantAckWait = 1, -1, 10*time.Second
			assert.Equal(t, jetstream.DeliverAllPolicy, cfg.DeliverPolicy, cs.Config.Durable)
		}
		assert.Equal(t, want, cfg.MaxAckPending, cs.Config.Durable)
		assert.Equal(t, ackPolicy, cfg.AckPolicy, cs.Config.Durable)
		assert.Equal(t, wantDeliver, cfg.MaxDeliver, cs.Config.Durable)
		assert.Empty(t, cfg.BackOff, "naks carry their own delays: %s", cs.Config.Durable)
		assert.Equal(t, wantAckWait, cfg.AckWait, cs.Config.Durable)
		assert.Empty(t, cfg.DeliverSubject, "every consumer is pulled: %s", cs.Config.Durable)
	}
	for _, sc := range topo.Streams() {
		st, err := srv.JS.Stream(ctx, sc.Name)
		require.NoError(t, err)
		assert.Equal(t, 2*time.Minute, st.CachedInfo().Config.Duplicates, sc.Name)
	}
}

func TestCheckNamesWhatIsMissing(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{SkipProvision: true})
	ctx := ctxT(t)
	topo := bus.Topology{}
	err := topo.Check(ctx, srv.JS, topo.Needs("dispatcher", ""))
	require.ErrorIs(t, err, actionbus.ErrMissingTopology)
	for _, want := range []string{"stream AB_RUNS", "bucket ab_runs", "actionbus provision"} {
		assert.Contains(t, err.Error(), want)
	}
	err = topo.Check(ctx, srv.JS, topo.Needs("executor", "gpu"))
	assert.Contains(t, err.Error(), "consumer AB_WORK/pool-gpu")
}

func TestTopologyRejectsBadNames(t *testing.T) {
	assert.Error(t, bus.Topology{Prefix: "a.b"}.Validate())
	assert.Error(t, bus.Topology{Pools: []string{"gpu.*"}}.Validate())
	assert.Error(t, bus.Topology{Replicas: 7}.Validate())
	assert.NoError(t, bus.Topology{Prefix: "acme", Pools: []string{"io-bound"}}.Validate())
}

func TestLiveEventsAreInNoStream(t *testing.T) {
	s := events.MustSubjects("ab")
	const runID = "01J0000000000000000000000R"
	live := 0
	for _, e := range events.Catalog {
		if e.Type == events.TypeActionRequested || e.Type == events.TypeEventRejected || e.Type == events.TypeAuditRecorded || e.Type == events.TypeAuditAppended {
			continue // not per-run subjects
		}
		subject, err := s.SubjectFor(e.Type, "default", runID, "gpu")
		require.NoError(t, err)
		stored := false
		for _, sc := range (bus.Topology{}).Streams() {
			for _, f := range sc.Subjects {
				stored = stored || subjectMatches(f, subject)
				// The requests stream captures the ingress's form of a
				// client's subject and stores it under the subject itself.
				if sc.SubjectTransform != nil {
					tenant, run, verb, ok := s.RequestFromSubject(subject)
					stored = stored || ok && subjectMatches(f, s.Ingested(tenant, run, verb))
				}
			}
		}
		if e.Live {
			live++
		}
		assert.Equal(t, !e.Live, stored, "%s (%s): stored %v, live %v", e.Type, subject, stored, e.Live)
	}
	assert.Equal(t, 3, live, "run.started, run.progress and pool.announced are live")
}

// subjectMatches reports whether a NATS subject filter matches subject.
func subjectMatches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, tok := range f {
		if tok == ">" {
			return len(s) > i
		}
		if i >= len(s) || (tok != "*" && tok != s[i]) {
			return false
		}
	}
	return len(f) == len(s)
}

// Each pool has its own idempotency bucket, whose stream refuses rollups,
// purges and message deletes, and stays so when provisioned again; keys
// are still created, updated and released one by one (what the
// executor's reservations need).
func TestIdempotencyBucketsArePerPoolAndSealed(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{SkipProvision: true})
	ctx := ctxT(t)
	topo := bus.Topology{Pools: []string{"default", "gpu"}, IdempotencyTTL: time.Hour}
	require.NoError(t, topo.Provision(ctx, srv.JS))
	topo.IdempotencyTTL = 2 * time.Hour
	require.NoError(t, topo.Provision(ctx, srv.JS), "a sealed bucket is provisioned again")
	for _, pool := range topo.Pools {
		st, err := srv.JS.Stream(ctx, "KV_"+topo.BucketIdempotency(pool))
		require.NoError(t, err)
		cfg := st.CachedInfo().Config
		assert.False(t, cfg.AllowRollup, pool)
		assert.True(t, cfg.DenyPurge, pool)
		assert.True(t, cfg.DenyDelete, pool)
		assert.Equal(t, 2*time.Hour, cfg.MaxAge, "the TTL still follows the topology")
		assert.Error(t, st.Purge(ctx), "a purge of %s", pool)

		kv, err := srv.JS.KeyValue(ctx, topo.BucketIdempotency(pool))
		require.NoError(t, err)
		rev, err := kv.Create(ctx, pool+".default.k", []byte(`{"state":"reserved"}`))
		require.NoError(t, err)
		rev, err = kv.Update(ctx, pool+".default.k", []byte(`{"state":"reserved"}`), rev)
		require.NoError(t, err)
		require.NoError(t, kv.Delete(ctx, pool+".default.k", jetstream.LastRevision(rev)), "a failed call releases its key")
		_, err = kv.Create(ctx, pool+".default.k", []byte(`{"state":"reserved"}`))
		require.NoError(t, err, "a released key is reserved again")
		assert.Error(t, kv.Purge(ctx, pool+".default.k"), "a purge (a rollup of the key) is refused")
	}
	assert.NotEqual(t, topo.BucketIdempotency("default"), topo.BucketIdempotency("gpu"))
}

// An auditor consumer provisioned when the auditor acknowledged each
// event cannot be changed to acknowledge by position in place: provision
// replaces it, starting after its ack floor, so the events it did not
// acknowledge are delivered again (and named as possibly recorded: the
// metadata says up to where it had delivered), and none is skipped.
// Provisioning again keeps the replacement.
func TestProvisionReplacesAnAuditorConsumerThatAcknowledgedEachEvent(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{SkipProvision: true})
	ctx := ctxT(t)
	topo := bus.Topology{}
	require.NoError(t, topo.Provision(ctx, srv.JS))
	var spec bus.ConsumerSpec
	for _, cs := range topo.Consumers() {
		if cs.Config.Durable == bus.ConsumerAuditorRuns {
			spec = cs
		}
	}
	// The consumer as provisioned before: each event acknowledged.
	require.NoError(t, srv.JS.DeleteConsumer(ctx, spec.Stream, spec.Config.Durable))
	old := spec.Config
	old.AckPolicy = jetstream.AckExplicitPolicy
	cons, err := srv.JS.CreateConsumer(ctx, spec.Stream, old)
	require.NoError(t, err)
	for i := range 5 {
		_, err := srv.JS.Publish(ctx, "ab.run.default.01JB00000000000000000000"+string(rune('A'+i))+"0.decision", []byte("{}"))
		require.NoError(t, err)
	}
	batch, err := cons.Fetch(4, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	var got []jetstream.Msg
	for m := range batch.Messages() {
		got = append(got, m)
	}
	require.Len(t, got, 4)
	require.NoError(t, got[0].DoubleAck(ctx))
	require.NoError(t, got[1].DoubleAck(ctx))
	require.NoError(t, got[3].DoubleAck(ctx)) // the third is left unacknowledged
	seqOf := func(m jetstream.Msg) uint64 {
		md, err := m.Metadata()
		require.NoError(t, err)
		return md.Sequence.Stream
	}

	require.NoError(t, topo.Provision(ctx, srv.JS))
	cons, err = srv.JS.Consumer(ctx, spec.Stream, spec.Config.Durable)
	require.NoError(t, err)
	cfg := cons.CachedInfo().Config
	assert.Equal(t, jetstream.AckAllPolicy, cfg.AckPolicy)
	assert.Equal(t, jetstream.DeliverByStartSequencePolicy, cfg.DeliverPolicy)
	assert.Equal(t, seqOf(got[2]), cfg.OptStartSeq, "starts at the first event not acknowledged")
	assert.Equal(t, strconv.FormatUint(seqOf(got[3]), 10), cfg.Metadata[bus.MetaDeliveredBefore])

	require.NoError(t, topo.Provision(ctx, srv.JS), "provisioning again changes nothing")
	cons, err = srv.JS.Consumer(ctx, spec.Stream, spec.Config.Durable)
	require.NoError(t, err)
	info := cons.CachedInfo()
	assert.Equal(t, seqOf(got[2]), info.Config.OptStartSeq)
	assert.Equal(t, strconv.FormatUint(seqOf(got[3]), 10), info.Config.Metadata[bus.MetaDeliveredBefore])
	assert.EqualValues(t, 0, info.Delivered.Consumer, "the replacement has delivered nothing yet")

	batch, err = cons.Fetch(10, jetstream.FetchMaxWait(time.Second))
	require.NoError(t, err)
	var seqs []uint64
	for m := range batch.Messages() {
		seqs = append(seqs, seqOf(m))
	}
	assert.Equal(t, []uint64{seqOf(got[2]), seqOf(got[3]), seqOf(got[3]) + 1}, seqs,
		"the unacknowledged event, the one acknowledged past it, and the one never delivered")
}
