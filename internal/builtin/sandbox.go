package builtin

import (
	"strconv"
	"strings"
)

// The shell's kernel sandbox: every command runs under Debian's bubblewrap
// (bwrap) in new user, mount, PID, network, IPC, UTS and cgroup
// namespaces, on a filesystem that is read-only but for its scratch space,
// inside a cgroup of its own that bounds its processes and memory. This
// file holds the pure part: what the sandbox is, as argv.

// sandboxUID is the uid and gid a command runs as inside its user
// namespace (nobody): never root in there, so it holds no capability.
const sandboxUID = "65534"

// hostUID is the unprivileged host uid and gid (nobody) a root executor's
// sandbox runs as. A user namespace maps its uids to its creator's: run
// by host root, the sandbox's uid would be host uid 0, whose file
// permissions in /proc (sysctls such as kernel.core_pattern, which the
// kernel runs as root outside every namespace; /proc/sysrq-trigger) no
// namespace takes away. So the sandbox is never created by host root.
const hostUID = "65534"

// systemPaths are the host directories a command sees, read-only; what is
// not listed (home directories, /root, /var, /run, /srv, the executor's
// own files and credentials) does not exist inside the sandbox.
var systemPaths = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"}

// maskedFiles are files of the read-only system paths replaced by an empty
// file inside the sandbox (those that exist on the host).
var maskedFiles = []string{"/etc/shadow", "/etc/gshadow", "/etc/sudoers"}

// sandboxSpec is one command's sandbox.
type sandboxSpec struct {
	// Workspace is the workspace root, bound at the same path.
	Workspace string
	// Writable binds the workspace read-write (the call's scratch
	// space); otherwise it is read-only like everything else.
	Writable bool
	// Cwd is the directory the command starts in (below Workspace).
	Cwd string
	// Network keeps the host's network namespace.
	Network bool
	// ReadOnly are further host paths bound read-only at the same path.
	ReadOnly []string
	// Masked are files shown empty (each must exist on the host).
	Masked []string
	// TmpBytes bounds the sandbox's private /tmp (a tmpfs).
	TmpBytes uint64
	// Env is the command's whole environment, as KEY=VALUE.
	Env []string
	// Argv is the command: an absolute path, then its arguments.
	Argv []string
}

// bwrapArgs is the bwrap argv (after the bwrap binary) that runs spec.
// Order matters: later mounts go on top of earlier ones, so the private
// /tmp comes before the workspace (which may lie below /tmp).
func bwrapArgs(spec sandboxSpec) []string {
	a := []string{
		"--unshare-all", "--unshare-user", "--disable-userns",
		"--die-with-parent", "--new-session",
		"--uid", sandboxUID, "--gid", sandboxUID,
		"--hostname", "sandbox",
	}
	if spec.Network {
		a = append(a, "--share-net")
	}
	for _, p := range systemPaths {
		a = append(a, "--ro-bind-try", p, p)
	}
	for _, p := range spec.Masked {
		a = append(a, "--ro-bind", "/dev/null", p)
	}
	// /dev is bubblewrap's own tmpfs, at the kernel's default size; its
	// world-writable /dev/shm gets the private /tmp's bound.
	a = append(a, "--proc", "/proc", "--dev", "/dev",
		"--size", strconv.FormatUint(spec.TmpBytes, 10), "--tmpfs", "/dev/shm",
		"--size", strconv.FormatUint(spec.TmpBytes, 10), "--tmpfs", "/tmp")
	for _, p := range spec.ReadOnly {
		a = append(a, "--ro-bind", p, p)
	}
	bind := "--ro-bind"
	if spec.Writable {
		bind = "--bind"
	}
	a = append(a, bind, spec.Workspace, spec.Workspace, "--chdir", spec.Cwd, "--clearenv")
	for _, kv := range spec.Env {
		k, v, _ := strings.Cut(kv, "=")
		a = append(a, "--setenv", k, v)
	}
	return append(append(a, "--"), spec.Argv...)
}

// wrapperScript runs as the sandbox's first process on the host, before
// bwrap: it joins the call's cgroups (every process the sandbox starts is
// then counted there from its first fork), sets the per-process limits,
// drops to an unprivileged host uid when it runs as root (setpriv, from
// util-linux), and becomes bwrap. Its arguments: the cgroup.procs files to
// join, "--", the CPU seconds, the address-space KiB, the host uid to
// drop to ("" to stay), setpriv's path, then bwrap's argv. Nothing of the
// command is ever interpreted by it. Exit 125: the sandbox could not be
// set up.
const wrapperScript = `while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift
ulimit -t "$1" || exit 125
ulimit -v "$2" || exit 125
u=$3 setpriv=$4
shift 4
[ -z "$u" ] || exec "$setpriv" --reuid="$u" --regid="$u" --clear-groups --inh-caps=-all --bounding-set=-all -- "$@"
exec "$@"`

// wrapperExit is the wrapper's exit code when the sandbox could not be
// set up.
const wrapperExit = 125

// wrapperArgs is the argv (after /bin/sh) that joins procs, sets the
// limits, drops to host uid dropTo through setpriv (when dropTo is not
// "") and execs bwrap with bwrapArgv.
func wrapperArgs(procs []string, cpuSeconds, memoryBytes uint64, dropTo, setpriv, bwrap string, bwrapArgv []string) []string {
	a := append([]string{"-c", wrapperScript, "actionbus-shell"}, procs...)
	a = append(a, "--", strconv.FormatUint(cpuSeconds, 10), strconv.FormatUint(memoryBytes>>10, 10), dropTo, setpriv, bwrap)
	return append(a, bwrapArgv...)
}

// parseProcCgroup reads /proc/<pid>/cgroup: the cgroup path per v1
// controller, and the v2 path under the key "".
func parseProcCgroup(data string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(data, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out
}

// pidsLimitHit reports whether a pids.events file counts a refused fork.
func pidsLimitHit(events string) bool {
	for _, line := range strings.Split(events, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok && k == "max" {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return err == nil && n > 0
		}
	}
	return false
}
