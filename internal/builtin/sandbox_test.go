package builtin

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// pairs returns the values following each occurrence of flag in a.
func pairs(a []string, flag string, n int) [][]string {
	var out [][]string
	for i := 0; i < len(a); i++ {
		if a[i] == "--" {
			break
		}
		if a[i] == flag && i+n < len(a) {
			out = append(out, a[i+1:i+1+n])
		}
	}
	return out
}

func TestBwrapArgs(t *testing.T) {
	base := sandboxSpec{Workspace: "/tmp/ws", Cwd: "/tmp/ws/sub", TmpBytes: 1 << 20,
		Env: []string{"PATH=/usr/bin", "A=b=c"}, Argv: []string{"/usr/bin/git", "log", "--output=.git/config"}}
	tests := []struct {
		name  string
		spec  func(s sandboxSpec) sandboxSpec
		check func(t *testing.T, a []string)
	}{
		{"every namespace, no userns inside, dies with its parent, own session, never root", func(s sandboxSpec) sandboxSpec { return s }, func(t *testing.T, a []string) {
			for _, f := range []string{"--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session", "--clearenv"} {
				assert.Contains(t, a[:slices.Index(a, "--")], f)
			}
			assert.NotContains(t, a, "--share-net")
			assert.NotContains(t, a, "--as-pid-1", "bwrap's own init is pid 1: the command cannot clear its parent-death signal")
			assert.Equal(t, [][]string{{sandboxUID}}, pairs(a, "--uid", 1))
			assert.Equal(t, [][]string{{sandboxUID}}, pairs(a, "--gid", 1))
		}},
		{"the profile's workspace is read-only, and nothing is bound writable", func(s sandboxSpec) sandboxSpec { return s }, func(t *testing.T, a []string) {
			assert.Empty(t, pairs(a, "--bind", 2))
			assert.Empty(t, pairs(a, "--bind-try", 2))
			assert.Empty(t, pairs(a, "--dev-bind", 2))
			assert.Contains(t, pairs(a, "--ro-bind", 2), []string{"/tmp/ws", "/tmp/ws"})
		}},
		{"an unlisted command's workspace is writable", func(s sandboxSpec) sandboxSpec { s.Writable = true; return s }, func(t *testing.T, a []string) {
			assert.Equal(t, [][]string{{"/tmp/ws", "/tmp/ws"}}, pairs(a, "--bind", 2))
			assert.NotContains(t, pairs(a, "--ro-bind", 2), []string{"/tmp/ws", "/tmp/ws"})
		}},
		{"the workspace is bound after the private /tmp it may lie in", func(s sandboxSpec) sandboxSpec { return s }, func(t *testing.T, a []string) {
			tmp := slices.Index(a, "--tmpfs")
			ws := slices.Index(a, "/tmp/ws")
			assert.Greater(t, ws, tmp)
			assert.Equal(t, "--size", a[tmp-2])
			assert.Equal(t, "1048576", a[tmp-1])
		}},
		{"system directories read-only, nothing else of the host", func(s sandboxSpec) sandboxSpec { return s }, func(t *testing.T, a []string) {
			for _, p := range pairs(a, "--ro-bind-try", 2) {
				assert.Contains(t, systemPaths, p[0])
			}
			assert.NotContains(t, a, "/", "the host's root is not bound")
			assert.NotContains(t, a, "/root")
			assert.NotContains(t, a, "/home")
		}},
		{"host-listed paths read-only, masked files empty", func(s sandboxSpec) sandboxSpec {
			s.ReadOnly, s.Masked = []string{"/root/go/pkg/mod"}, []string{"/etc/shadow"}
			return s
		}, func(t *testing.T, a []string) {
			ro := pairs(a, "--ro-bind", 2)
			assert.Contains(t, ro, []string{"/root/go/pkg/mod", "/root/go/pkg/mod"})
			assert.Contains(t, ro, []string{"/dev/null", "/etc/shadow"})
		}},
		{"network only when the host allows it", func(s sandboxSpec) sandboxSpec { s.Network = true; return s }, func(t *testing.T, a []string) {
			assert.Contains(t, a, "--share-net")
		}},
		{"environment set whole, values kept verbatim", func(s sandboxSpec) sandboxSpec { return s }, func(t *testing.T, a []string) {
			assert.Equal(t, [][]string{{"PATH", "/usr/bin"}, {"A", "b=c"}}, pairs(a, "--setenv", 2))
			assert.Equal(t, [][]string{{"/tmp/ws/sub"}}, pairs(a, "--chdir", 1))
		}},
		{"the command follows --, as given", func(s sandboxSpec) sandboxSpec { return s }, func(t *testing.T, a []string) {
			i := slices.Index(a, "--")
			assert.Equal(t, []string{"/usr/bin/git", "log", "--output=.git/config"}, a[i+1:])
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.check(t, bwrapArgs(tt.spec(base))) })
	}
}

