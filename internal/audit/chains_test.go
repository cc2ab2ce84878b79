package audit_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/audit"
	"github.com/actionbus/actionbus/internal/bus"
)

func registerEcho(ex *executor.Executor) error {
	return executor.Register(ex, executor.Action{Name: "t.echo"}, func(_ context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
		return executor.Result[map[string]any]{Output: in}, nil
	})
}

// startAuditor runs an auditor with cfg until the test ends, and returns
// a function that stops it and waits for it.
func startAuditor(t *testing.T, srv *actionbustest.Server, cfg audit.Config) (stop func()) {
	t.Helper()
	a, err := audit.New(srv.Connect(t), cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var stopped bool
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("the auditor did not stop")
		}
	}
	t.Cleanup(stop)
	return stop
}

// appendsOf returns the audit messages of a run on the stream, in order.
func appendsOf(t *testing.T, srv *actionbustest.Server, runID string) [][]events.AuditRecorded {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := srv.JS.OrderedConsumer(ctx, "AB_AUDIT", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"ab.audit.default." + runID + ".*"}})
	require.NoError(t, err)
	batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(500*time.Millisecond))
	require.NoError(t, err)
	var out [][]events.AuditRecorded
	for m := range batch.Messages() {
		e, err := bus.Decode(m.Subject(), m.Headers(), m.Data())
		require.NoError(t, err)
		recs := actionbustest.Recorded{Subject: m.Subject(), Event: e}.AuditRecords()
		require.NotEmpty(t, recs, "message %s holds audit records", m.Subject())
		out = append(out, recs)
	}
	return out
}

// A one-action run's records are appended together, in one message, once
// FlushAfter has passed since the first — not one message per event. The
// auditor reads each stream apart, so the run's terminal record may reach
// it before its request's: the window, not the terminal record, ends the
// batch, and the batch is ordered by when each event was stored.
func TestARunsRecordsAreAppendedTogether(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "ab.audit.>")
	st := srv.StartStack(t, actionbustest.StackOptions{NoAuditor: true, Register: registerEcho})
	startAuditor(t, srv, audit.Config{FlushAfter: 2 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "t.echo", Args: map[string]any{"x": 1.0}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status)
	rec.WaitForAudit(t, 0, 1, func(a client.AuditRecord) bool { return a.RunID == res.RunID && a.EventType == events.TypeRunCompleted })

	appends := appendsOf(t, srv, res.RunID)
	require.Len(t, appends, 1, "one append for the whole run")
	var types []string
	for _, r := range appends[0] {
		types = append(types, r.EventType)
	}
	assert.Equal(t, []string{events.TypeRunRequested, events.TypeActionRequested, events.TypeActionCompleted, events.TypeRunCompleted}, types,
		"one record per stored event of the run, in the order they were stored")
	assert.Equal(t, -1, audit.Verify(appends[0]))
}

// The records of a run that waits (here for an answer) are appended once
// FlushAfter passes, not held until the run ends; the records after the
// wait continue the same chain.
func TestAWaitingRunsRecordsAreAppendedAfterFlushAfter(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "ab.audit.>")
	st := srv.StartStack(t, actionbustest.StackOptions{NoAuditor: true, Register: registerEcho, Scenarios: `
scenarios:
  ask:
    decisions:
      - {type: clarify, question: "Which one?"}
      - {type: final, answer: done}
`})
	startAuditor(t, srv, audit.Config{FlushAfter: 20 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runID, err := st.Client.Start(ctx, client.RunRequest{Scenario: "ask"})
	require.NoError(t, err)
	waiting := rec.WaitForAudit(t, 0, 1, func(a client.AuditRecord) bool {
		return a.RunID == runID && a.EventType == events.TypeDecisionMade
	})
	assert.Equal(t, "clarify", waiting[0].Status)

	require.NoError(t, st.Client.Input(ctx, runID, "the blue one"))
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status)
	rec.WaitForAudit(t, 0, 1, func(a client.AuditRecord) bool { return a.RunID == runID && a.EventType == events.TypeRunCompleted })

	appends := appendsOf(t, srv, runID)
	assert.GreaterOrEqual(t, len(appends), 2, "appended before and after the wait")
	records, err := st.Client.AuditRecords(ctx, runID)
	require.NoError(t, err)
	assert.Equal(t, -1, audit.Verify(records), "one chain across appends")
	assert.True(t, audit.HasTerminal(records))
}

