package builtin_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/builtin"
	"github.com/actionbus/actionbus/internal/shelltest"
)

func shellIn(t *testing.T, cfg builtin.ShellConfig) (*builtin.Shell, string) {
	t.Helper()
	root := shelltest.Workspace(t)
	require.NoError(t, os.WriteFile(filepath.Join(root, "a.txt"), []byte("hello\n"), 0o644))
	require.NoError(t, os.Mkdir(filepath.Join(root, "sub"), 0o755))
	// A command the host grants writes the workspace: a root executor's
	// sandbox writes as host nobody (docs/architecture.md, "Shell").
	require.NoError(t, os.Chmod(root, 0o777))
	cfg.Root = root
	sh, err := builtin.NewShell(cfg)
	require.NoError(t, err)
	root, _ = filepath.EvalSymlinks(root)
	return sh, root
}

func run(t *testing.T, sh *builtin.Shell, argv ...string) (builtin.ShellResult, *actionbus.Error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := sh.Run(ctx, builtin.ShellArgs{Argv: argv}, false, nil)
	var abErr *actionbus.Error
	if err != nil {
		require.True(t, errors.As(err, &abErr), "a typed error: %v", err)
	}
	return res, abErr
}

func TestShellRunsAllowedCommandsInTheRoot(t *testing.T) {
	sh, root := shellIn(t, builtin.ShellConfig{})
	res, err := run(t, sh, "pwd")
	require.Nil(t, err)
	assert.Equal(t, root+"\n", res.Stdout.Preview)
	assert.Equal(t, 0, res.ExitCode)
	res, err = run(t, sh, "cat", "a.txt")
	require.Nil(t, err)
	assert.Equal(t, "hello\n", res.Stdout.Preview)
	assert.Contains(t, res.Isolation, "no network (own network namespace)")

	ctx := context.Background()
	res, rerr := sh.Run(ctx, builtin.ShellArgs{Argv: []string{"pwd"}, Cwd: "sub"}, false, nil)
	require.NoError(t, rerr)
	assert.Equal(t, filepath.Join(root, "sub")+"\n", res.Stdout.Preview)
	require.NoError(t, os.Symlink("/", filepath.Join(root, "out")))
	for _, cwd := range []string{"..", "/tmp", "out", "missing"} {
		_, rerr = sh.Run(ctx, builtin.ShellArgs{Argv: []string{"pwd"}, Cwd: cwd}, false, nil)
		assert.ErrorIs(t, rerr, &actionbus.Error{Code: actionbus.CodeWorkspacePath}, cwd)
	}
}

func TestShellRefusesCommandsOutsideItsProfile(t *testing.T) {
	sh, root := shellIn(t, builtin.ShellConfig{})
	for _, argv := range [][]string{{"rm", "a.txt"}, {"sh", "-c", "rm a.txt"}, {"/bin/ls"}, {"git", "push"}, {""}} {
		_, err := run(t, sh, argv...)
		require.NotNil(t, err, "%v", argv)
		assert.Equal(t, actionbus.CodeShellRefused, err.Code, "%v", argv)
	}
	_, statErr := os.Stat(filepath.Join(root, "a.txt"))
	assert.NoError(t, statErr, "nothing ran")
	// The host grants a command outside the profile explicitly.
	res, err := sh.Run(context.Background(), builtin.ShellArgs{Argv: []string{"mkdir", "made"}}, true, nil)
	require.NoError(t, err)
	assert.Equal(t, 0, res.ExitCode)
	assert.DirExists(t, filepath.Join(root, "made"))
}

func TestShellNonZeroExitIsAStructuredFailure(t *testing.T) {
	sh, _ := shellIn(t, builtin.ShellConfig{})
	res, err := run(t, sh, "cat", "missing.txt")
	require.NotNil(t, err)
	assert.Equal(t, actionbus.CodeShellExit, err.Code)
	assert.Equal(t, 1, err.Details["exitCode"])
	assert.Contains(t, err.Details["stderrTail"], "No such file")
	assert.Equal(t, 1, res.ExitCode)
}

