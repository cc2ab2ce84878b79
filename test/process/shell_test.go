package process

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/shelltest"
)

// buildExecutor compiles cmd/executor.
func buildExecutor(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "executor")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/executor")
	cmd.Dir = repoRoot(t)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// gitRepo makes a committed git repository of files in dir.
func gitRepo(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
	}
	for _, args := range [][]string{{"init", "-q"}, {"add", "."}, {"-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "init"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "git %v: %s", args, out)
	}
}

// The shell escapes a security review found against the argv profile, and
// a fork bomb, replayed against a real executor process with the shell on
// (the safe profile, plus `sh -c` as the project's test command for the
// process attacks), as the deployed executor user. A model chooses the profile's commands; the sandbox,
// not the profile, is what stops them.
func TestShellEscapesAreContainedByTheSandbox(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts an executor process")
	}
	_, err := exec.LookPath("rg")
	require.NoError(t, err, "ripgrep is needed for its --pre escape (.ci/run installs it)")

	ws, outside := shelltest.Workspace(t), t.TempDir()
	gitRepo(t, ws, map[string]string{"a.txt": "one\n", "b.txt": "two\n", "f.sh": fmt.Sprintf("touch %s/ran-by-rg\necho pwned > planted.txt\n", outside)})
	victim := filepath.Join(outside, "victim.txt")
	require.NoError(t, os.WriteFile(victim, []byte("keep me\n"), 0o644))
	gitConfig, err := os.ReadFile(filepath.Join(ws, ".git", "config"))
	require.NoError(t, err)

	decide := func(argv ...string) string {
		b, err := json.Marshal(argv)
		require.NoError(t, err)
		return fmt.Sprintf("    decisions:\n      - {type: action, name: shell, args: {argv: %s}}\n      - {type: final, answer: done}\n", b)
	}
	scenarios := "scenarios:\n" +
		"  diff-output:\n" + decide("git", "diff", "--no-index", "--output="+filepath.Join(outside, "diff-written"), "a.txt", "b.txt") +
		"  plant-fsmonitor:\n" + decide("git", "log", "-1", "--format=[core]%n%x09fsmonitor = touch "+filepath.Join(outside, "fsmonitor-ran"), "--output=.git/config") +
		"  status:\n" + decide("git", "status") +
		"  rg-pre-sh:\n" + decide("rg", "--pre", "sh", "-e", "x", "f.sh") +
		"  rg-pre-rm:\n" + decide("rg", "--pre", "rm", "-e", "x", "a.txt", victim)

	// The executor process connects as the deployed executor user.
	srv := actionbustest.NewServer(t, actionbustest.Options{Users: true})
	st := srv.StartStack(t, actionbustest.StackOptions{NoExecutors: true, Scenarios: scenarios})
	startService(t, buildExecutor(t), srv.UserURL("executor"), "--id", "shell-1", "--workspace", ws, "--shell",
		"--shell-test-command", "sh -c", "--shell-timeout", "5s", "--shell-max-processes", "64")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	waitCatalog(t, ctx, st.Client, "shell")

	// model runs a scenario whose one action is the model's shell call,
	// and checks that the command ran: the profile let it through, and
	// only the sandbox stood in its way.
	model := func(scenario string) {
		t.Helper()
		var outcomes []string
		res, err := st.Client.Run(ctx, client.RunRequest{Scenario: scenario, Prompt: "p"}, func(e client.Event) {
			if e.Type != events.TypeActionCompleted && e.Type != events.TypeActionFailed {
				return
			}
			var r struct {
				Error *actionbus.Error `json:"error"`
			}
			require.NoError(t, json.Unmarshal(e.Data, &r))
			if r.Error == nil {
				outcomes = append(outcomes, "ran")
			} else {
				outcomes = append(outcomes, string(r.Error.Code)+": "+fmt.Sprint(r.Error.Details["stderrTail"]))
			}
		})
		require.NoError(t, err)
		require.Equal(t, client.StatusCompleted, res.Status, "%s: %+v", scenario, res.Error)
		require.Len(t, outcomes, 1, scenario)
		assert.Regexp(t, `^(ran|shell_exit_nonzero: )`, outcomes[0], "%s: the command ran in its sandbox", scenario)
		t.Logf("%s: %s", scenario, outcomes[0])
	}

	t.Run("git diff --output writes nothing outside the workspace", func(t *testing.T) {
		model("diff-output")
		assert.NoFileExists(t, filepath.Join(outside, "diff-written"))
	})
	t.Run("git log --output cannot plant core.fsmonitor for the next git status", func(t *testing.T) {
		model("plant-fsmonitor")
		model("status")
		after, err := os.ReadFile(filepath.Join(ws, ".git", "config"))
		require.NoError(t, err)
		assert.Equal(t, string(gitConfig), string(after), "the repository's config is unchanged")
		assert.NoFileExists(t, filepath.Join(outside, "fsmonitor-ran"))
	})
	t.Run("rg --pre sh runs nothing that reaches the host", func(t *testing.T) {
		model("rg-pre-sh")
		assert.NoFileExists(t, filepath.Join(outside, "ran-by-rg"))
		assert.NoFileExists(t, filepath.Join(ws, "planted.txt"))
	})
	t.Run("rg --pre rm deletes nothing", func(t *testing.T) {
		model("rg-pre-rm")
		assert.FileExists(t, filepath.Join(ws, "a.txt"))
		assert.FileExists(t, victim)
	})

	call := func(argv ...string) *client.Result {
		t.Helper()
		args := make([]any, len(argv))
		for i, a := range argv {
			args[i] = a
		}
		res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "shell", Args: map[string]any{"argv": args}}}, nil)
		require.NoError(t, err)
		return res
	}
	t.Run("no descendant survives the timeout, setsid or double-forked", func(t *testing.T) {
		token := strconv.FormatInt(3600000+time.Now().UnixNano()%100000, 10)
		done := make(chan *client.Result, 1)
		go func() {
			done <- call("sh", "-c", fmt.Sprintf(`setsid sleep %[1]s.1 & sh -c "sleep %[1]s.2 &"; sleep %[1]s.3`, token))
		}()
		require.Eventually(t, func() bool {
			return len(shelltest.Sleeping(token+".1")) == 1 && len(shelltest.Sleeping(token+".2")) == 1
		},
			5*time.Second, 10*time.Millisecond, "the setsid and double-forked children were started")
		res := <-done
		require.Equal(t, client.StatusFailed, res.Status)
		assert.Equal(t, actionbus.CodeTimeout, res.Error.Code, "%+v", res.Error)
		for _, n := range []string{".1", ".2", ".3"} {
			assert.Empty(t, shelltest.Sleeping(token+n), "no descendant outlives the call: sleep %s%s", token, n)
		}
	})
	t.Run("a fork bomb ends the call, and the executor serves the next", func(t *testing.T) {
		start := time.Now()
		// Every process stays alive until its children end: the bomb grows
		// until a fork is refused and cannot end on its own before.
		res := call("sh", "-c", "f() { f & f & wait; }; f")
		require.Equal(t, client.StatusFailed, res.Status)
		assert.Equal(t, actionbus.CodeShellLimit, res.Error.Code, "%+v", res.Error)
		assert.Equal(t, "processes", res.Error.Details["limit"])
		assert.Less(t, time.Since(start), 5*time.Second, "ended by the process bound, before the timeout")
		start = time.Now()
		res = call("pwd")
		require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
		assert.Less(t, time.Since(start), 5*time.Second)
	})
}

