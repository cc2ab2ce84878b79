// Package shelltest holds what tests of the shell's sandbox share: a
// workspace the sandbox can read, and a look at the host's processes for
// survivors of a call.
package shelltest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Workspace is a workspace a root executor's sandbox can read: the sandbox
// runs as host uid nobody, and t.TempDir's own parent is private to its
// owner.
func Workspace(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Sleeping lists the host pids of running (not zombie) `sleep ARG`
// processes.
func Sleeping(arg string) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		argv := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
		if err != nil || len(argv) != 2 || filepath.Base(argv[0]) != "sleep" || argv[1] != arg {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) > 0 && fields[0] != "Z" && fields[0] != "X" {
			out = append(out, pid)
		}
	}
	return out
}
