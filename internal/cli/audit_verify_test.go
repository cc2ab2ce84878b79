package cli_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/audit"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/cli"
)

// rewrite drops records drop (indexes) from a run's chain and recomputes
// what follows them as someone holding the sink but not the auditor's key
// would: numbers, links and hashes, and signatures with a key of their
// own. It returns the records and the index of the first signed record
// after the cut (where verification must fail).
func rewrite(t *testing.T, recs []audit.SinkRecord, drop ...int) ([]audit.SinkRecord, int) {
	t.Helper()
	forger, err := nkeys.CreateAccount()
	require.NoError(t, err)
	pub, _ := forger.PublicKey()
	var out []audit.SinkRecord
	for i, r := range recs {
		if !containsInt(drop, i) {
			out = append(out, r)
		}
	}
	from, firstSigned := drop[0], -1
	for i := from; i < len(out); i++ {
		r := &out[i].AuditRecorded
		r.PrevHash, r.N = out[i-1].Hash, out[i-1].N+1
		if r.Sig != "" {
			r.Signer = pub
		}
		r.Hash = audit.ChainHash(*r)
		if r.Sig != "" {
			sig, err := forger.Sign([]byte("actionbus.audit.v2:" + r.Hash))
			require.NoError(t, err)
			r.Sig = base64.RawURLEncoding.EncodeToString(sig)
			if firstSigned < 0 {
				firstSigned = i
			}
		}
	}
	require.GreaterOrEqual(t, firstSigned, from, "a signed record follows the cut")
	return out, firstSigned
}

func containsInt(xs []int, x int) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

func verify(ctx context.Context, args ...string) (int, string) {
	var out, errOut bytes.Buffer
	code := cli.Execute(ctx, append([]string{"audit", "verify"}, args...), nil, &out, &errOut)
	return code, out.String() + errOut.String()
}

