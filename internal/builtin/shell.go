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
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/executor"
)

// The shell action (seed 003's safe profile): commands from an allow-list,
// run as argv (no shell interpreter) inside the workspace root, with a
// scrubbed environment, in their own session and process group (all killed
// on timeout or cancel), without network unless the host allows it (a
// network namespace of their own, through an unprivileged user namespace),
// under CPU-time and address-space limits; stdout and stderr come back as
// bounded previews, the full streams as artifacts.

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
	// AllowNetwork lets commands use the network; by default each runs in
	// a network namespace of its own (no interface but a down loopback).
	AllowNetwork bool
	// Timeout bounds a command; default 30 s.
	Timeout time.Duration
	// CPUSeconds bounds a command's CPU time (RLIMIT_CPU); default 20.
	CPUSeconds uint64
	// MemoryBytes bounds a command's address space (RLIMIT_AS); default
	// 2 GiB.
	MemoryBytes uint64
	// PreviewBytes bounds each stream's preview; default 16 KiB. A
	// longer stream is stored whole as an artifact (up to MaxStreamBytes).
	PreviewBytes int
	// MaxStreamBytes bounds what is kept of a stream; default 8 MiB.
	MaxStreamBytes int
	// Env is the environment commands see besides PATH, HOME, LANG and
	// TERM; nothing of the executor's own environment is passed on.
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
	cfg  ShellConfig
	root string
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
	return &Shell{cfg: cfg, root: root}, nil
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

// Run runs one command. unlisted lets a command outside the profile run
// (the host's allow_unsafe, or an approved shell_unlisted call). put
// stores a stream that does not fit its preview (nil: previews only).
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
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, in.Argv[1:]...)
	cmd.Dir, cmd.Env = dir, s.env()
	stdout, stderr := &capped{max: s.cfg.MaxStreamBytes}, &capped{max: s.cfg.MaxStreamBytes}
	cmd.Stdout, cmd.Stderr, cmd.Stdin = stdout, stderr, nil
	isolation := []string{"argv (no shell)", "session and process group", "scrubbed environment", "cwd inside the workspace root"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if !s.cfg.AllowNetwork {
		uid, gid := os.Getuid(), os.Getgid()
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}}
		isolation = append(isolation, "no network (own network namespace)")
	}
	// Timeout and cancellation kill the whole group: a command's children
	// go with it.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	start := time.Now()
	if err := cmd.Start(); err != nil {
		if !s.cfg.AllowNetwork && (errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOSPC)) {
			return ShellResult{}, actionbus.Errorf(actionbus.CodeShellRefused,
				"this host does not allow the unprivileged network namespace the shell runs commands in; the host may set AllowNetwork").
				WithDetail("reason", "isolation_unavailable")
		}
		return ShellResult{}, actionbus.Errorf(actionbus.CodeHandlerFailed, "shell: start %s: %v", in.Argv[0], err)
	}
	// Limits apply from here: the child has only just exec'd.
	for _, l := range []struct {
		res int
		val uint64
	}{{unix.RLIMIT_CPU, s.cfg.CPUSeconds}, {unix.RLIMIT_AS, s.cfg.MemoryBytes}} {
		lim := unix.Rlimit{Cur: l.val, Max: l.val}
		if err := unix.Prlimit(cmd.Process.Pid, l.res, &lim, nil); err != nil {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
			return ShellResult{}, actionbus.Errorf(actionbus.CodeHandlerFailed, "shell: setting limits: %v", err)
		}
	}
	isolation = append(isolation, fmt.Sprintf("cpu %d s, address space %d MiB", s.cfg.CPUSeconds, s.cfg.MemoryBytes>>20))
	werr := cmd.Wait()
	res := ShellResult{Argv: in.Argv, ExitCode: cmd.ProcessState.ExitCode(), DurationMs: time.Since(start).Milliseconds(), Isolation: isolation}
	if res.Stdout, err = s.stream(ctx, "stdout", stdout, put); err != nil {
		return ShellResult{}, err
	}
	if res.Stderr, err = s.stream(ctx, "stderr", stderr, put); err != nil {
		return ShellResult{}, err
	}
	tails := func(e *actionbus.Error) *actionbus.Error {
		return e.WithDetail("exitCode", res.ExitCode).WithDetail("stdoutTail", tail(stdout.buf.Bytes(), 2048)).
			WithDetail("stderrTail", tail(stderr.buf.Bytes(), 2048))
	}
	switch {
	case ctx.Err() != nil:
		return res, tails(actionbus.Errorf(actionbus.CodeTimeout, "%s: killed with its process group after %s", in.Argv[0], s.cfg.Timeout))
	case werr != nil && res.ExitCode != 0:
		return res, tails(actionbus.Errorf(actionbus.CodeShellExit, "%s exited with code %d", in.Argv[0], res.ExitCode))
	case werr != nil:
		return res, tails(actionbus.Errorf(actionbus.CodeShellExit, "%s: %v", in.Argv[0], werr))
	}
	return res, nil
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
	env := []string{"PATH=" + shellPath, "HOME=" + s.root, "LANG=C.UTF-8", "TERM=dumb"}
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