// A timeout ends the whole sandbox: a child that left the session
// (setsid) and a double-forked one (reparented to the sandbox's init) die
// with it. Both are seen alive on the host first, by a token in their argv.
func TestShellTimeoutLeavesNoDescendant(t *testing.T) {
	sh, _ := shellIn(t, builtin.ShellConfig{Commands: [][]string{{"sh", "-c"}}, Timeout: 5 * time.Second})
	token := fmt.Sprintf("%d", 3600000+time.Now().UnixNano()%100000)
	script := fmt.Sprintf(`setsid sleep %[1]s.1 & sh -c "sleep %[1]s.2 &"; sleep %[1]s.3`, token)
	type outcome struct {
		err  error
		took time.Duration
	}
	done := make(chan outcome, 1)
	go func() {
		start := time.Now()
		_, err := sh.Run(context.Background(), builtin.ShellArgs{Argv: []string{"sh", "-c", script}}, false, nil)
		done <- outcome{err, time.Since(start)}
	}()
	require.Eventually(t, func() bool {
		return len(shelltest.Sleeping(token+".1")) == 1 && len(shelltest.Sleeping(token+".2")) == 1
	},
		5*time.Second, 10*time.Millisecond, "the setsid and double-forked children were started")
	o := <-done
	assert.ErrorIs(t, o.err, &actionbus.Error{Code: actionbus.CodeTimeout})
	assert.Less(t, o.took, 10*time.Second, "killed, not waited for")
	for _, n := range []string{".1", ".2", ".3"} {
		assert.Empty(t, shelltest.Sleeping(token+n), "no descendant outlives the call: sleep %s%s", token, n)
	}
}

func TestShellCPULimitStopsABusyCommand(t *testing.T) {
	sh, _ := shellIn(t, builtin.ShellConfig{Commands: [][]string{{"sh", "-c"}}, CPUSeconds: 1, Timeout: 20 * time.Second})
	start := time.Now()
	_, err := run(t, sh, "sh", "-c", "while :; do :; done")
	require.NotNil(t, err)
	assert.Equal(t, actionbus.CodeShellExit, err.Code, "stopped by its CPU limit, not the timeout: %v", err)
	assert.Less(t, time.Since(start), 15*time.Second)
}

func TestShellOutputOverTheLimitBecomesAnArtifact(t *testing.T) {
	sh, root := shellIn(t, builtin.ShellConfig{PreviewBytes: 100})
	big := strings.Repeat("0123456789", 500)
	require.NoError(t, os.WriteFile(filepath.Join(root, "big.txt"), []byte(big), 0o644))
	stored := map[string][]byte{}
	put := func(_ context.Context, role string, data []byte) (executor.ArtifactRef, error) {
		stored[role] = append([]byte(nil), data...)
		return executor.ArtifactRef{ID: "art-" + role, Role: role, Bytes: int64(len(data))}, nil
	}
	res, err := sh.Run(context.Background(), builtin.ShellArgs{Argv: []string{"cat", "big.txt"}}, false, put)
	require.NoError(t, err)
	assert.True(t, res.Stdout.Truncated)
	assert.Len(t, res.Stdout.Preview, 100)
	assert.Equal(t, 5000, res.Stdout.Bytes)
	require.NotNil(t, res.Stdout.Artifact)
	assert.Equal(t, "art-stdout", res.Stdout.Artifact.ID)
	assert.Equal(t, big, string(stored["stdout"]), "the full stream")
	assert.Nil(t, res.Stderr.Artifact, "a stream that fits has no artifact")
}

func TestShellEnvironmentCarriesNoSecrets(t *testing.T) {
	t.Setenv("ACTIONBUS_TEST_SECRET", "s3cr3t-token-value")
	sh, _ := shellIn(t, builtin.ShellConfig{Commands: [][]string{{"env"}}, Env: map[string]string{"GOFLAGS": "-mod=mod"}})
	res, err := run(t, sh, "env")
	require.Nil(t, err)
	assert.NotContains(t, res.Stdout.Preview, "s3cr3t-token-value")
	assert.Contains(t, res.Stdout.Preview, "PATH=/usr/local/bin:/usr/bin:/bin\n")
	assert.Contains(t, res.Stdout.Preview, "HOME=/tmp\n", "the sandbox's private /tmp")
	assert.Contains(t, res.Stdout.Preview, "GOFLAGS=-mod=mod\n", "what the host passes on")
}

