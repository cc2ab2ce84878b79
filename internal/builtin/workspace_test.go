package builtin_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/builtin"
)

func hashOf(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

func newWorkspace(t *testing.T) (*builtin.Workspace, string) {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "ws")
	require.NoError(t, os.MkdirAll(filepath.Join(root, "src", "pkg"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "src", "main.go"), []byte("package main\n\nfunc main() {\n\tprintln(\"hi\")\n}\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "src", "pkg", "util.go"), []byte("package pkg\n\n// TODO: tidy\nfunc A() {}\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "README.md"), []byte("# ws\nTODO: docs\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "secret.txt"), []byte("outside"), 0o644))
	require.NoError(t, os.Symlink(filepath.Join(dir, "secret.txt"), filepath.Join(root, "link-out")))
	require.NoError(t, os.Symlink(dir, filepath.Join(root, "dir-out")))
	ws, err := builtin.OpenWorkspace(root)
	require.NoError(t, err)
	t.Cleanup(func() { ws.Close() })
	return ws, root
}

func TestWorkspaceNothingEscapesTheRoot(t *testing.T) {
	ws, _ := newWorkspace(t)
	for _, p := range []string{"../secret.txt", "src/../../secret.txt", "/etc/passwd", "link-out", "dir-out/secret.txt", `..\secret.txt`, "C:/Windows/win.ini"} {
		t.Run(p, func(t *testing.T) {
			_, err := ws.ReadFile("r1", builtin.ReadFileArgs{Path: p})
			assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeWorkspacePath}, "read %s: %v", p, err)
			_, err = ws.WriteFile("r1", builtin.WriteArgs{Path: p, Content: "x"})
			assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeWorkspacePath}, "write %s: %v", p, err)
		})
	}
	b, err := os.ReadFile(filepath.Join(filepath.Dir(ws.Root()), "secret.txt"))
	require.NoError(t, err)
	assert.Equal(t, "outside", string(b), "nothing outside was written")
	g, err := ws.GlobFiles(builtin.GlobArgs{Pattern: "**/*"})
	require.NoError(t, err)
	assert.NotContains(t, g.Paths, "dir-out/secret.txt", "glob does not follow symlinks out")
}

func TestWorkspaceReadGlobGrep(t *testing.T) {
	ws, _ := newWorkspace(t)
	f, err := ws.ReadFile("r1", builtin.ReadFileArgs{Path: "./src/main.go"})
	require.NoError(t, err)
	assert.Equal(t, "src/main.go", f.Path)
	assert.Equal(t, hashOf(f.Content), f.SHA256)
	g, err := ws.GlobFiles(builtin.GlobArgs{Pattern: "**/*.go"})
	require.NoError(t, err)
	assert.Equal(t, []string{"src/main.go", "src/pkg/util.go"}, g.Paths)
	m, err := ws.GrepFiles(builtin.GrepArgs{Pattern: `TODO`})
	require.NoError(t, err)
	assert.Equal(t, []builtin.GrepMatch{{Path: "README.md", Line: 2, Text: "TODO: docs"}, {Path: "src/pkg/util.go", Line: 3, Text: "// TODO: tidy"}}, m.Matches)
	m, err = ws.GrepFiles(builtin.GrepArgs{Pattern: `TODO`, Glob: "**/*.go"})
	require.NoError(t, err)
	assert.Len(t, m.Matches, 1)
	_, err = ws.GrepFiles(builtin.GrepArgs{Pattern: `(`})
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeActionArgsInvalid})
}