// Issue 36, item 4: export a run's audit, drop two records, recompute
// numbers, links and hashes (and sign with a key of one's own): the JSONL
// and SQLite sinks fail verify against the auditor's pinned key, naming
// the record; the stream with an append removed fails naming the gap.
func TestAuditVerifyRefusesASinkRewrittenWithoutTheAuditorKey(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "ab.audit.*.*.*")
	dir := t.TempDir()
	jsonl, db := filepath.Join(dir, "audit.jsonl"), filepath.Join(dir, "audit.db")
	st := srv.StartStack(t, actionbustest.StackOptions{AuditJSONL: jsonl, AuditSQLite: db, AuditMaxBatch: 3, Scenarios: echoScenario, Register: registerEcho})
	require.NotEmpty(t, st.AuditorKey)
	key := "--auditor-key=" + st.AuditorKey
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "echo"}, nil)
	require.NoError(t, err)
	for _, typ := range []string{events.TypeRunRequested, events.TypeRunCompleted} {
		rec.WaitForAudit(t, 0, 1, func(a client.AuditRecord) bool { return a.RunID == res.RunID && a.EventType == typ })
	}
	n := 0
	for _, r := range rec.All() {
		n += len(r.AuditRecords())
	}
	require.Eventually(t, func() bool {
		a, errA := audit.ReadJSONL(jsonl, res.RunID)
		b, errB := audit.ReadSQLite(ctx, db, res.RunID)
		return errA == nil && errB == nil && len(a) == n && len(b) == n
	}, 20*time.Second, 10*time.Millisecond)
	for _, src := range []string{"--jsonl=" + jsonl, "--sqlite=" + db} {
		code, out := verify(ctx, res.RunID, src, key)
		require.Equal(t, 0, code, out)
		assert.Contains(t, out, fmt.Sprintf("intact: %d records", n))
		assert.Contains(t, out, "format 2, signed by "+st.AuditorKey)
	}

	// JSONL: records 2 and 3 dropped, the rest rechained and re-signed.
	recs, err := audit.ReadJSONL(jsonl, res.RunID)
	require.NoError(t, err)
	forged, at := rewrite(t, recs, 1, 2)
	var b strings.Builder
	for _, r := range forged {
		line, err := json.Marshal(r)
		require.NoError(t, err)
		b.Write(append(line, '\n'))
	}
	require.NoError(t, os.WriteFile(jsonl, []byte(b.String()), 0o600))
	require.Nil(t, audit.Check(sinkChain(forged)).Broken, "the rewrite is consistent: only the pinned key tells")
	code, out := verify(ctx, res.RunID, "--jsonl="+jsonl, key)
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, fmt.Sprintf("broken at record %d of %d in %s (stream sequence %d,", at+1, n-2, jsonl, forged[at].StreamSeq))
	// Record 1 stays, but when its append's signature was on a dropped
	// record (the run's first records are usually appended together),
	// nothing proves it either.
	unproven := at + 1
	if recs[0].StreamSeq == recs[1].StreamSeq {
		unproven = 1
	}
	assert.Contains(t, out, fmt.Sprintf("records %d-%d were written or rewritten without it", unproven, at+1))

	// SQLite: the same rewrite, row by row.
	rows, err := audit.ReadSQLite(ctx, db, res.RunID)
	require.NoError(t, err)
	forged, at = rewrite(t, rows, 1, 2)
	sqlDB, err := sql.Open("sqlite", db)
	require.NoError(t, err)
	for _, i := range []int{1, 2} {
		_, err = sqlDB.Exec(`DELETE FROM audit_records WHERE stream_seq = ? AND idx = ?`, rows[i].StreamSeq, rows[i].Index)
		require.NoError(t, err)
	}
	for _, r := range forged[1:] {
		raw, err := json.Marshal(r.AuditRecorded)
		require.NoError(t, err)
		_, err = sqlDB.Exec(`UPDATE audit_records SET record = ?, hash = ? WHERE stream_seq = ? AND idx = ?`, string(raw), r.Hash, r.StreamSeq, r.Index)
		require.NoError(t, err)
	}
	require.NoError(t, sqlDB.Close())
	code, out = verify(ctx, res.RunID, "--sqlite="+db, key)
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, fmt.Sprintf("broken at record %d of %d in %s (stream sequence %d,", at+1, n-2, db, forged[at].StreamSeq))

	// The stream: the run's second append removed.
	stream, err := srv.JS.Stream(ctx, "AB_AUDIT")
	require.NoError(t, err)
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"ab.audit.default." + res.RunID + ".*"}})
	require.NoError(t, err)
	batch, err := cons.Fetch(100, jetstream.FetchMaxWait(time.Second))
	require.NoError(t, err)
	var seqs []uint64
	var sizes []int
	for m := range batch.Messages() {
		md, _ := m.Metadata()
		seqs = append(seqs, md.Sequence.Stream)
		sizes = append(sizes, len(actionbustest.Recorded{Subject: m.Subject(), Event: decodeEvent(t, m)}.AuditRecords()))
	}
	require.Greater(t, len(seqs), 2)
	require.NoError(t, stream.DeleteMsg(ctx, seqs[1]))
	code, out = verify(ctx, "--nats", srv.URL, res.RunID, key)
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, fmt.Sprintf("broken at record %d of %d in the audit stream (stream sequence %d,", sizes[0]+1, n-sizes[1], seqs[2]))
	assert.Contains(t, out, fmt.Sprintf("records missing before record %d: it is number %d, the record before it %d", sizes[0]+1, sizes[0]+sizes[1]+1, sizes[0]))
}

func sinkChain(recs []audit.SinkRecord) []events.AuditRecorded {
	out := make([]events.AuditRecorded, len(recs))
	for i, r := range recs {
		out[i] = r.AuditRecorded
	}
	return out
}

// A chain written before chains were signed (no "v") still verifies, as
// format 1, and says so; --require-signed refuses it; a signed chain
// rewritten as format 1 after its first records fails.
func TestAuditVerifyReadsAFormat1ChainAsUnsigned(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dir := t.TempDir()
	old := filepath.Join(dir, "old.jsonl")
	// A run id as every run's is (a ULID: audit verify refuses others).
	const run = "01H" + "00000000000000000000000"
	var b strings.Builder
	prev := ""
	for i, typ := range []string{events.TypeRunRequested, events.TypeRunStarted, events.TypeRunCompleted} {
		status := []string{"requested", "started", "completed"}[i]
		// A format-1 line as the auditor wrote it before: no v, n, source, signer or sig.
		r := events.AuditRecorded{RunID: run, EventID: fmt.Sprintf("E%d", i), EventType: typ, EventSubject: "ab.run.default." + run + ".x",
			EventSource: "/actionbus/dispatcher", EventTime: time.Unix(int64(1700000000+i), 0).UTC(), Kind: audit.KindRun, Status: status,
			PayloadHash: strings.Repeat("0", 64), PrevHash: prev}
		r.Hash = audit.ChainHash(r)
		prev = r.Hash
		line, err := json.Marshal(audit.SinkRecord{StreamSeq: uint64(i + 1), AuditRecorded: r})
		require.NoError(t, err)
		require.NotContains(t, string(line), `"v":`)
		b.Write(append(line, '\n'))
	}
	require.NoError(t, os.WriteFile(old, []byte(b.String()), 0o600))
	seed, err := audit.NewKey()
	require.NoError(t, err)
	kp, _ := nkeys.FromSeed(seed)
	pub, _ := kp.PublicKey()

	code, out := verify(ctx, run, "--jsonl="+old, "--auditor-key="+pub)
	assert.Equal(t, 0, code, out)
	assert.Contains(t, out, "intact: 3 records in "+old+", format 1, unsigned, head "+prev)
	code, out = verify(ctx, run, "--jsonl="+old, "--auditor-key="+pub, "--require-signed")
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "3 of 3 records in "+old+" are format 1 (unsigned)")
}