func TestShellHasNoNetworkUnlessTheHostAllowsIt(t *testing.T) {
	if _, err := os.Stat("/usr/bin/bash"); err != nil {
		t.Skip("bash (for /dev/tcp) is not installed")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	connect := fmt.Sprintf("echo hi > /dev/tcp/127.0.0.1/%d", ln.Addr().(*net.TCPAddr).Port)
	sh, _ := shellIn(t, builtin.ShellConfig{Commands: [][]string{{"bash", "-c"}}})
	_, rerr := run(t, sh, "bash", "-c", connect)
	require.NotNil(t, rerr, "connected to the host's loopback from an isolated command")
	assert.Equal(t, actionbus.CodeShellExit, rerr.Code)

	open, _ := shellIn(t, builtin.ShellConfig{Commands: [][]string{{"bash", "-c"}}, AllowNetwork: true})
	res, rerr := run(t, open, "bash", "-c", connect)
	require.Nil(t, rerr, "%v", rerr)
	assert.Equal(t, 0, res.ExitCode)
	assert.NotContains(t, res.Isolation, "no network (own network namespace)")
}

// Through the services: the model's allow_unsafe is stripped (host-only),
// so its command outside the profile is refused; the host's exec call may
// grant it.
func TestModelInputCannotSetAllowUnsafe(t *testing.T) {
	root := shelltest.Workspace(t)
	require.NoError(t, os.WriteFile(filepath.Join(root, "a.txt"), []byte("keep me"), 0o644))
	// The host's allow_unsafe call writes its scratch space: a root
	// executor's sandbox writes as host nobody, so the workspace lets it.
	require.NoError(t, os.Chmod(root, 0o777))
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		_, err := builtin.Register(ex, builtin.Config{WorkspaceRoot: root, Shell: &builtin.ShellConfig{}})
		return err
	}, Scenarios: `
scenarios:
  unsafe:
    decisions:
      - {type: action, name: shell, args: {argv: [rm, a.txt], allow_unsafe: true}}
      - {type: final, answer: done}
`})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var steps []string
	res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "unsafe", Prompt: "p"}, func(e client.Event) {
		if s, ok := e.Step(); ok {
			steps = append(steps, s.Name)
		}
	})
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status)
	assert.FileExists(t, filepath.Join(root, "a.txt"), "the model's command did not run")
	assert.Contains(t, steps, "action.input.unexpected_keys_stripped")

	res, err = st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "shell",
		Args: map[string]any{"argv": []any{"mkdir", "made"}, "allow_unsafe": true}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.DirExists(t, filepath.Join(root, "made"), "the host granted it")
}

// Through an executor, a stream longer than its preview is in the
// deployment's artifact store, whole.
func TestShellStreamsReachTheArtifactStore(t *testing.T) {
	root := shelltest.Workspace(t)
	big := strings.Repeat("line of output\n", 400)
	require.NoError(t, os.WriteFile(filepath.Join(root, "big.txt"), []byte(big), 0o644))
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		_, err := builtin.Register(ex, builtin.Config{WorkspaceRoot: root, Shell: &builtin.ShellConfig{PreviewBytes: 64}})
		return err
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "shell", Args: map[string]any{"argv": []any{"cat", "big.txt"}}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	stdout := res.Output.(map[string]any)["stdout"].(map[string]any)
	assert.Len(t, stdout["preview"], 64)
	ref := stdout["artifact"].(map[string]any)
	data, sum, err := st.Client.Artifact(ctx, ref["id"].(string))
	require.NoError(t, err)
	assert.Equal(t, big, string(data))
	assert.Equal(t, ref["sha256"], sum)
}

// Without bubblewrap a call fails closed: isolation_unavailable, and the
// command did not run.
func TestShellWithoutBubblewrapFailsClosed(t *testing.T) {
	sh, root := shellIn(t, builtin.ShellConfig{Bwrap: "/nonexistent/bwrap"})
	_, err := sh.Run(context.Background(), builtin.ShellArgs{Argv: []string{"mkdir", "made"}}, true, nil)
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeIsolationUnavailable})
	assert.NoDirExists(t, filepath.Join(root, "made"), "nothing ran unsandboxed")
	_, err = sh.Run(context.Background(), builtin.ShellArgs{Argv: []string{"pwd"}}, false, nil)
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeIsolationUnavailable}, "every call")
}

