package builtin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/executor"
)

// The shell action (seed 003's safe profile): commands from an allow-list,
// run as argv (no shell interpreter) in the workspace, each in a kernel
// sandbox (sandbox.go): bubblewrap's user, mount, PID, network, IPC, UTS
// and cgroup namespaces, a read-only filesystem but for the call's scratch
// space, no network unless the host allows it, a cgroup bounding its
// processes and memory, rlimits bounding each process's CPU time and
// address space. The allow-list is what the planner is offered, not the
// boundary: the sandbox is. Where the sandbox cannot be had, calls fail
// with isolation_unavailable; nothing runs outside it. stdout and stderr
// come back as bounded previews, the full streams as artifacts.

// SafeCommands is the default profile: argv prefixes a command must start
// with.
var SafeCommands = [][]string{
	{"pwd"}, {"ls"}, {"cat"}, {"rg"}, {"grep"}, {"head"}, {"tail"}, {"wc"},
	{"git", "status"}, {"git", "diff"}, {"git", "log"},
}

// ShellConfig configures the shell action. Zero values take the defaults
// named.
type ShellConfig struct {
	// Root is the workspace root: commands run in it or below it.
	Root string
	// Commands is the allow-list of argv prefixes; default SafeCommands.
	Commands [][]string
	// TestCommand, when set, is the project's test command, allowed as
	// an argv prefix too (for example ["go", "test"]).
	TestCommand []string
	// AllowNetwork lets commands use the host's network; by default each
	// runs in a network namespace of its own (no interface but a down
	// loopback).
	AllowNetwork bool
	// Timeout bounds a command; default 30 s.
	Timeout time.Duration
	// CPUSeconds bounds a command's CPU time (RLIMIT_CPU); default 20.
	CPUSeconds uint64
	// MemoryBytes bounds each process's address space (RLIMIT_AS) and,
	// where a memory cgroup controller is at hand, the memory of the whole
	// sandbox; default 2 GiB.
	MemoryBytes uint64
	// MaxProcesses bounds the processes (and threads) of one sandbox, by a
	// pids cgroup; default 128. A call that reaches it is killed and fails
	// with shell_limit_exceeded.
	MaxProcesses uint64
	// TmpBytes bounds the sandbox's private /tmp (a tmpfs, also HOME);
	// default 256 MiB.
	TmpBytes uint64
	// ReadOnlyPaths are host paths a command may read besides the
	// workspace and the system directories (/usr, /etc, /bin, /lib…),
	// for example a Go module cache; default none.
	ReadOnlyPaths []string
	// Bwrap is the bubblewrap binary; default bwrap found in
	// /usr/local/bin:/usr/bin:/bin. Without it every call fails with
	// isolation_unavailable.
	Bwrap string
	// CgroupParent is a cgroup v2 directory the executor may create
	// cgroups in (a delegated subtree); default: the executor's own cgroup
	// in the v1 pids and memory hierarchies, or in cgroup v2.
	CgroupParent string
	// PreviewBytes bounds each stream's preview; default 16 KiB. A
	// longer stream is stored whole as an artifact (up to MaxStreamBytes).
	PreviewBytes int
	// MaxStreamBytes bounds what is kept of a stream; default 8 MiB.
	MaxStreamBytes int
	// Env is the environment commands see besides PATH, HOME (/tmp), LANG
	// and TERM; nothing of the executor's own environment is passed on.
	Env map[string]string
	// ApproveUnlisted registers shell_unlisted: any command, as a mutate
	// action that waits for an approval.
	ApproveUnlisted bool
}

func (c *ShellConfig) setDefaults() {
	if c.Commands == nil {
		c.Commands = SafeCommands
	}
	if len(c.TestCommand) > 0 {
		c.Commands = append(slices.Clone(c.Commands), c.TestCommand)
	}
	if c.Timeout <= 0 {
		c.Timeout = 30 * time.Second
	}
	if c.CPUSeconds == 0 {
		c.CPUSeconds = 20
	}
	if c.MemoryBytes == 0 {
		c.MemoryBytes = 2 << 30
	}
	if c.MaxProcesses == 0 {
		c.MaxProcesses = 128
	}
	if c.TmpBytes == 0 {
		c.TmpBytes = 256 << 20
	}
	if c.PreviewBytes <= 0 {
		c.PreviewBytes = 16 << 10
	}
	if c.MaxStreamBytes <= 0 {
		c.MaxStreamBytes = 8 << 20
	}
}

