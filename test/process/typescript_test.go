package process

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/policy"
)

// requireNode fails the test when node and npm are not on PATH: the
// TypeScript SDK's tests are part of the suite (CI has Node 20; .ci/run
// installs it when it is missing).
func requireNode(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not on PATH: the TypeScript SDK's tests need Node 20 and npm (.ci/run installs them; then make ts)", tool)
		}
	}
}

// tsOnce builds the SDK and the example executor once per test binary.
var tsOnce struct {
	sync.Once
	err error
	out string
}

// buildTypeScript installs (npm ci, when node_modules is missing) and
// builds sdk/typescript and examples/ts-executor, as `make ts` does.
func buildTypeScript(t *testing.T) {
	t.Helper()
	requireNode(t)
	root := repoRoot(t)
	tsOnce.Do(func() {
		var log strings.Builder
		for _, dir := range []string{"sdk/typescript", "examples/ts-executor"} {
			steps := [][]string{{"npm", "run", "build"}}
			if _, err := os.Stat(filepath.Join(root, dir, "node_modules")); err != nil {
				steps = append([][]string{{"npm", "ci", "--no-audit", "--no-fund"}}, steps...)
			}
			for _, s := range steps {
				cmd := exec.Command(s[0], s[1:]...)
				cmd.Dir = filepath.Join(root, dir)
				out, err := cmd.CombinedOutput()
				log.Write(out)
				if err != nil {
					tsOnce.err, tsOnce.out = err, dir+": "+strings.Join(s, " ")+":\n"+log.String()
					return
				}
			}
		}
	})
	require.NoError(t, tsOnce.err, tsOnce.out)
}

// The TypeScript SDK's own tests (sdk/typescript/test, `npm test`: node
// --test) run against the real services: an embedded NATS server, and the
// dispatcher, script planner and auditor of actionbustest, with the pool
// tsdk provisioned for the executor the tests run in their own process.
// They cover a TS action served end to end (and its audit record),
// schema-invalid input, an unknown action, heartbeats past the ack wait, a
// timeout, a cancel mid-call and the run_ended answer
// to an ended run's queued work, an idempotent mutation approved from the
// TS client and replayed, an approval-less mutation, an oversized output
// stored as an artifact, follow/wait, event.rejected for a message that
// is no event, delivery_exhausted at the fifth delivery, work handed
// back at shutdown, tenant_not_served on a dedicated pool, the Go
// idempotency record format and its conflict, and a refused announcement
// stopping the executor; and they check the SDK's result
// ids, input hash and approval tokens against Go's for fixed inputs,
// which this test computes and passes in.
func TestTheTypeScriptSDKAgainstTheServices(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the TypeScript SDK's tests")
	}
	buildTypeScript(t)
	secret := []byte("ts-sdk-test-approval-secret-0123")
	// A 2 s ack wait: a handler running longer is redelivered unless the
	// executor keeps it in progress (E-HEARTBEAT).
	srv := actionbustest.NewServer(t, actionbustest.Options{Pools: []string{"default", "tsdk", "tsdk2"}, AckWait: 2 * time.Second})
	srv.StartStack(t, actionbustest.StackOptions{NoExecutors: true, ApprovalKeys: "tskey:" + base64.StdEncoding.EncodeToString(secret)})

	type vector struct {
		CallID  string `json:"callId"`
		Attempt int    `json:"attempt"`
		ID      string `json:"id"`
	}
	var vectors []vector
	for _, v := range []vector{{CallID: "01JD0000000000000000000000", Attempt: 1}, {CallID: "01JDQ2Z7W4M3T2V9K8F6H5G4C3", Attempt: 2},
		{CallID: "01jdq2z7w4m3t2v9k8f6h5g4c3", Attempt: 10}, {CallID: "not-a-ulid", Attempt: 1}, {CallID: "", Attempt: 0}, {CallID: "8ZZZZZZZZZZZZZZZZZZZZZZZZZ", Attempt: 3}} {
		v.ID = events.ResultID(v.CallID, v.Attempt)
		vectors = append(vectors, v)
	}
	vjson, err := json.Marshal(vectors)
	require.NoError(t, err)
	hash, err := policy.InputHash(map[string]any{"z": []any{1.0, 2.5, "é"}, "a": map[string]any{"y": true, "b": nil}, "n": 1e21})
	require.NoError(t, err)
	token, err := policy.Sign("k1", []byte("0123456789abcdef0123456789abcdef"), policy.ApprovalContext{
		ApprovalID: "01JD0000000000000000000000-1-0", RunID: "01JD0000000000000000000000", UserID: "ada", Action: "x.y", InputHash: "ab",
		ExpiresAt: time.Date(2026, 12, 3, 14, 0, 0, 5e8, time.UTC)})
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "test")
	cmd.Dir = filepath.Join(repoRoot(t), "sdk", "typescript")
	cmd.Env = append(os.Environ(), "ACTIONBUS_NATS_URL="+srv.URL, "ACTIONBUS_POOL=tsdk", "ACTIONBUS_POOL2=tsdk2",
		"ACTIONBUS_APPROVAL_KEY=tskey:"+base64.StdEncoding.EncodeToString(secret),
		"ACTIONBUS_RESULT_IDS="+string(vjson), "ACTIONBUS_INPUT_HASH="+hash, "ACTIONBUS_APPROVAL_TOKEN="+token)
	cmd.WaitDelay = 5 * time.Second // node outlives npm when the context kills it
	out := &actionbustest.LogBuffer{}
	var w io.Writer = out
	if f := os.Getenv("ACTIONBUS_TS_LOG"); f != "" { // follow the tests as they run
		logFile, err := os.Create(f)
		require.NoError(t, err)
		defer logFile.Close()
		w = io.MultiWriter(out, logFile)
	}
	cmd.Stdout, cmd.Stderr = w, w
	err = cmd.Run()
	t.Logf("npm test:\n%s", out.String())
	require.NoError(t, err, "the TypeScript SDK's tests failed")
	assert.Contains(t, out.String(), "# fail 0")
}