// When the kernel refuses the sandbox (here: bwrap given a binary that is
// not bwrap and fails), calls fail closed too.
func TestShellWhoseSandboxTheKernelRefusesFailsClosed(t *testing.T) {
	sh, root := shellIn(t, builtin.ShellConfig{Bwrap: "/bin/false"})
	_, err := sh.Run(context.Background(), builtin.ShellArgs{Argv: []string{"mkdir", "made"}}, true, nil)
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeIsolationUnavailable})
	assert.NoDirExists(t, filepath.Join(root, "made"))
}

// The profile's commands see the workspace read-only and the host's
// filesystem not at all beyond the system directories; /tmp is private.
func TestShellFilesystemIsReadOnlyButForScratch(t *testing.T) {
	outside := t.TempDir()
	sh, root := shellIn(t, builtin.ShellConfig{Commands: [][]string{{"sh", "-c"}}})
	// Writable by anyone on the host: only the read-only bind stops it.
	require.NoError(t, os.Chmod(filepath.Join(root, "a.txt"), 0o666))
	res, err := run(t, sh, "sh", "-c", "touch a.txt; touch "+outside+"/x; echo tmp > /tmp/t && cat /tmp/t; ls /root /home /work 2>&1; cat /etc/shadow | wc -c; id -u")
	require.Nil(t, err)
	assert.Contains(t, res.Stderr.Preview, "Read-only file system")
	assert.Contains(t, res.Stdout.Preview, "tmp\n")
	assert.Contains(t, res.Stdout.Preview, "No such file or directory", "the host's other directories do not exist in there")
	assert.Contains(t, res.Stdout.Preview, "\n0\n65534\n", "shadow is empty, the uid is nobody")
	assert.NoFileExists(t, filepath.Join(outside, "x"))
	info, serr := os.Stat(filepath.Join(root, "a.txt"))
	require.NoError(t, serr)
	assert.Equal(t, int64(6), info.Size())
}

// TestTheSandboxIsNeverHostRoot: a root executor's sandbox runs as an
// unprivileged host uid, not as host root behind a user namespace (whose
// file permissions let it write sysctls such as kernel.core_pattern, which
// the kernel runs as root outside every namespace). The command sees its
// uid mapped to host nobody, and writing a sysctl, even its own value
// back, is refused.
func TestTheSandboxIsNeverHostRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the executor is not root here: its sandbox is its own unprivileged uid")
	}
	sh, root := shellIn(t, builtin.ShellConfig{Commands: [][]string{{"sh", "-c"}}})
	require.NoError(t, os.WriteFile(filepath.Join(root, "root-only.txt"), []byte("ROOT-ONLY"), 0o600))
	res, err := run(t, sh, "sh", "-c", "cat root-only.txt; v=$(cat /proc/sys/kernel/printk_ratelimit); "+
		"if echo $v > /proc/sys/kernel/printk_ratelimit; then echo SYSCTL-WRITTEN; else echo sysctl-refused; fi; "+
		"if echo h > /proc/sysrq-trigger 2>/dev/null; then echo SYSRQ-WRITTEN; else echo sysrq-refused; fi")
	require.Nil(t, err)
	assert.NotContains(t, res.Stdout.Preview, "ROOT-ONLY", "the sandbox read a file only host root may read")
	assert.Contains(t, res.Stdout.Preview, "sysctl-refused")
	assert.NotContains(t, res.Stdout.Preview, "SYSCTL-WRITTEN")
	assert.NotContains(t, res.Stdout.Preview, "SYSRQ-WRITTEN")
}

// A fork bomb ends the call with shell_limit_exceeded, promptly, and the
// next call runs.
func TestShellForkBombEndsTheCall(t *testing.T) {
	sh, _ := shellIn(t, builtin.ShellConfig{Commands: [][]string{{"sh", "-c"}, {"pwd"}}, MaxProcesses: 16, Timeout: 20 * time.Second})
	start := time.Now()
	// Every process of this bomb stays alive until its children end, so it
	// grows until a fork is refused and cannot end on its own before.
	res, err := run(t, sh, "sh", "-c", "f() { f & f & wait; }; f")
	require.NotNil(t, err, "the bomb ended by itself: %q %q", res.Stdout.Preview, res.Stderr.Preview)
	assert.Equal(t, actionbus.CodeShellLimit, err.Code, "%v", err)
	assert.Equal(t, "processes", err.Details["limit"])
	assert.Less(t, time.Since(start), 10*time.Second, "ended by the bound, not the timeout")
	res, err = run(t, sh, "pwd")
	require.Nil(t, err)
	assert.Equal(t, 0, res.ExitCode)
}