func TestWorkspaceStaleHashGuard(t *testing.T) {
	ws, root := newWorkspace(t)
	// write_file over an existing file needs a read in the run or a hash.
	_, err := ws.WriteFile("r1", builtin.WriteArgs{Path: "README.md", Content: "new"})
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeStaleFile})
	assert.ErrorContains(t, err, "was not read in this run")
	f, err := ws.ReadFile("r1", builtin.ReadFileArgs{Path: "README.md"})
	require.NoError(t, err)
	// Someone else changes the file after the read.
	require.NoError(t, os.WriteFile(filepath.Join(root, "README.md"), []byte("# changed\n"), 0o644))
	_, err = ws.WriteFile("r1", builtin.WriteArgs{Path: "README.md", Content: "new"})
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeStaleFile}, "the read is stale")
	_, err = ws.EditFile("r2", builtin.EditArgs{Path: "README.md", OldString: "changed", NewString: "x", ExpectedSHA256: f.SHA256})
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeStaleFile}, "an old expected_sha256 is refused")
	// With the current hash, the edit applies.
	res, err := ws.EditFile("r2", builtin.EditArgs{Path: "README.md", OldString: "changed", NewString: "edited", ExpectedSHA256: hashOf("# changed\n")})
	require.NoError(t, err)
	assert.Equal(t, 1, res.Replacements)
	assert.Equal(t, hashOf("# edited\n"), res.SHA256)
	// A new file needs no guard.
	res, err = ws.WriteFile("r3", builtin.WriteArgs{Path: "docs/new.md", Content: "hello"})
	require.NoError(t, err)
	assert.True(t, res.Created)
	_, err = ws.EditFile("r3", builtin.EditArgs{Path: "src/pkg/util.go", OldString: "func", NewString: "fn", ExpectedSHA256: hashOf("package pkg\n\n// TODO: tidy\nfunc A() {}\n")})
	require.NoError(t, err)
	_, err = ws.EditFile("r3", builtin.EditArgs{Path: "src/main.go", OldString: "nope", NewString: "x"})
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeStaleFile})
}

func TestWorkspaceApplyPatch(t *testing.T) {
	ws, root := newWorkspace(t)
	patch := `diff --git a/src/main.go b/src/main.go
--- a/src/main.go
+++ b/src/main.go
@@ -1,5 +1,5 @@
 package main
 
 func main() {
-	println("hi")
+	println("hello")
 }
diff --git a/NOTES.md b/NOTES.md
new file mode 100644
--- /dev/null
+++ b/NOTES.md
@@ -0,0 +1 @@
+notes
`
	main := "package main\n\nfunc main() {\n\tprintln(\"hi\")\n}\n"
	_, err := ws.ApplyPatch("r1", builtin.PatchArgs{Patch: patch, ExpectedFiles: map[string]string{"src/main.go": hashOf("something else")}})
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodePatchRejected}, "an expected file hash that differs refuses the patch")
	res, err := ws.ApplyPatch("r1", builtin.PatchArgs{Patch: patch, ExpectedFiles: map[string]string{"src/main.go": hashOf(main)}})
	require.NoError(t, err)
	require.Len(t, res.Files, 2)
	b, _ := os.ReadFile(filepath.Join(root, "src", "main.go"))
	assert.Equal(t, "package main\n\nfunc main() {\n\tprintln(\"hello\")\n}\n", string(b))
	b, _ = os.ReadFile(filepath.Join(root, "NOTES.md"))
	assert.Equal(t, "notes\n", string(b))
	assert.True(t, res.Files[1].Created)

	// The same patch again does not apply (its context is gone): nothing
	// is written, not even the file whose hunk would still fit.
	before, _ := os.ReadFile(filepath.Join(root, "src", "main.go"))
	_, err = ws.ApplyPatch("r1", builtin.PatchArgs{Patch: patch})
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodePatchRejected})
	after, _ := os.ReadFile(filepath.Join(root, "src", "main.go"))
	assert.Equal(t, before, after)

	_, err = ws.ApplyPatch("r1", builtin.PatchArgs{Patch: "--- a/../secret.txt\n+++ b/../secret.txt\n@@ -1 +1 @@\n-outside\n+pwned\n"})
	assert.Error(t, err)
	b, _ = os.ReadFile(filepath.Join(filepath.Dir(root), "secret.txt"))
	assert.Equal(t, "outside", string(b))
	_, err = ws.ApplyPatch("r1", builtin.PatchArgs{Patch: "not a diff"})
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodePatchRejected})
}
