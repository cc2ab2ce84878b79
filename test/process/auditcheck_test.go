package process

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/audit"
	"github.com/actionbus/actionbus/internal/bus"
)

// storedEvent is an event stored in an audited stream.
type storedEvent struct {
	key, id, runID string // key: "STREAM/seq"
}

// readAll reads every message of stream on filters, in order, with an
// ordered consumer (no state left on the server).
func readAll(t *testing.T, ctx context.Context, js jetstream.JetStream, stream string, filters []string, each func(jetstream.Msg)) {
	t.Helper()
	st, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	if info.State.Msgs == 0 {
		return
	}
	last := info.State.LastSeq
	cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: filters})
	require.NoError(t, err)
	for {
		// A filtered read ends at the last message on its subjects,
		// which may be before the stream's last: an empty fetch ends it.
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(300*time.Millisecond))
		require.NoError(t, err)
		n := 0
		var seq uint64
		for m := range batch.Messages() {
			n++
			md, err := m.Metadata()
			require.NoError(t, err)
			seq = md.Sequence.Stream
			each(m)
		}
		if n == 0 || seq >= last {
			return
		}
	}
}

// auditedEvents returns the events of runs stored in the streams the
// auditor audits for runs (run events, requests, work items, fired timers:
// what its consumers but the rejected one read).
func auditedEvents(t *testing.T, ctx context.Context, js jetstream.JetStream, runs map[string]bool) []storedEvent {
	t.Helper()
	var out []storedEvent
	for _, cs := range (bus.Topology{}).Consumers() {
		if !strings.HasPrefix(cs.Config.Durable, "auditor-") || cs.Config.Durable == bus.ConsumerAuditorRejected {
			continue
		}
		readAll(t, ctx, js, cs.Stream, cs.Config.FilterSubjects, func(m jetstream.Msg) {
			e, err := bus.Decode(m.Subject(), m.Headers(), m.Data())
			require.NoError(t, err, "stored event on %s", m.Subject())
			runID, _ := e.Extensions()[events.ExtRunID].(string)
			if !runs[runID] {
				return
			}
			md, err := m.Metadata()
			require.NoError(t, err)
			out = append(out, storedEvent{key: fmt.Sprintf("%s/%d", cs.Stream, md.Sequence.Stream), id: e.ID(), runID: runID})
		})
	}
	return out
}

// auditRecords returns the audit records of runs, per run in chain order.
func auditRecords(t *testing.T, ctx context.Context, js jetstream.JetStream, runs map[string]bool) map[string][]events.AuditRecorded {
	t.Helper()
	out := map[string][]events.AuditRecorded{}
	readAll(t, ctx, js, "AB_AUDIT", []string{"ab.audit.>"}, func(m jetstream.Msg) {
		e, err := bus.Decode(m.Subject(), m.Headers(), m.Data())
		require.NoError(t, err)
		for _, r := range (actionbustest.Recorded{Subject: m.Subject(), Event: e}).AuditRecords() {
			if runs[r.RunID] {
				out[r.RunID] = append(out[r.RunID], r)
			}
		}
	})
	return out
}

// auditGaps compares the stored events of runs with their audit records:
// the events without a record, those with more than one, and the runs
// whose chain does not verify.
func auditGaps(t *testing.T, ctx context.Context, js jetstream.JetStream, runs map[string]bool) (missing, twice, broken []string, n int) {
	t.Helper()
	stored := auditedEvents(t, ctx, js, runs)
	chains := auditRecords(t, ctx, js, runs)
	count := map[string]int{}
	for runID, recs := range chains {
		for _, r := range recs {
			if r.Source != nil && r.Kind != audit.KindRejected {
				count[fmt.Sprintf("%s/%d %s", r.Source.Stream, r.Source.Seq, r.EventID)]++
			}
		}
		if i := audit.Verify(recs); i >= 0 {
			broken = append(broken, fmt.Sprintf("%s (record %d)", runID, i))
		}
	}
	for _, e := range stored {
		switch c := count[e.key+" "+e.id]; {
		case c == 0:
			missing = append(missing, e.runID+" "+e.key+" "+e.id)
		case c > 1:
			twice = append(twice, fmt.Sprintf("%s %s %s ×%d", e.runID, e.key, e.id, c))
		}
	}
	sort.Strings(missing)
	sort.Strings(twice)
	return missing, twice, broken, len(stored)
}

// requireAuditComplete waits (up to within) for every stored event of
// runs to have its audit record, then requires exactly one record per
// event and every run's chain to verify. It returns how many events it
// checked.
func requireAuditComplete(t *testing.T, ctx context.Context, js jetstream.JetStream, runs map[string]bool, within time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		missing, twice, broken, n := auditGaps(t, ctx, js, runs)
		if len(missing) == 0 || time.Now().After(deadline) {
			require.Empty(t, missing, "stored events without an audit record")
			require.Empty(t, twice, "stored events with more than one audit record")
			require.Empty(t, broken, "audit chains that do not verify")
			return n
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(250 * time.Millisecond): // poll interval of a deadline-bounded wait
		}
	}
}
