package audit_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/audit"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/payload"
)

const (
	password    = "hunter2-SECRET-pw"
	sessionTok  = "tok-SECRET-session"
	idemKey     = "idem-SECRET-key-42"
	approvalKid = "k1"
)

var approvalSecret = []byte("0123456789abcdef0123456789abcdef")

type loginIn struct {
	User     string `json:"user"`
	Password string `json:"password"`
}

type session struct {
	Token string `json:"token"`
}

type loginOut struct {
	User    string  `json:"user"`
	Session session `json:"session"`
}

func registerSecretActions(flaky *atomic.Int32) func(*executor.Executor) error {
	return func(ex *executor.Executor) error {
		err := executor.Register(ex, executor.Action{Name: "vault.login", Description: "Log in.",
			AuditPolicy: &executor.AuditPolicy{Output: "redacted", RedactPaths: []string{"/session/token"}}},
			func(_ context.Context, in loginIn, _ executor.Call) (executor.Result[loginOut], error) {
				if in.Password != password {
					return executor.Result[loginOut]{}, errors.New("wrong password")
				}
				return executor.Result[loginOut]{Output: loginOut{User: in.User, Session: session{Token: sessionTok}}}, nil
			})
		if err != nil {
			return err
		}
		err = executor.Register(ex, executor.Action{Name: "jobs.flaky", Description: "Fails twice, then works."},
			func(_ context.Context, _ struct{}, call executor.Call) (executor.Result[map[string]any], error) {
				if flaky.Add(1) < 3 {
					// A careless handler puts the secret in its error details.
					return executor.Result[map[string]any]{}, actionbus.Errorf("upstream_down", "upstream down").WithDetail("password", password)
				}
				return executor.Result[map[string]any]{Output: map[string]any{"ok": true}, Summary: "worked on attempt 3"}, nil
			})
		if err != nil {
			return err
		}
		return executor.Register(ex, executor.Action{Name: "acct.close", Description: "Close an account.", Mode: "mutate", Tier: 2},
			func(_ context.Context, in struct {
				Account string `json:"account"`
			}, call executor.Call) (executor.Result[map[string]any], error) {
				return executor.Result[map[string]any]{Output: map[string]any{"closed": in.Account}}, nil
			})
	}
}