// An event of the run stored in the source stream that the auditor never
// recorded (here its consumer was moved past it while the auditor was
// down) is a gap in the source sequences the chain covers: every record
// still verifies, but verify fails and names the event's stream sequence.
func TestAuditVerifyNamesAStoredEventWithoutARecord(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{NoAuditor: true, Scenarios: echoScenario, Register: registerEcho})
	seed, err := audit.NewKey()
	require.NoError(t, err)
	kp, _ := nkeys.FromSeed(seed)
	pub, _ := kp.PublicKey()
	runAuditor := func() (stop func()) {
		a, err := audit.New(srv.Connect(t), audit.Config{Seed: seed, FlushAfter: 10 * time.Millisecond})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		return func() { cancel(); require.NoError(t, <-done) }
	}
	stop := runAuditor()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "echo"}, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		recs, err := st.Client.AuditRecords(ctx, res.RunID)
		return err == nil && audit.HasTerminal(recs) && len(recs) >= 8
	}, 20*time.Second, 20*time.Millisecond)
	stop()
	// The stopped auditor's waiting pull is gone (an idle auditor leaves
	// one at the server): the next event is not handed to it.
	idle, err := srv.JS.Consumer(ctx, "AB_RUNS", "auditor-runs")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := idle.Info(ctx)
		return err == nil && info.NumWaiting == 0
	}, 20*time.Second, 20*time.Millisecond, "the stopped auditor's pull is gone")

	// Two events for the run while the auditor is down; the first is
	// taken off its consumer unrecorded.
	eb, err := bus.Open(srv.Connect(t), bus.BusConfig{Source: "/test"})
	require.NoError(t, err)
	note := func() {
		step := &events.RunStep{RunID: res.RunID, Name: "note", Status: "info", Message: "late note"}
		_, err := eb.Emit(ctx, events.TypeRunStep, events.NewID(), events.DefaultTenant, res.RunID, "", step)
		require.NoError(t, err)
	}
	note()
	cons, err := srv.JS.Consumer(ctx, "AB_RUNS", "auditor-runs")
	require.NoError(t, err)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	var lost uint64
	for m := range batch.Messages() {
		md, _ := m.Metadata()
		require.Equal(t, events.TypeRunStep, m.Headers().Get("ce-type"), "the next event the auditor would read is the note")
		lost = md.Sequence.Stream
		require.NoError(t, m.DoubleAck(ctx))
	}
	require.NotZero(t, lost)
	note()
	runAuditor()
	require.Eventually(t, func() bool {
		recs, err := st.Client.AuditRecords(ctx, res.RunID)
		return err == nil && slices.ContainsFunc(recs, func(r client.AuditRecord) bool { return r.Summary == "note" })
	}, 20*time.Second, 20*time.Millisecond)

	code, out := verify(ctx, "--nats", srv.URL, "--auditor-key="+pub, res.RunID)
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, fmt.Sprintf("gap: the event at AB_RUNS sequence %d (%s) has no record in the audit stream", lost, events.TypeRunStep))
}