// Where a memory controller is at hand, the sandbox's processes share one
// memory bound: four processes that each stay under the per-process
// address-space limit cannot hold four times it between them.
func TestShellMemoryBoundHoldsForTheWholeSandbox(t *testing.T) {
	sh, _ := shellIn(t, builtin.ShellConfig{Commands: [][]string{{"sh", "-c"}, {"true"}}, MemoryBytes: 96 << 20})
	probe, err := run(t, sh, "true")
	require.Nil(t, err)
	if !slices.Contains(probe.Isolation, "memory 96 MiB in all (memory cgroup)") {
		t.Skip("no memory cgroup controller here: each process's address space is bounded, not their sum")
	}
	// Each tail holds a 60 MB line until its input ends a second later;
	// four at once need 240 MB.
	hog := "(head -c 60000000 /dev/zero; sleep 1) | tail -n 1 | wc -c"
	res, err := run(t, sh, "sh", "-c", fmt.Sprintf("(%[1]s) & (%[1]s) & (%[1]s) & (%[1]s) & wait", hog))
	require.Nil(t, err, "the hogs' pipelines end with wc, which exits 0")
	assert.Less(t, strings.Count(res.Stdout.Preview, "60000000"), 4, "four 60 MB lines held at once under a 96 MiB bound: %q", res.Stdout.Preview)
	assert.Contains(t, res.Stderr.Preview, "Killed", "the kernel's OOM killer, inside the sandbox's cgroup")
	one, err := run(t, sh, "sh", "-c", hog)
	require.Nil(t, err, "one hog fits")
	assert.Equal(t, "60000000\n", one.Stdout.Preview)
}

// Where no cgroup can bound the sandbox's processes (here: a directory
// that is not a cgroup), calls fail closed too: nothing runs unbounded.
func TestShellWithoutAProcessBoundFailsClosed(t *testing.T) {
	sh, root := shellIn(t, builtin.ShellConfig{CgroupParent: t.TempDir()})
	_, err := sh.Run(context.Background(), builtin.ShellArgs{Argv: []string{"mkdir", "made"}}, true, nil)
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeIsolationUnavailable})
	assert.NoDirExists(t, filepath.Join(root, "made"))
}

// A command that printed more than its preview and then ran past its
// timeout fails with timeout, its output stored whole: the streams are
// stored under the call's context, not the command's expired one.
func TestATimedOutCommandKeepsItsOutputAndItsCode(t *testing.T) {
	sh, _ := shellIn(t, builtin.ShellConfig{Commands: [][]string{{"sh", "-c"}}, Timeout: 2 * time.Second})
	var stored []string
	put := func(ctx context.Context, role string, _ []byte) (executor.ArtifactRef, error) {
		if err := ctx.Err(); err != nil {
			return executor.ArtifactRef{}, err // as the artifact store does
		}
		stored = append(stored, role)
		return executor.ArtifactRef{ID: "art-" + role, Role: role}, nil
	}
	res, err := sh.Run(context.Background(), builtin.ShellArgs{Argv: []string{"sh", "-c", `head -c 100000 /dev/zero | tr '\0' x; sleep 30`}}, false, put)
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeTimeout}, "%v", err)
	assert.Equal(t, []string{"stdout"}, stored)
	require.NotNil(t, res.Stdout.Artifact)
}

// The sandbox's writable tmpfs, /dev/shm as well as /tmp, are bounded by
// TmpBytes: a command cannot fill the host's memory through them.
func TestShellScratchTmpfsAreBounded(t *testing.T) {
	sh, _ := shellIn(t, builtin.ShellConfig{Commands: [][]string{{"sh", "-c"}}, TmpBytes: 8 << 20})
	for _, dir := range []string{"/tmp", "/dev/shm"} {
		res, err := run(t, sh, "sh", "-c", "head -c 20000000 /dev/zero > "+dir+"/fill; wc -c < "+dir+"/fill")
		require.Nil(t, err, dir)
		assert.Contains(t, res.Stderr.Preview, "No space left on device", dir)
		size, perr := strconv.Atoi(strings.TrimSpace(res.Stdout.Preview))
		require.NoError(t, perr, res.Stdout.Preview)
		assert.LessOrEqual(t, size, 8<<20, "%s held more than its bound", dir)
	}
}