func TestSecretsNeverReachTheAuditStreamSinksOrLogs(t *testing.T) {
	dir := t.TempDir()
	jsonl, db := filepath.Join(dir, "audit.jsonl"), filepath.Join(dir, "audit.db")
	var logs actionbustest.LogBuffer
	var flaky atomic.Int32
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	runs := srv.Record(t, "ab.run.>")
	auditRec := srv.Record(t, "ab.audit.>")
	st := srv.StartStack(t, actionbustest.StackOptions{
		Register:      registerSecretActions(&flaky),
		AuditDefaults: &executor.AuditPolicy{Input: "redacted", Output: "full", Error: "summary", RedactPaths: []string{"/password"}},
		AuditJSONL:    jsonl, AuditSQLite: db,
		ApprovalKeys: approvalKid + ":" + base64.StdEncoding.EncodeToString(approvalSecret),
		Logger:       slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	wf := client.NewWorkflow("close-account").
		Step("login", "vault.login", map[string]any{"user": "ada", "password": password}).
		Step("flaky", "jobs.flaky", nil, client.Retry(3, 10, false), client.IdempotencyKey(idemKey)).
		Step("close", "acct.close", map[string]any{"account": "acc-1"}).Build()
	runID, err := st.Client.Start(ctx, client.RunRequest{UserID: "ada", AllowedModes: []string{"read", "mutate"}, Workflow: wf})
	require.NoError(t, err)
	var step events.RunStep
	runs.WaitFor(t, 30*time.Second, func(r actionbustest.Recorded) bool {
		return events.IsRunStep(r.Type()) && events.DataAs(r.Event, &step) == nil && step.RunID == runID && step.Name == "awaiting-approval"
	})
	approvalID := step.Details["approvalId"].(string)
	require.NoError(t, st.Client.Approve(ctx, approvalID, approvalKid, approvalSecret))
	res, err := st.Client.Wait(ctx, runID)
	if err != nil {
		for _, r := range runs.All() {
			steps := r.Steps()
			for _, s := range steps {
				t.Logf("step %s %s %s %v", s.Name, s.Status, s.Message, s.Details)
			}
			if len(steps) == 0 {
				t.Logf("%s %s", r.Subject, r.Type())
			}
		}
	}
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)

	var granted events.ApprovalGranted
	runs.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
		return r.Type() == events.TypeApprovalGranted && events.DataAs(r.Event, &granted) == nil && granted.RunID == runID
	})
	token := granted.Token
	require.NotEmpty(t, token)

	// Every record of the run is in the stream and in both sinks.
	recs, err := st.Client.AuditRecords(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, -1, audit.Verify(recs), "the chain is intact")
	waitSinks(t, srv, len(recs), runID, jsonl, db)

	secrets := map[string]string{"password": password, "session token": sessionTok, "idempotency key": idemKey, "approval token": token}
	var stream bytes.Buffer
	for _, r := range auditRec.All() {
		stream.Write(r.Data)
		for k, v := range r.Header {
			stream.WriteString(k + ":" + strings.Join(v, ",") + "\n")
		}
	}
	jsonlBytes, err := os.ReadFile(jsonl)
	require.NoError(t, err)
	var sqliteBytes []byte
	for _, f := range []string{db, db + "-wal"} {
		if b, err := os.ReadFile(f); err == nil {
			sqliteBytes = append(sqliteBytes, b...)
		}
	}
	for what, secret := range secrets {
		assert.NotContains(t, stream.String(), secret, "%s in the audit stream", what)
		assert.NotContains(t, string(jsonlBytes), secret, "%s in the JSON-lines sink", what)
		assert.False(t, bytes.Contains(sqliteBytes, []byte(secret)), "%s in the SQLite sink", what)
		assert.NotContains(t, logs.String(), secret, "%s in the service logs", what)
	}

	// What the records do say.
	var flakyRecs []events.AuditRecorded
	for _, r := range recs {
		if r.Action == "jobs.flaky" && r.Kind == audit.KindAction {
			flakyRecs = append(flakyRecs, r)
		}
		if r.Action == "vault.login" && r.Status == "started" {
			assert.Equal(t, map[string]any{"user": "ada", "password": payload.Redacted}, r.Input)
			assert.Equal(t, "login", r.StepID)
			assert.Equal(t, "ada", r.UserID)
			assert.Equal(t, "read", r.Mode)
		}
		if r.Action == "vault.login" && r.Status == "succeeded" {
			assert.Equal(t, map[string]any{"user": "ada", "session": map[string]any{"token": payload.Redacted}}, r.Output, "the action's own redact path")
			assert.Equal(t, map[string]string{"output": "redacted"}, r.PayloadModes)
		}
		if r.Action == "acct.close" && r.Status == "started" {
			assert.Equal(t, sha(token), r.ApprovalTokenHash)
			assert.Equal(t, "mutate", r.Mode)
		}
		if r.Kind == audit.KindApproval && r.Status == "granted" {
			assert.Equal(t, sha(token), r.ApprovalTokenHash)
		}
	}
	var got [][3]any
	for _, r := range flakyRecs {
		got = append(got, [3]any{r.Status, r.Attempt, r.MaxAttempts})
		if r.Status == "started" {
			assert.Equal(t, sha(idemKey), r.IdempotencyKeyHash, "the key's hash, never the key")
		}
		if r.Status == "failed" {
			assert.Equal(t, map[string]any{"code": "upstream_down", "message": "upstream down"}, r.Error, "an error summary keeps code and message only")
		}
	}
	assert.Equal(t, [][3]any{{"started", 1, 3}, {"failed", 1, 3}, {"started", 2, 3}, {"failed", 2, 3}, {"started", 3, 3}, {"succeeded", 3, 3}}, got,
		"retries show their attempts")
	kinds := map[string]bool{}
	for _, r := range recs {
		kinds[r.Kind] = true
	}
	for _, k := range []string{audit.KindRun, audit.KindStep, audit.KindPolicy, audit.KindAction, audit.KindApproval} {
		assert.True(t, kinds[k], "records of kind %s", k)
	}
}

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// waitSinks waits until both sinks hold n records of the run.
func waitSinks(t *testing.T, srv *actionbustest.Server, n int, runID, jsonl, db string) {
	t.Helper()
	require.Eventually(t, func() bool {
		a, errA := audit.ReadJSONL(jsonl, runID)
		b, errB := audit.ReadSQLite(context.Background(), db, runID)
		return errA == nil && errB == nil && len(a) == n && len(b) == n
	}, 20*time.Second, 20*time.Millisecond, "the sinks caught up")
}