// mixedScenario is a plan that calls a Go action (pool default) and a
// TypeScript action (pool tsx, examples/ts-executor) at once; the final
// answer lists the observations in the order the run holds them.
const mixedScenario = `
scenarios:
  go-and-ts:
    decisions:
      - type: plan
        actions:
          - {type: action, name: go.upper, args: {text: from go}}
          - {type: action, name: conformance.echo, args: {text: from ts}}
      - {type: final, answer: '{{ range .Last }}{{ .Action }}={{ if .OK }}{{ index .Output "text" }}{{ else }}{{ .Error.Code }}{{ end }};{{ end }}'}
`

// A run whose plan calls a Go action and a TypeScript action at once
// completes, with the results in declaration order (the Go action is the
// slower, so completion order is the other), and both calls are in the
// run's audit trail, read through the Go client.
func TestAPlanCallsAGoActionAndATypeScriptActionAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the TypeScript example executor")
	}
	buildTypeScript(t)
	srv := actionbustest.NewServer(t, actionbustest.Options{Pools: []string{"default", "tsx"}})
	tsDone := make(chan struct{})
	st := srv.StartStack(t, actionbustest.StackOptions{Scenarios: mixedScenario, Register: func(ex *executor.Executor) error {
		type in struct {
			Text string `json:"text"`
		}
		type out struct {
			Text string `json:"text"`
		}
		return executor.Register(ex, executor.Action{Name: "go.upper", Description: "Upper-cases text, once the TypeScript call has answered."},
			func(ctx context.Context, i in, _ executor.Call) (executor.Result[out], error) {
				select { // finish after the TypeScript action, so completion order is not declaration order
				case <-tsDone:
				case <-ctx.Done():
					return executor.Result[out]{}, ctx.Err()
				}
				return executor.Result[out]{Output: out{Text: strings.ToUpper(i.Text)}}, nil
			})
	}})
	rec := srv.Record(t, "ab.run.>")

	// The TypeScript example executor, as its own process.
	logs := startTSExecutor(t, srv.URL, "tsx")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runID := events.NewID()
	go func() {
		// The TypeScript call's result, then the Go action may finish.
		_, err := rec.Await(ctx, func(r actionbustest.Recorded) bool {
			return r.Type() == events.TypeActionCompleted && r.Event.Extensions()[events.ExtRunID] == runID &&
				strings.Contains(string(r.Data), `"action":"conformance.echo"`)
		})
		if err == nil {
			close(tsDone)
		}
	}()
	res, err := st.Client.Run(ctx, client.RunRequest{RunID: runID, Scenario: "go-and-ts"}, nil)
	require.NoError(t, err)
	require.Equal(t, "completed", res.Status, "%+v\nexecutor:\n%s", res.Error, logs.String())
	assert.Equal(t, "go.upper=FROM GO;conformance.echo=from ts;", res.Answer, "the results in declaration order")

	records, err := st.Client.AuditRecords(ctx, runID)
	require.NoError(t, err)
	outcome := map[string]string{}
	for _, r := range records {
		if r.Action != "" && (r.Status == "succeeded" || r.Status == "failed") {
			outcome[r.Action] = r.Status
		}
	}
	assert.Equal(t, map[string]string{"go.upper": "succeeded", "conformance.echo": "succeeded"}, outcome, "both calls' outcomes are in the audit trail")
}

// The TypeScript example executor (examples/ts-executor, which hosts the
// conformance catalog), as a node process, passes every case of the
// conformance kit run as a process, as the Go executor does
// (TestTheGoExecutorPassesTheConformanceKit): exit status 0, every row
// "pass".
func TestTheTypeScriptExecutorPassesTheConformanceKit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	requireNode(t)
	buildTypeScript(t)
	bin := buildActionbus(t)
	srv := actionbustest.NewServer(t, actionbustest.Options{Pools: []string{"default", "conformance"}})
	serveRegistrar(t, srv)
	startTSExecutor(t, srv.URL, "conformance", "SLOTS=3")

	rows, out, code := runKit(t, bin, srv.URL)
	assert.Equal(t, 0, code, out)
	require.Len(t, rows, 17, out)
	for _, r := range rows {
		assert.Equal(t, "pass", r[2], r[1])
	}
}

// startTSExecutor runs examples/ts-executor (built) as a node process on
// pool, connected to url, until the test ends (SIGTERM, then it must exit
// cleanly); it returns its output once the executor says it is ready.
func startTSExecutor(t *testing.T, url, pool string, env ...string) *actionbustest.LogBuffer {
	t.Helper()
	cmd := exec.Command("node", "dist/main.js")
	cmd.Dir = filepath.Join(repoRoot(t), "examples", "ts-executor")
	cmd.Env = append(append(os.Environ(), "NATS_URL="+url, "POOL="+pool), env...)
	logs := &actionbustest.LogBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			assert.NoError(t, err, "the TypeScript executor did not exit cleanly:\n%s", logs.String())
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("the TypeScript executor did not stop on SIGTERM:\n%s", logs.String())
		}
	})
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "ts-executor ready") }, time.Minute, 20*time.Millisecond,
		"the TypeScript executor did not start:\n%s", logs.String())
	return logs
}