// ShellArgs is the shell action's input. AllowUnsafe is host-only: a
// model cannot set it (it is stripped from model input).
type ShellArgs struct {
	Argv        []string `json:"argv" jsonschema:"minItems=1,maxItems=64"`
	Cwd         string   `json:"cwd,omitempty" jsonschema:"description=a directory below the workspace root"`
	AllowUnsafe bool     `json:"allow_unsafe,omitempty"`
}

// ShellResult is what a command that ran returns.
type ShellResult struct {
	Argv       []string `json:"argv"`
	ExitCode   int      `json:"exitCode"`
	DurationMs int64    `json:"durationMs"`
	Stdout     Stream   `json:"stdout"`
	Stderr     Stream   `json:"stderr"`
	// Isolation says what the command ran under.
	Isolation []string `json:"isolation"`
}

// Stream is one output stream: a bounded preview, and the whole stream as
// an artifact when the preview is not all of it.
type Stream struct {
	Preview   string                `json:"preview"`
	Bytes     int                   `json:"bytes"`
	Truncated bool                  `json:"truncated,omitempty"`
	Artifact  *executor.ArtifactRef `json:"artifact,omitempty"`
	// Dropped counts bytes past MaxStreamBytes, kept nowhere.
	Dropped int `json:"dropped,omitempty"`
}

// Shell runs commands by a ShellConfig.
type Shell struct {
	cfg   ShellConfig
	root  string
	bwrap string // "" when not installed
	// dropTo is the host uid the sandbox runs as ("" to stay: the
	// executor is not root), setpriv the tool that drops to it.
	dropTo, setpriv string
	// masked are the maskedFiles this host has.
	masked []string

	probeOnce sync.Once
	probeErr  error
	cgroups   cgroupRoots
}

// NewShell returns a shell over cfg.Root.
func NewShell(cfg ShellConfig) (*Shell, error) {
	cfg.setDefaults()
	root, err := filepath.EvalSymlinks(cfg.Root)
	if err != nil {
		return nil, fmt.Errorf("shell: root: %w", err)
	}
	if root, err = filepath.Abs(root); err != nil {
		return nil, err
	}
	sh := &Shell{cfg: cfg, root: root, bwrap: cfg.Bwrap}
	for _, f := range maskedFiles {
		if _, err := os.Lstat(f); err == nil {
			sh.masked = append(sh.masked, f)
		}
	}
	if sh.bwrap == "" {
		sh.bwrap, _ = lookPath("bwrap")
	} else if st, err := os.Stat(sh.bwrap); err != nil || st.IsDir() {
		sh.bwrap = ""
	}
	return sh, nil
}

// Allowed reports whether argv starts with one of the allowed prefixes.
func (s *Shell) Allowed(argv []string) bool {
	for _, p := range s.cfg.Commands {
		if len(argv) >= len(p) && slices.Equal(argv[:len(p)], p) {
			return true
		}
	}
	return false
}

// refuse is a refusal before anything runs.
func refuse(format string, a ...any) *actionbus.Error {
	return actionbus.Errorf(actionbus.CodeShellRefused, format, a...)
}

// Run runs one command in its sandbox. unlisted lets a command outside
// the profile run (the host's allow_unsafe, or an approved shell_unlisted
// call), with the workspace writable. put stores a stream that does not
// fit its preview (nil: previews only).
func (s *Shell) Run(ctx context.Context, in ShellArgs, unlisted bool, put func(ctx context.Context, role string, data []byte) (executor.ArtifactRef, error)) (ShellResult, error) {
	if len(in.Argv) == 0 || in.Argv[0] == "" {
		return ShellResult{}, refuse("argv needs a command")
	}
	if !unlisted && !s.Allowed(in.Argv) {
		return ShellResult{}, refuse("%q is outside the shell profile (allowed: %s)", strings.Join(in.Argv, " "), s.profile()).
			WithDetail("argv", in.Argv)
	}
	dir, err := s.dir(in.Cwd)
	if err != nil {
		return ShellResult{}, err
	}
	bin, lerr := lookPath(in.Argv[0])
	if lerr != nil {
		return ShellResult{}, refuse("command %q not found", in.Argv[0])
	}
	if err := s.ready(); err != nil {
		return ShellResult{}, err
	}
	callCtx := ctx
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	spec := s.spec(dir, unlisted, append([]string{bin}, in.Argv[1:]...))
	sb, err := s.sandbox(ctx, spec)
	if err != nil {
		return ShellResult{}, err
	}
	res := ShellResult{Argv: in.Argv, ExitCode: sb.exitCode, DurationMs: sb.duration.Milliseconds(), Isolation: s.isolation(spec, sb.memory)}
	// The streams are stored under the call's context, not the command's
	// timeout: a command that timed out keeps its output and its code.
	if res.Stdout, err = s.stream(callCtx, "stdout", sb.stdout, put); err != nil {
		return ShellResult{}, err
	}
	if res.Stderr, err = s.stream(callCtx, "stderr", sb.stderr, put); err != nil {
		return ShellResult{}, err
	}
	tails := func(e *actionbus.Error) *actionbus.Error {
		return e.WithDetail("exitCode", res.ExitCode).WithDetail("stdoutTail", tail(sb.stdout.buf.Bytes(), 2048)).
			WithDetail("stderrTail", tail(sb.stderr.buf.Bytes(), 2048))
	}
	switch {
	case sb.pidsLimit:
		return res, tails(actionbus.Errorf(actionbus.CodeShellLimit, "%s reached the sandbox's bound of %d processes; the sandbox was killed", in.Argv[0], s.cfg.MaxProcesses).
			WithDetail("limit", "processes").WithDetail("max", s.cfg.MaxProcesses))
	case ctx.Err() != nil:
		return res, tails(actionbus.Errorf(actionbus.CodeTimeout, "%s: killed with its sandbox after %s", in.Argv[0], s.cfg.Timeout))
	case sb.err != nil && res.ExitCode != 0:
		return res, tails(actionbus.Errorf(actionbus.CodeShellExit, "%s exited with code %d", in.Argv[0], res.ExitCode))
	case sb.err != nil:
		return res, tails(actionbus.Errorf(actionbus.CodeShellExit, "%s: %v", in.Argv[0], sb.err))
	}
	return res, nil
}

