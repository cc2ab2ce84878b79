package process

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/registrar"
)

// testExecutor is a running test executor process.
type testExecutor struct {
	cmd    *exec.Cmd
	out    *actionbustest.LogBuffer
	exited chan struct{} // closed when the process has exited
	err    error         // its exit status, once exited is closed
}

// serveRegistrar serves the registrar (which dispatchers host) until the
// test ends, for tests that run executors without a dispatcher.
func serveRegistrar(t *testing.T, srv *actionbustest.Server) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- registrar.Run(ctx, srv.Conn, "", nil) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
}

func buildTestExecutor(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "testexecutor")
	cmd := exec.Command("go", "build", "-o", bin, "./test/process/testexecutor")
	cmd.Dir = repoRoot(t)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

func startTestExecutor(t *testing.T, bin, url, dir, id string, env ...string) *testExecutor {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "NATS_URL="+url, "TEST_DIR="+dir, "ACTIONBUS_EXECUTOR_ID="+id)
	cmd.Env = append(cmd.Env, env...)
	out := &actionbustest.LogBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	te := &testExecutor{cmd: cmd, out: out, exited: make(chan struct{})}
	go func() {
		te.err = cmd.Wait()
		close(te.exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-te.exited
		if t.Failed() {
			t.Logf("%s output:\n%s", id, out.String())
		}
	})
	return te
}

// lines waits until file has at least n lines and returns them.
func lines(t *testing.T, path string, n int) []string {
	t.Helper()
	var got []string
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(path)
		got = nil
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if l != "" {
				got = append(got, l)
			}
		}
		return len(got) >= n
	}, 30*time.Second, 20*time.Millisecond, "%s has fewer than %d lines", path, n)
	return got
}

func waitCatalog(t *testing.T, ctx context.Context, c *client.Client, action string) {
	t.Helper()
	require.Eventually(t, func() bool {
		list, _ := c.Actions(ctx)
		for _, a := range list {
			if a.Name == action {
				return true
			}
		}
		return false
	}, 30*time.Second, 20*time.Millisecond, "%s never reached the catalog", action)
}

func TestAKilledExecutorsActionIsRedeliveredToAnother(t *testing.T) {
	if testing.Short() {
		t.Skip("starts executor processes")
	}
	bin := buildTestExecutor(t)
	srv := actionbustest.NewServer(t, actionbustest.Options{AckWait: time.Second})
	st := srv.StartStack(t, actionbustest.StackOptions{NoExecutors: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	a := startTestExecutor(t, bin, srv.URL, dir, "ex-a", "SLOW_MS=60000", "SLOTS=1")
	waitCatalog(t, ctx, st.Client, "test.slow")

	runID, err := st.Client.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.slow", Args: map[string]any{"n": 7}}})
	require.NoError(t, err)
	first := lines(t, filepath.Join(dir, "invocations"), 1)
	require.True(t, strings.HasPrefix(first[0], "ex-a "), first)
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGKILL))
	<-a.exited

	startTestExecutor(t, bin, srv.URL, dir, "ex-b", "SLOW_MS=100", "SLOTS=1")
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, "slept on ex-b", res.Answer)

	inv := lines(t, filepath.Join(dir, "invocations"), 2)
	assert.Len(t, inv, 2, "one invocation per executor")
	assert.True(t, strings.HasPrefix(inv[1], "ex-b "))
	assert.Equal(t, strings.Fields(inv[0])[1], strings.Fields(inv[1])[1], "the same call")
	done := lines(t, filepath.Join(dir, "completions"), 1)
	assert.Equal(t, []string{"ex-b " + strings.Fields(inv[0])[1]}, done)
}

