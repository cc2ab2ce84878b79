package cli_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/cli"
)

// neverWaits bounds how long a command naming a malformed or unknown run
// or approval may take. The bound is the property under test, not a
// tolerance: such a command must answer at once ("never waits for
// nothing"), where it used to follow or wait for ever.
const neverWaits = time.Second

// wrongInvocation is one command line that names a run or approval that
// is malformed or does not exist.
type wrongInvocation struct {
	name string
	args []string
	// code is the typed code the message must carry.
	code string
}

// runWrong runs args with the in-process CLI entry and asserts a non-zero
// exit, the code in the message, no "cancel requested" and an answer
// within neverWaits.
func runWrong(t *testing.T, url string, w wrongInvocation) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	code := cli.Execute(ctx, append([]string{"--nats", url}, w.args...), nil, &out, &errOut)
	elapsed := time.Since(start)
	assert.NotEqual(t, 0, code, "exit code; stdout %q stderr %q", out.String(), errOut.String())
	assert.Contains(t, errOut.String(), w.code, "stdout %q", out.String())
	assert.NotContains(t, out.String(), "cancel requested")
	assert.Less(t, elapsed, neverWaits, "a command naming a malformed or unknown id must answer at once")
}

// TestCommandsNamingAnUnknownRunOrApprovalFailAtOnce: every command that
// names a run or an approval checks the id's shape (invalid_run_id) and
// that it exists (run_not_found, approval_not_found), exits non-zero and
// answers within a second.
func TestCommandsNamingAnUnknownRunOrApprovalFailAtOnce(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{NoPlanner: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A run that exists (it waits for a planner that never answers) and
	// has no approval.
	known, err := st.Client.Start(ctx, client.RunRequest{Prompt: "anyone there?", UserID: "u1"})
	require.NoError(t, err)
	require.NoError(t, st.Client.CheckRun(ctx, known))

	t.Setenv("ACTIONBUS_APPROVAL_KEY", "k1:"+"c2VjcmV0LXNlY3JldC1zZWNyZXQ=")
	unknown := events.NewID()
	for _, w := range []wrongInvocation{
		{"watch unknown", []string{"watch", unknown}, "run_not_found"},
		{"watch malformed", []string{"watch", "not-a-run"}, "invalid_run_id"},
		{"cancel unknown", []string{"cancel", unknown}, "run_not_found"},
		{"cancel malformed", []string{"cancel", "not-a-run"}, "invalid_run_id"},
		{"input unknown", []string{"input", unknown, "yes"}, "run_not_found"},
		{"input malformed", []string{"input", "not-a-run", "yes"}, "invalid_run_id"},
		{"retry unknown", []string{"retry", unknown}, "run_not_found"},
		{"retry malformed", []string{"retry", "not-a-run"}, "invalid_run_id"},
		{"replay unknown", []string{"replay", unknown}, "run_not_found"},
		{"replay malformed", []string{"replay", "not-a-run"}, "invalid_run_id"},
		{"audit verify unknown", []string{"audit", "verify", unknown}, "run_not_found"},
		{"audit verify malformed", []string{"audit", "verify", "not-a-run"}, "invalid_run_id"},
		{"audit tail unknown", []string{"audit", "tail", "--run", unknown}, "run_not_found"},
		{"audit tail malformed", []string{"audit", "tail", "--run", "not-a-run"}, "invalid_run_id"},
		{"audit export malformed", []string{"audit", "export", "--run", "not-a-run"}, "invalid_run_id"},
		{"approve of an unknown run", []string{"approve", unknown + "-1-0"}, "approval_not_found"},
		{"approve unknown approval of a run", []string{"approve", known + "-1-0"}, "approval_not_found"},
		{"approve malformed", []string{"approve", "not-an-approval"}, "invalid_run_id"},
		{"deny of an unknown run", []string{"deny", unknown + "-1-0"}, "approval_not_found"},
		{"deny unknown approval of a run", []string{"deny", known + "-1-0"}, "approval_not_found"},
		{"deny malformed", []string{"deny", "not-an-approval"}, "invalid_run_id"},
	} {
		t.Run(w.name, func(t *testing.T) { runWrong(t, srv.URL, w) })
	}
}

// TestMalformedIDsAreRefusedBeforeConnecting: a malformed run or approval
// id is invalid_run_id even with no server to reach — the shape is
// checked before any connection (and so before any wait).
func TestMalformedIDsAreRefusedBeforeConnecting(t *testing.T) {
	nowhere := "nats://127.0.0.1:1" // nothing listens on port 1
	t.Setenv("ACTIONBUS_APPROVAL_KEY", "k1:"+"c2VjcmV0LXNlY3JldC1zZWNyZXQ=")
	for _, w := range []wrongInvocation{
		{"watch", []string{"watch", "not-a-run"}, "invalid_run_id"},
		{"cancel", []string{"cancel", "not-a-run"}, "invalid_run_id"},
		{"input", []string{"input", "not-a-run", "yes"}, "invalid_run_id"},
		{"retry", []string{"retry", "not-a-run"}, "invalid_run_id"},
		{"replay", []string{"replay", "not-a-run"}, "invalid_run_id"},
		{"audit verify", []string{"audit", "verify", "not-a-run"}, "invalid_run_id"},
		{"approve", []string{"approve", "not-an-approval"}, "invalid_run_id"},
		{"deny", []string{"deny", "01J0000000000000000000000-x-0"}, "invalid_run_id"},
	} {
		t.Run(w.name, func(t *testing.T) { runWrong(t, nowhere, w) })
	}
}

// TestCancelOfAnEndedRunSaysItEnded: cancel of a run that ended requests
// nothing and says so.
func TestCancelOfAnEndedRunSaysItEnded(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{NoPlanner: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := st.Client.Start(ctx, client.RunRequest{Prompt: "anyone there?", UserID: "u1"})
	require.NoError(t, err)
	var out, errOut bytes.Buffer
	require.Equal(t, 0, cli.Execute(ctx, []string{"--nats", srv.URL, "cancel", id}, nil, &out, &errOut), errOut.String())
	assert.Contains(t, out.String(), "cancel requested for "+id)
	res, err := st.Client.Wait(ctx, id)
	require.NoError(t, err)
	require.Equal(t, client.StatusCanceled, res.Status)

	out.Reset()
	require.Equal(t, 0, cli.Execute(ctx, []string{"--nats", srv.URL, "cancel", id}, nil, &out, &errOut), errOut.String())
	assert.Equal(t, "run "+id+" already ended (canceled): nothing to cancel\n", out.String())
}

// TestApproveWithAWrongSecretSaysBadSignature: an approver whose secret is
// not the key's is told "bad signature" (not a context mismatch), exits
// non-zero at once, and the approval still waits for a good one.
func TestApproveWithAWrongSecretSaysBadSignature(t *testing.T) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "")
	st := srv.StartStack(t, actionbustest.StackOptions{NoPlanner: true,
		ApprovalKeys: "k1:" + base64.StdEncoding.EncodeToString(secret) + ":alice",
		Register: func(ex *executor.Executor) error {
			return executor.Register(ex, executor.Action{Name: "ops.restart", Mode: executor.ModeMutate, Description: "Restart a service."},
				func(context.Context, struct{}, executor.Call) (executor.Result[struct{}], error) {
					return executor.Result[struct{}]{Summary: "restarted"}, nil
				})
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runID, err := st.Client.Start(ctx, client.RunRequest{UserID: "u1", AllowedModes: []string{"read", "mutate"},
		Action: &client.ActionCall{Name: "ops.restart"}})
	require.NoError(t, err)
	r := rec.WaitFor(t, 10*time.Second, func(r actionbustest.Recorded) bool {
		var s events.RunStep
		return events.IsRunStep(r.Type()) && events.DataAs(r.Event, &s) == nil && s.RunID == runID && s.Name == "awaiting-approval"
	})
	var s events.RunStep
	require.NoError(t, events.DataAs(r.Event, &s))
	approvalID, _ := s.Details["approvalId"].(string)
	require.NotEmpty(t, approvalID)

	wrong := "k1:" + base64.StdEncoding.EncodeToString([]byte("not-the-secret-of-key-k1-at-all!"))
	var out, errOut bytes.Buffer
	start := time.Now()
	code := cli.Execute(ctx, []string{"--nats", srv.URL, "approve", approvalID, "--key", wrong}, nil, &out, &errOut)
	elapsed := time.Since(start)
	assert.Equal(t, 1, code, out.String())
	assert.Contains(t, errOut.String(), "approval_invalid: bad signature")
	assert.NotContains(t, errOut.String(), "does not match the approval context")
	assert.Less(t, elapsed, neverWaits, "a refused approval is answered at once")

	out.Reset()
	errOut.Reset()
	right := "k1:" + base64.StdEncoding.EncodeToString(secret)
	require.Equal(t, 0, cli.Execute(ctx, []string{"--nats", srv.URL, "approve", approvalID, "--key", right}, nil, &out, &errOut), errOut.String())
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	assert.Equal(t, client.StatusCompleted, res.Status)
}

// TestUserJSONErrorsNameLineAndColumn: JSON a user gives the CLI (exec
// --input inline, from stdin or a file; a workflow file) that does not
// parse is refused with its line and column, before any connection and
// so at once; JSON of another kind than an object says which kind.
func TestUserJSONErrorsNameLineAndColumn(t *testing.T) {
	nowhere := "nats://127.0.0.1:1" // nothing listens on port 1
	dir := t.TempDir()
	badFile := filepath.Join(dir, "input.json")
	require.NoError(t, os.WriteFile(badFile, []byte("{\n  \"workflowName\": \"w\",\n  \"steps\": [}\n"), 0o600))
	for _, tc := range []struct {
		name  string
		args  []string
		stdin string
		want  string
	}{
		{"exec inline", []string{"exec", "t.echo", "--input", "{text: hi"}, "", "--input (inline): invalid JSON at line 1, column 2: invalid character 't'"},
		{"exec stdin", []string{"exec", "t.echo", "--input", "-"}, "{\n\"text\": hi}", "--input (stdin): invalid JSON at line 2, column 9: invalid character 'h'"},
		{"exec file", []string{"exec", "t.echo", "--input", "@" + badFile}, "", "--input @" + badFile + ": invalid JSON at line 3, column 13: invalid character '}'"},
		{"exec truncated", []string{"exec", "t.echo", "--input", `{"text": "hi"`}, "", "invalid JSON at line 1, column 13: unexpected end of JSON input"},
		{"exec not an object", []string{"exec", "t.echo", "--input", "[1]"}, "", "--input (inline): must be a JSON object, not an array"},
		{"run workflow", []string{"run", "--workflow", badFile}, "", badFile + ": invalid JSON at line 3, column 13"},
		{"workflow validate", []string{"workflow", "validate", badFile}, "", badFile + ": invalid JSON at line 3, column 13"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			start := time.Now()
			code := cli.Execute(context.Background(), append([]string{"--nats", nowhere}, tc.args...), strings.NewReader(tc.stdin), &out, &errOut)
			assert.Equal(t, 1, code)
			assert.Contains(t, errOut.String(), tc.want)
			assert.Less(t, time.Since(start), neverWaits, "a malformed argument is refused at once")
		})
	}
}