// An executor killed (SIGKILL) in the middle of a shell call leaves nothing
// of the call running: the sandbox dies with the process that started it.
func TestAKilledExecutorLeavesNoSandboxBehind(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts an executor process")
	}
	ws := shelltest.Workspace(t)
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{NoExecutors: true})
	cmd := exec.Command(buildExecutor(t), "--id", "shell-killed", "--workspace", ws, "--shell", "--shell-test-command", "sh -c")
	cmd.Env = append(os.Environ(), "NATS_URL="+srv.URL)
	out := &actionbustest.LogBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("executor output:\n%s", out.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waitCatalog(t, ctx, st.Client, "shell")

	token := strconv.FormatInt(3700000+time.Now().UnixNano()%100000, 10)
	_, err := st.Client.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: "shell",
		Args: map[string]any{"argv": []any{"sh", "-c", fmt.Sprintf(`setsid sleep %[1]s.1 & sleep %[1]s.2`, token)}}}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return len(shelltest.Sleeping(token+".1")) == 1 && len(shelltest.Sleeping(token+".2")) == 1
	},
		10*time.Second, 10*time.Millisecond, "the command and its setsid child run")
	require.NoError(t, cmd.Process.Kill())
	<-exited
	require.Eventually(t, func() bool {
		return len(shelltest.Sleeping(token+".1")) == 0 && len(shelltest.Sleeping(token+".2")) == 0
	},
		5*time.Second, 10*time.Millisecond, "a process of the killed executor's sandbox still runs")
}