// isolationUnavailable is the failure of a call that cannot run in its
// sandbox: it never runs outside one.
func isolationUnavailable(format string, a ...any) *actionbus.Error {
	return actionbus.Errorf(actionbus.CodeIsolationUnavailable, "shell: "+format, a...)
}

// spec is the sandbox of a command run in dir; unlisted commands may write
// the workspace, the profile's may not.
func (s *Shell) spec(dir string, unlisted bool, argv []string) sandboxSpec {
	return sandboxSpec{Workspace: s.root, Writable: unlisted, Cwd: dir, Network: s.cfg.AllowNetwork,
		ReadOnly: s.cfg.ReadOnlyPaths, Masked: s.masked, TmpBytes: s.cfg.TmpBytes, Env: s.env(), Argv: argv}
}

// isolation says, in the result, what the command ran under.
func (s *Shell) isolation(spec sandboxSpec, memory bool) []string {
	out := []string{"argv (no shell)", "bubblewrap sandbox: own user, mount, pid, ipc, uts and cgroup namespaces",
		"uid " + sandboxUID + " without capabilities", "scrubbed environment",
		"read-only filesystem: " + strings.Join(append(slices.Clone(systemPaths), spec.ReadOnly...), " ")}
	if spec.Writable {
		out = append(out, "workspace writable")
	} else {
		out = append(out, "workspace read-only")
	}
	out = append(out, fmt.Sprintf("private /tmp of %d MiB", spec.TmpBytes>>20))
	if !spec.Network {
		out = append(out, "no network (own network namespace)")
	}
	out = append(out, fmt.Sprintf("at most %d processes (pids cgroup)", s.cfg.MaxProcesses))
	if memory {
		out = append(out, fmt.Sprintf("memory %d MiB in all (memory cgroup)", s.cfg.MemoryBytes>>20))
	}
	return append(out, fmt.Sprintf("cpu %d s, address space %d MiB per process", s.cfg.CPUSeconds, s.cfg.MemoryBytes>>20))
}