func TestASinkStoppedMidRunCatchesUpWithoutLossOrDuplicates(t *testing.T) {
	dir := t.TempDir()
	jsonlPath, dbPath := filepath.Join(dir, "audit.jsonl"), filepath.Join(dir, "audit.db")
	var flaky atomic.Int32
	flaky.Store(100) // jobs.flaky always works here
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Register: registerSecretActions(&flaky)})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	eb, err := bus.Open(srv.Connect(t), bus.BusConfig{Source: "/test/sinks"})
	require.NoError(t, err)
	topo := bus.Topology{Prefix: "ab"}

	startSinks := func() (stop func()) {
		jsonl, err := audit.OpenJSONL(jsonlPath)
		require.NoError(t, err)
		db, err := audit.OpenSQLite(dbPath)
		require.NoError(t, err)
		sctx, scancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for _, s := range []audit.Sink{jsonl, db} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := audit.RunSink(sctx, eb, topo, s); err != nil && sctx.Err() == nil {
					t.Errorf("sink %s: %v", s.Name(), err)
				}
			}()
		}
		return func() {
			scancel()
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the sinks did not stop within 10s")
			}
			require.NoError(t, jsonl.Close())
			require.NoError(t, db.Close())
		}
	}
	startRuns := func(n int) []string {
		var ids []string
		for i := 0; i < n; i++ {
			id, err := st.Client.Start(ctx, client.RunRequest{Workflow: client.NewWorkflow("w").
				Step("a", "jobs.flaky", nil).Step("b", "jobs.flaky", nil).Build()})
			require.NoError(t, err)
			ids = append(ids, id)
		}
		return ids
	}
	wait := func(ids []string) {
		for _, id := range ids {
			wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
			res, err := st.Client.Wait(wctx, id)
			wcancel()
			require.NoError(t, err, "run %s did not end", id)
			require.Equal(t, client.StatusCompleted, res.Status)
		}
	}

	stop := startSinks()
	first := startRuns(5)
	// Stop the sinks while the runs are still being audited.
	require.Eventually(t, func() bool {
		recs, err := audit.ReadJSONL(jsonlPath, "")
		return err == nil && len(recs) >= 5
	}, 20*time.Second, 5*time.Millisecond)
	stop()
	wait(first)
	second := startRuns(5)
	wait(second)

	var want []uint64
	require.Eventually(t, func() bool {
		want = want[:0]
		terminals := 0 // every run has its terminal record audited
		err := st.Client.AuditStream(ctx, client.AuditQuery{}, func(seq uint64, rec events.AuditRecorded) error {
			want = append(want, seq)
			if rec.EventType == events.TypeRunCompleted {
				terminals++
			}
			return nil
		})
		return err == nil && terminals == 10
	}, 20*time.Second, 20*time.Millisecond)
	before, err := audit.ReadJSONL(jsonlPath, "")
	require.NoError(t, err)
	require.Less(t, len(before), len(want), "the sink missed records while it was down")

	stop = startSinks()
	defer stop()
	for _, read := range []func() ([]audit.SinkRecord, error){
		func() ([]audit.SinkRecord, error) { return audit.ReadJSONL(jsonlPath, "") },
		func() ([]audit.SinkRecord, error) { return audit.ReadSQLite(ctx, dbPath, "") },
	} {
		var got []audit.SinkRecord
		require.Eventually(t, func() bool {
			got, err = read()
			return err == nil && len(got) >= len(want)
		}, 20*time.Second, 10*time.Millisecond)
		seqs := make([]uint64, len(got))
		for i, r := range got {
			seqs[i] = r.StreamSeq
		}
		// The stream may have grown since (late timers); compare up to the
		// sink's last record.
		var stream []uint64
		require.NoError(t, st.Client.AuditStream(ctx, client.AuditQuery{}, func(seq uint64, _ events.AuditRecorded) error {
			if seq <= seqs[len(seqs)-1] {
				stream = append(stream, seq)
			}
			return nil
		}))
		assert.Equal(t, stream, seqs, "every record exactly once, in stream order")
		byRun := map[string][]events.AuditRecorded{}
		for _, r := range got {
			byRun[r.RunID] = append(byRun[r.RunID], r.AuditRecorded)
		}
		for run, recs := range byRun {
			assert.Equal(t, -1, audit.Verify(recs), "chain of %s", run)
		}
	}
}