// TestAuditVerifyHoldsASinkAgainstTheStream: a result forged after the run
// ended is recorded as a duplicate after the terminal record. Cutting the
// sink back to the terminal record's append leaves a chain intact link by
// link and signed, ending in its terminal record; verify holds the sink
// against the audit stream and says it was truncated.
func TestAuditVerifyHoldsASinkAgainstTheStream(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	runs := srv.Record(t, "ab.run.>")
	jsonl := filepath.Join(t.TempDir(), "audit.jsonl")
	st := srv.StartStack(t, actionbustest.StackOptions{AuditJSONL: jsonl, Scenarios: echoScenario, Register: registerEcho})
	key := "--auditor-key=" + st.AuditorKey
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "echo"}, nil)
	require.NoError(t, err)
	var done events.ActionCompleted
	runs.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
		return r.Event != nil && r.Type() == events.TypeActionCompleted && events.DataAs(r.Event, &done) == nil && done.RunID == res.RunID
	})
	require.Eventually(t, func() bool {
		recs, err := audit.ReadJSONL(jsonl, res.RunID)
		return err == nil && audit.HasTerminal(sinkChain(recs))
	}, 20*time.Second, 20*time.Millisecond)

	// An executor answers the call again after the run ended: recorded
	// as a duplicate, after the terminal record.
	forger, err := bus.Open(srv.Connect(t), bus.BusConfig{Source: "/forger"})
	require.NoError(t, err)
	forged := done
	forged.Output = map[string]any{"forged": true}
	_, err = forger.Emit(ctx, events.TypeActionCompleted, events.NewID(), events.DefaultTenant, res.RunID, "", &forged)
	require.NoError(t, err)
	var recs []audit.SinkRecord
	require.Eventually(t, func() bool {
		recs, err = audit.ReadJSONL(jsonl, res.RunID)
		return err == nil && slices.ContainsFunc(recs, func(r audit.SinkRecord) bool { return r.Status == "duplicate" })
	}, 20*time.Second, 20*time.Millisecond)
	code, out := verify(ctx, "--nats", srv.URL, res.RunID, "--jsonl="+jsonl, key)
	require.Equal(t, 0, code, out)

	// Cut the sink back to the end of the append holding the terminal
	// record: every record left is signed and linked.
	terminal := slices.IndexFunc(recs, func(r audit.SinkRecord) bool {
		return r.Kind == audit.KindRun && r.Status == "completed"
	})
	require.GreaterOrEqual(t, terminal, 0)
	var b strings.Builder
	for _, r := range recs {
		if r.StreamSeq > recs[terminal].StreamSeq {
			break
		}
		line, err := json.Marshal(r)
		require.NoError(t, err)
		b.Write(append(line, '\n'))
	}
	require.NoError(t, os.WriteFile(jsonl, []byte(b.String()), 0o600))
	code, out = verify(ctx, "--nats", srv.URL, res.RunID, "--jsonl="+jsonl, key)
	assert.Equal(t, 1, code, "a sink cut back past a forgery's record verified: %s", out)
	assert.Contains(t, out, "truncated: the audit stream holds")
}

// echoScenario is a run of one t.echo call, then a final answer.
const echoScenario = `
scenarios:
  echo:
    decisions:
      - {type: action, name: t.echo, args: {}}
      - {type: final, answer: ok}
`

// registerEcho registers t.echo, which answers its input.
func registerEcho(ex *executor.Executor) error {
	return executor.Register(ex, executor.Action{Name: "t.echo"}, func(_ context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
		return executor.Result[map[string]any]{Output: in}, nil
	})
}

// The auditor writes a run's records a moment after its events: verify of
// a run that has ended waits (--settle) for its terminal record instead of
// calling the chain truncated, and reports it cut off only when the wait
// is over.
func TestAuditVerifyWaitsForTheAuditorToRecordAnEndedRun(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{NoAuditor: true, Scenarios: echoScenario, Register: registerEcho})
	seed, err := audit.NewKey()
	require.NoError(t, err)
	kp, _ := nkeys.FromSeed(seed)
	pub, _ := kp.PublicKey()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "echo"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status)

	// No auditor yet: without a wait, nothing is recorded.
	code, out := verify(ctx, "--nats", srv.URL, "--auditor-key="+pub, "--settle", "0", res.RunID)
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, "no audit records")

	type result struct {
		code int
		out  string
	}
	done := make(chan result, 1)
	go func() {
		code, out := verify(ctx, "--nats", srv.URL, "--auditor-key="+pub, "--settle", "40s", res.RunID)
		done <- result{code, out}
	}()
	require.Never(t, func() bool { return len(done) > 0 }, 500*time.Millisecond, 20*time.Millisecond, "verify waits for the auditor")
	a, err := audit.New(srv.Connect(t), audit.Config{Seed: seed, FlushAfter: 10 * time.Millisecond})
	require.NoError(t, err)
	actx, stop := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- a.Run(actx) }()
	defer func() { stop(); require.NoError(t, <-stopped) }()
	select {
	case r := <-done:
		assert.Equal(t, 0, r.code, r.out)
		assert.Contains(t, r.out, "intact:")
	case <-ctx.Done():
		t.Fatal("verify did not end")
	}
}