// ready probes, once, that this host runs the sandbox: bwrap is there, the
// kernel lets it create its namespaces, and a call cgroup can be made.
func (s *Shell) ready() error {
	s.probeOnce.Do(func() {
		if s.bwrap == "" {
			s.probeErr = isolationUnavailable("bubblewrap (bwrap) is not installed; commands never run unsandboxed")
			return
		}
		roots, err := findCgroups(s.cfg.CgroupParent)
		if err != nil {
			s.probeErr = isolationUnavailable("no cgroup to bound the sandbox's processes in: %v", err)
			return
		}
		s.cgroups = roots
		roots.removeStale()
		t, err := lookPath("true")
		if err != nil {
			s.probeErr = isolationUnavailable("probe: %v", err)
			return
		}
		if os.Geteuid() == 0 {
			// Run by root, the sandbox would be host uid 0 (see hostUID).
			if s.setpriv, err = lookPath("setpriv"); err != nil {
				s.probeErr = isolationUnavailable("the executor runs as root and setpriv (util-linux), which drops the sandbox to an unprivileged uid, is missing")
				return
			}
			s.dropTo = hostUID
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		sb, err := s.sandbox(ctx, s.spec(s.root, false, []string{t}))
		switch {
		case err != nil:
			s.probeErr = err
		case sb.exitCode == wrapperExit:
			s.probeErr = isolationUnavailable("the sandbox could not join its cgroup or set its limits: %s", tail(sb.stderr.buf.Bytes(), 512))
		case sb.err != nil:
			s.probeErr = isolationUnavailable("the kernel refused the sandbox (%v): %s", sb.err, tail(sb.stderr.buf.Bytes(), 512))
		}
	})
	return s.probeErr
}

// ran is what happened to one sandboxed command.
type ran struct {
	stdout, stderr *capped
	exitCode       int
	err            error // from Wait
	duration       time.Duration
	pidsLimit      bool // a fork was refused by the process bound; killed
	memory         bool // the memory cgroup bound applied
}

// sandbox runs spec under bwrap in a cgroup of its own, the one place a
// command runs. Ending it (timeout, cancel, the process bound) kills bwrap;
// its PID namespace's init dies with it (--die-with-parent), and with that
// init the kernel kills every process of the namespace: nothing the command
// started, in any session, survives the call.
func (s *Shell) sandbox(ctx context.Context, spec sandboxSpec) (ran, error) {
	cg, err := newCallCgroup(s.cgroups, s.cfg.MaxProcesses, s.cfg.MemoryBytes)
	if err != nil {
		return ran{}, isolationUnavailable("%v", err)
	}
	defer cg.remove()
	r := ran{stdout: &capped{max: s.cfg.MaxStreamBytes}, stderr: &capped{max: s.cfg.MaxStreamBytes}, memory: cg.memory}
	cmd := exec.CommandContext(ctx, "/bin/sh", wrapperArgs(cg.procs(), s.cfg.CPUSeconds, s.cfg.MemoryBytes, s.dropTo, s.setpriv, s.bwrap, bwrapArgs(spec))...)
	// bwrap itself sees nothing of the executor's environment either.
	cmd.Dir, cmd.Env = "/", []string{"PATH=" + shellPath}
	cmd.Stdout, cmd.Stderr, cmd.Stdin = r.stdout, r.stderr, nil
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	// Killing bwrap is enough: the namespace's init dies with it, and every
	// process of the namespace with that init. (os.Process signals through
	// a pidfd: never a reused pid.)
	kill := func() error { return cmd.Process.Kill() }
	cmd.Cancel, cmd.WaitDelay = kill, 2*time.Second
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return ran{}, isolationUnavailable("starting the sandbox: %v", err)
	}
	done := make(chan struct{})
	var hit atomic.Bool
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if cg.pidsLimitHit() {
					hit.Store(true)
					_ = kill()
					return
				}
			}
		}
	}()
	r.err = cmd.Wait()
	close(done)
	r.duration, r.exitCode = time.Since(start), cmd.ProcessState.ExitCode()
	r.pidsLimit = hit.Load() || cg.pidsLimitHit()
	return r, nil
}

func (s *Shell) profile() string {
	var out []string
	for _, p := range s.cfg.Commands {
		out = append(out, strings.Join(p, " "))
	}
	return strings.Join(out, ", ")
}

// dir resolves cwd below the root, symlinks included.
func (s *Shell) dir(cwd string) (string, error) {
	if cwd == "" {
		return s.root, nil
	}
	if filepath.IsAbs(cwd) {
		return "", actionbus.Errorf(actionbus.CodeWorkspacePath, "cwd must be relative to the workspace root").WithDetail("cwd", cwd)
	}
	p, err := filepath.EvalSymlinks(filepath.Join(s.root, cwd))
	if err != nil {
		return "", actionbus.Errorf(actionbus.CodeWorkspacePath, "cwd %q does not exist below the workspace root", cwd)
	}
	if rel, err := filepath.Rel(s.root, p); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", actionbus.Errorf(actionbus.CodeWorkspacePath, "cwd %q leaves the workspace root", cwd)
	}
	return p, nil
}

// shellPath is the only PATH commands are looked up in and see.
const shellPath = "/usr/local/bin:/usr/bin:/bin"

func lookPath(name string) (string, error) {
	if strings.Contains(name, "/") {
		return "", errors.New("a command is a name, not a path")
	}
	for _, d := range filepath.SplitList(shellPath) {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}

func (s *Shell) env() []string {
	env := []string{"PATH=" + shellPath, "HOME=/tmp", "LANG=C.UTF-8", "TERM=dumb"}
	keys := make([]string, 0, len(s.cfg.Env))
	for k := range s.cfg.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		env = append(env, k+"="+s.cfg.Env[k])
	}
	return env
}