func TestWrapperArgs(t *testing.T) {
	a := wrapperArgs([]string{"/cg/pids/x/cgroup.procs", "/cg/memory/x/cgroup.procs"}, 20, 2<<30, "65534", "/usr/bin/setpriv", "/usr/bin/bwrap", []string{"--unshare-all", "--", "/bin/true", "$(rm -rf /)"})
	assert.Equal(t, []string{"-c", wrapperScript, "actionbus-shell", "/cg/pids/x/cgroup.procs", "/cg/memory/x/cgroup.procs", "--",
		"20", "2097152", "65534", "/usr/bin/setpriv", "/usr/bin/bwrap", "--unshare-all", "--", "/bin/true", "$(rm -rf /)"}, a)
	assert.NotContains(t, wrapperScript, "eval", "the wrapper interprets none of its arguments")
	assert.True(t, strings.HasSuffix(wrapperScript, `exec "$@"`))
}

func TestParseProcCgroup(t *testing.T) {
	tests := []struct {
		in   string
		want map[string]string
	}{
		{"9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n2:cpu,cpuacct:/x\n0::/\n",
			map[string]string{"name=systemd": "/", "pids": "/", "memory": "/process_api/abc", "cpu": "/x", "cpuacct": "/x", "": "/"}},
		{"0::/system.slice/executor.service\n", map[string]string{"": "/system.slice/executor.service"}},
		{"", map[string]string{}},
		{"garbage\n", map[string]string{}},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, parseProcCgroup(tt.in), tt.in)
	}
}

func TestPidsLimitHit(t *testing.T) {
	for in, want := range map[string]bool{"max 0\n": false, "max 3\n": true, "max 0": false, "": false, "max x\n": false, "other 1\nmax 12\n": true} {
		assert.Equal(t, want, pidsLimitHit(in), "%q", in)
	}
}

// Whatever a model puts in argv, it reaches bwrap only after "--", as the
// command's own arguments, and changes none of the sandbox's options.
func FuzzBwrapArgsKeepsArgvAfterTheSeparator(f *testing.F) {
	f.Add("git", "--output=/etc/x", "--bind")
	f.Add("rg", "--pre", "--share-net")
	f.Add("--", "--bind / /", "")
	ref := bwrapArgs(sandboxSpec{Workspace: "/ws", Cwd: "/ws", TmpBytes: 1, Argv: []string{"/bin/true"}})
	f.Fuzz(func(t *testing.T, a, b, c string) {
		argv := []string{"/usr/bin/x", a, b, c}
		got := bwrapArgs(sandboxSpec{Workspace: "/ws", Cwd: "/ws", TmpBytes: 1, Argv: argv})
		i := slices.Index(got, "--")
		if !slices.Equal(got[:i], ref[:len(ref)-2]) || !slices.Equal(got[i+1:], argv) {
			t.Fatalf("argv %q changed the sandbox: %q", argv, got)
		}
	})
}
