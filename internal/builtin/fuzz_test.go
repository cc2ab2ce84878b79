package builtin

import (
	"strings"
	"testing"
)

// FuzzCheckSQL: the statement check never panics, and never accepts a
// statement whose bare text holds a second statement or a write keyword.
func FuzzCheckSQL(f *testing.F) {
	for _, s := range []string{"SELECT 1", "select 'a;b' -- x\n", "/* c */ WITH x AS (SELECT 1) SELECT * FROM x", "SELECT 1; DROP TABLE t", "PRAGMA x", `SELECT "a""b"`, "SELECT [x] FROM t", "'"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, stmt string) {
		if checkSQL(stmt) != nil {
			return
		}
		bare := strings.TrimSuffix(strings.TrimSpace(stripSQL(stmt)), ";")
		if strings.Contains(bare, ";") || sqlWrites.MatchString(bare) {
			t.Fatalf("accepted %q (bare %q)", stmt, bare)
		}
	})
}

// FuzzClean: a cleaned workspace path is never absolute and never leaves
// the root.
func FuzzClean(f *testing.F) {
	for _, s := range []string{"a/b", "../x", "/etc/passwd", "a/../../b", `..\x`, "./.", "C:/x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		c, err := clean(p)
		if err != nil {
			return
		}
		if strings.HasPrefix(c, "/") || c == ".." || strings.HasPrefix(c, "../") {
			t.Fatalf("clean(%q) = %q", p, c)
		}
	})
}