func TestAnIdempotentEffectSurvivesACrashAfterTheEffect(t *testing.T) {
	if testing.Short() {
		t.Skip("starts executor processes")
	}
	bin := buildTestExecutor(t)
	for _, tc := range []struct {
		name    string
		useKey  bool
		effects int
	}{
		{"the handler uses the key: the effect happens once", true, 1},
		{"documented: without using the key the effect repeats", false, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := actionbustest.NewServer(t, actionbustest.Options{AckWait: time.Second})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			dir := t.TempDir()
			rec := srv.Record(t, "ab.run.*.*.result")
			serveRegistrar(t, srv) // no dispatcher here: the executors announce to this one
			a := startTestExecutor(t, bin, srv.URL, dir, "ex-a", "CRASH_AFTER_EFFECT=1", "SLOTS=1")
			// The catalog as the registrar wrote it (no dispatcher, so no
			// read service, runs here).
			kv, err := srv.JS.KeyValue(ctx, bus.Topology{}.BucketCatalog())
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				_, err := kv.Get(ctx, "default.test.count")
				return err == nil
			}, 30*time.Second, 20*time.Millisecond, "test.count never reached the catalog")

			// A mutate call straight to the pool (what the dispatcher
			// sends after an approval), with an idempotency key.
			eb, err := bus.NewBus(srv.JS, bus.BusConfig{Source: "/test"})
			require.NoError(t, err)
			runID := events.NewID()
			callID := events.DerivedID(runID, "call", 1, 0, 1)
			args := map[string]any{"useKey": tc.useKey}
			hash, err := policy.InputHash(args)
			require.NoError(t, err)
			approval := &events.ApprovalGrant{Token: "k1.test", Approver: "test", Context: events.ApprovalContext{
				ApprovalID: runID + "-1-0", RunID: runID, StepID: callID, Action: "test.count", InputHash: hash, ExpiresAt: time.Now().Add(time.Hour)}}
			_, err = eb.Emit(ctx, events.TypeActionRequested, callID, events.DefaultTenant, runID, "default", &events.ActionRequested{
				RunID: runID, CallID: callID, Cycle: 1, Attempt: 1, Action: "test.count", Origin: events.OriginHost,
				Args: args, IdempotencyKey: "transfer-991", Approval: approval})
			require.NoError(t, err)
			<-a.exited // it killed itself right after the effect
			lines(t, filepath.Join(dir, "counter"), 1)

			startTestExecutor(t, bin, srv.URL, dir, "ex-b", "SLOTS=1")
			r := rec.WaitFor(t, 30*time.Second, func(r actionbustest.Recorded) bool {
				return r.Type() == events.TypeActionCompleted || r.Type() == events.TypeActionFailed
			})
			var done events.ActionCompleted
			require.Equal(t, events.TypeActionCompleted, r.Type())
			require.NoError(t, events.DataAs(r.Event, &done))
			assert.Equal(t, "ex-b", done.Executor)
			assert.GreaterOrEqual(t, done.Deliveries, 2, "it was a redelivery")
			counter := lines(t, filepath.Join(dir, "counter"), tc.effects)
			assert.Len(t, counter, tc.effects)
		})
	}
}

func TestSIGTERMDuringTwentyInFlightActionsLosesNone(t *testing.T) {
	if testing.Short() {
		t.Skip("starts executor processes")
	}
	bin := buildTestExecutor(t)
	srv := actionbustest.NewServer(t, actionbustest.Options{AckWait: 2 * time.Second})
	st := srv.StartStack(t, actionbustest.StackOptions{NoExecutors: true})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	dir := t.TempDir()
	a := startTestExecutor(t, bin, srv.URL, dir, "ex-a", "SLOW_MS=60000", "SLOTS=20", "GRACE=300ms")
	waitCatalog(t, ctx, st.Client, "test.slow")
	var runs []string
	for i := 0; i < 20; i++ {
		id, err := st.Client.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.slow", Args: map[string]any{"n": i}}})
		require.NoError(t, err)
		runs = append(runs, id)
	}
	lines(t, filepath.Join(dir, "invocations"), 20)
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-a.exited:
		require.NoError(t, a.err, "the executor exits cleanly after handing work back")
	case <-ctx.Done():
		t.Fatal("the executor did not stop on SIGTERM")
	}
	startTestExecutor(t, bin, srv.URL, dir, "ex-b", "SLOW_MS=50", "SLOTS=20")
	for _, id := range runs {
		res, err := st.Client.Wait(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, client.StatusCompleted, res.Status, "run %s: %+v", id, res.Error)
		assert.Equal(t, "slept on ex-b", res.Answer)
	}
	assert.Len(t, lines(t, filepath.Join(dir, "completions"), 20), 20)
}