// Events handed to the auditor again — its consumers were reset, or an
// ack was lost after the append — are not recorded twice: the chain's last
// append names the events it holds.
func TestEventsDeliveredAgainAreNotRecordedTwice(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "ab.audit.>")
	st := srv.StartStack(t, actionbustest.StackOptions{NoAuditor: true, Register: registerEcho})
	stop := startAuditor(t, srv, audit.Config{FlushAfter: 2 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "t.echo", Args: map[string]any{}}}, nil)
	require.NoError(t, err)
	rec.WaitForAudit(t, 0, 1, func(a client.AuditRecord) bool { return a.RunID == res.RunID && a.EventType == events.TypeRunCompleted })
	stop()
	before := appendsOf(t, srv, res.RunID)
	require.Len(t, before, 1)

	// Every auditor consumer starts over from the first event.
	topo := bus.Topology{}
	for _, c := range topo.Consumers() {
		if !strings.HasPrefix(c.Config.Durable, "auditor-") {
			continue
		}
		require.NoError(t, srv.JS.DeleteConsumer(ctx, c.Stream, c.Config.Durable))
		_, err := srv.JS.CreateConsumer(ctx, c.Stream, c.Config)
		require.NoError(t, err)
	}
	startAuditor(t, srv, audit.Config{FlushAfter: 10 * time.Millisecond})
	// The restarted auditor has handled every event again once its
	// consumers hold nothing pending or unacknowledged.
	require.Eventually(t, func() bool {
		for _, c := range topo.Needs("auditor", "").Consumers {
			info, err := srv.JS.Consumer(ctx, c.Stream, c.Config.Durable)
			if err != nil {
				return false
			}
			ci, err := info.Info(ctx)
			if err != nil || ci.NumPending > 0 || ci.NumAckPending > 0 {
				return false
			}
		}
		return true
	}, 20*time.Second, 10*time.Millisecond)
	// (The stream is what counts: a core subscriber also sees an append
	// the stream refused for its expected last sequence.)
	assert.Equal(t, before, appendsOf(t, srv, res.RunID), "nothing appended to the run's chain")
}

// The auditor acknowledges by position, not each event: under concurrent
// one-action runs (four audited events each) it sends about one message
// per run — its appends, pulls and a few acknowledgements that each cover
// many events — where acknowledging each event took five or more. Every
// event is acknowledged in the end.
func TestTheAuditorSendsFewerMessagesThanARunHasEvents(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{NoAuditor: true, Register: registerEcho})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc := srv.Connect(t)
	a, err := audit.New(nc, audit.Config{})
	require.NoError(t, err)
	actx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(actx) }()
	t.Cleanup(func() { stop(); <-done })
	consumers := bus.Topology{}.Needs("auditor", "").Consumers
	consumerInfo := func(c bus.ConsumerSpec) *jetstream.ConsumerInfo {
		cons, err := srv.JS.Consumer(ctx, c.Stream, c.Config.Durable)
		require.NoError(t, err)
		info, err := cons.Info(ctx)
		require.NoError(t, err)
		return info
	}
	settled := func() bool {
		for _, c := range consumers {
			info := consumerInfo(c)
			if info.NumPending > 0 || info.NumAckPending > 0 || info.AckFloor.Stream != info.Delivered.Stream {
				return false
			}
		}
		return true
	}
	// A first run, its four events audited and acknowledged, shows the
	// auditor serving before its messages are counted.
	_, err = st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "t.echo", Args: map[string]any{}}}, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		delivered := uint64(0)
		for _, c := range consumers {
			delivered += consumerInfo(c).Delivered.Consumer
		}
		return delivered >= 4 && settled()
	}, 10*time.Second, 10*time.Millisecond, "the auditor audits a first run")

	before := nc.Stats()
	const runs, parallel = 200, 16
	var wg sync.WaitGroup
	for w := range parallel {
		wg.Go(func() {
			for i := w; i < runs; i += parallel {
				_, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "t.echo", Args: map[string]any{}}}, nil)
				assert.NoError(t, err)
			}
		})
	}
	wg.Wait()
	require.Eventually(t, settled, 20*time.Second, 10*time.Millisecond, "every audited event is acknowledged")
	after := nc.Stats()
	sent := float64(after.OutMsgs-before.OutMsgs) / runs
	received := float64(after.InMsgs-before.InMsgs) / runs
	t.Logf("the auditor per one-action run: sent %.2f, received %.2f messages", sent, received)
	// Acknowledging each event sends four acknowledgements per run, and
	// an append; by position, fewer messages than the run has events in
	// all (about 2.8 on two busy cores, where the appends of a slow run
	// split in two, and the acknowledgements on a clock are more per run).
	assert.Less(t, sent, 4.0, "fewer messages sent than the run's four audited events")
}

// A batch waits FlushAfter from its first record and until its last
// record is a settle old, so that a record stored earlier but read by a
// consumer a linger later joins it, and never past twice FlushAfter.
func TestFlushWait(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	at := func(n int) time.Time { return t0.Add(ms(n)) }
	const flushAfter, settle = 100 * time.Millisecond, 75 * time.Millisecond
	for _, tc := range []struct {
		name             string
		first, last, now int
		want             time.Duration
	}{
		{"the last record settled: now", 0, 10, 100, 0},
		{"the last record just settled: now", 0, 25, 100, 0},
		{"the last record recent: until it settles", 0, 90, 100, ms(65)},
		{"a record added just now: a whole settle", 0, 100, 100, settle},
		{"capped at twice FlushAfter", 0, 180, 190, ms(10)},
		{"past the cap: now", 0, 199, 200, 0},
		{"late timer, all settled: now", 0, 50, 400, 0},
		{"FlushAfter not passed (another batch's timer): until it has", 0, 0, 10, ms(90)},
		{"FlushAfter not passed, the last record recent: until it settles", 0, 60, 70, ms(65)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, audit.FlushWait(at(tc.first), at(tc.last), at(tc.now), flushAfter, settle))
		})
	}
}