// stream is a captured stream's preview, stored whole as an artifact when
// the preview is not all of it.
func (s *Shell) stream(ctx context.Context, role string, c *capped, put func(context.Context, string, []byte) (executor.ArtifactRef, error)) (Stream, error) {
	data := c.buf.Bytes()
	st := Stream{Bytes: len(data) + c.dropped, Dropped: c.dropped}
	preview := data
	if len(preview) > s.cfg.PreviewBytes {
		preview = preview[:s.cfg.PreviewBytes]
		st.Truncated = true
	}
	st.Preview = strings.ToValidUTF8(string(preview), "")
	if (st.Truncated || c.dropped > 0) && put != nil {
		ref, err := put(ctx, role, data)
		if err != nil {
			return Stream{}, actionbus.Errorf(actionbus.CodeHandlerFailed, "shell: storing %s: %v", role, err)
		}
		ref.Preview = "" // the preview is above
		st.Artifact = &ref
	}
	return st, nil
}

// capped keeps the first max bytes written and counts the rest.
type capped struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	max     int
	dropped int
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	room := c.max - c.buf.Len()
	if room >= len(p) {
		c.buf.Write(p)
	} else {
		if room > 0 {
			c.buf.Write(p[:room])
		}
		c.dropped += len(p) - max(room, 0)
	}
	return len(p), nil
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return strings.ToValidUTF8(string(b), "")
}

// registerShell registers shell (and, when the host enables it,
// shell_unlisted) on ex.
func registerShell(ex *executor.Executor, cfg ShellConfig) error {
	sh, err := NewShell(cfg)
	if err != nil {
		return err
	}
	put := func(call executor.Call) func(context.Context, string, []byte) (executor.ArtifactRef, error) {
		return func(ctx context.Context, role string, data []byte) (executor.ArtifactRef, error) {
			return call.PutArtifact(ctx, role, "text/plain; charset=utf-8", data)
		}
	}
	summary := func(r ShellResult) string {
		return fmt.Sprintf("%s: exit %d, %d bytes out, %d bytes err", strings.Join(r.Argv, " "), r.ExitCode, r.Stdout.Bytes, r.Stderr.Bytes)
	}
	err = executor.Register(ex, executor.Action{
		Name: "shell", Mode: executor.ModeRead, Tier: 0, Version: "1", Timeout: sh.cfg.Timeout + 10*time.Second,
		Description: "Run one allowed command (as argv, no shell) in the workspace: " + sh.profile() + ".",
		Permission:  readOnly("process"), Tags: []string{"shell", "workspace"}, ResourceType: "process", RiskLevel: "medium",
		HostOnlyKeys: []string{"allow_unsafe"},
		Planner: &executor.PlannerMeta{ArgsExample: map[string]any{"argv": []any{"git", "status"}},
			Guidance: "For tests, builds, git inspection and read-only diagnostics; not for editing files."},
		AuditPolicy: &executor.AuditPolicy{Output: "summary"},
	}, func(ctx context.Context, in ShellArgs, call executor.Call) (executor.Result[ShellResult], error) {
		res, err := sh.Run(ctx, in, in.AllowUnsafe && call.Origin == "host", put(call))
		if err != nil {
			return executor.Result[ShellResult]{}, err
		}
		return executor.Result[ShellResult]{Output: res, Summary: summary(res)}, nil
	})
	if err != nil || !cfg.ApproveUnlisted {
		return err
	}
	return executor.Register(ex, executor.Action{
		Name: "shell_unlisted", Mode: executor.ModeMutate, Tier: 2, Version: "1", Timeout: sh.cfg.Timeout + 10*time.Second,
		Description: "Run a command outside the shell profile; it waits for an approval of the exact argv.",
		Permission:  writes("process"), Tags: []string{"shell"}, ResourceType: "process", RiskLevel: "high",
		AuditPolicy: &executor.AuditPolicy{Output: "summary"},
	}, func(ctx context.Context, in ShellArgs, call executor.Call) (executor.Result[ShellResult], error) {
		if call.Approval == nil || call.Approval.Context.InputHash != call.InputHash {
			return executor.Result[ShellResult]{}, actionbus.Errorf(actionbus.CodeApprovalRequired, "shell_unlisted runs only with an approval of its exact input")
		}
		res, err := sh.Run(ctx, ShellArgs{Argv: in.Argv, Cwd: in.Cwd}, true, put(call))
		if err != nil {
			return executor.Result[ShellResult]{}, err
		}
		return executor.Result[ShellResult]{Output: res, Summary: summary(res)}, nil
	})
}
