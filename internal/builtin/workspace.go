package builtin

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"sort"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/bluekeyes/go-gitdiff/gitdiff"
	"github.com/bmatcuk/doublestar/v4"

	"github.com/actionbus/actionbus"
)

// Workspace is a directory the workspace file actions work in. Nothing
// escapes it: every file operation goes through an os.Root, which refuses
// absolute paths, ".." above the root and symlinks that lead out.
type Workspace struct {
	root *os.Root
	// MaxReadBytes bounds read_file; default 200 000.
	MaxReadBytes int

	mu    sync.Mutex
	reads map[string]map[string]string // run id → path → sha256 read
}

// OpenWorkspace opens dir as a workspace.
func OpenWorkspace(dir string) (*Workspace, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("builtin: workspace: %w", err)
	}
	return &Workspace{root: r, MaxReadBytes: 200000, reads: map[string]map[string]string{}}, nil
}

// Close closes the workspace root.
func (w *Workspace) Close() error { return w.root.Close() }

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// clean turns a model-written path into a root-relative one, or refuses it.
func clean(p string) (string, error) {
	p = strings.TrimSpace(p)
	if p == "" {
		return "", actionbus.Errorf(actionbus.CodeActionArgsInvalid, "path is required").WithDetail("key", "path")
	}
	if strings.HasPrefix(p, "/") || strings.HasPrefix(p, `\`) || (len(p) > 1 && p[1] == ':') {
		return "", actionbus.Errorf(actionbus.CodeWorkspacePath, "path %q is absolute; workspace paths are relative to its root", p).WithDetail("path", p)
	}
	c := path.Clean(strings.ReplaceAll(p, `\`, "/"))
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", actionbus.Errorf(actionbus.CodeWorkspacePath, "path %q leaves the workspace", p).WithDetail("path", p)
	}
	return c, nil
}

// rootErr turns an os.Root refusal into workspace_path_refused.
func rootErr(p string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, fs.ErrNotExist) {
		return actionbus.Errorf(actionbus.CodeActionArgsInvalid, "%s does not exist", p).WithDetail("path", p)
	}
	if strings.Contains(err.Error(), "escapes") || strings.Contains(err.Error(), "path escapes from parent") {
		return actionbus.Errorf(actionbus.CodeWorkspacePath, "path %q leaves the workspace (%v)", p, err).WithDetail("path", p)
	}
	return fmt.Errorf("builtin: %s: %w", p, err)
}

func (w *Workspace) noteRead(runID, p, hash string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.reads) > 10000 {
		clear(w.reads) // bounded memory; a write then needs expected_sha256
	}
	if w.reads[runID] == nil {
		w.reads[runID] = map[string]string{}
	}
	w.reads[runID][p] = hash
}

func (w *Workspace) readHash(runID, p string) (string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	h, ok := w.reads[runID][p]
	return h, ok
}

// ReadFileArgs is the input of read_file.
type ReadFileArgs struct {
	Path string `json:"path"`
}

// FileContent is the output of read_file.
type FileContent struct {
	Path      string `json:"path"`
	Content   string `json:"content"`
	SHA256    string `json:"sha256"`
	Bytes     int    `json:"bytes"`
	Truncated bool   `json:"truncated"`
}

// ReadFile reads a text file and remembers, for the run, the hash read.
func (w *Workspace) ReadFile(runID string, in ReadFileArgs) (FileContent, error) {
	p, err := clean(in.Path)
	if err != nil {
		return FileContent{}, err
	}
	b, err := w.root.ReadFile(p)
	if err != nil {
		return FileContent{}, rootErr(p, err)
	}
	out := FileContent{Path: p, SHA256: sum(b), Bytes: len(b)}
	if !utf8.Valid(b) {
		return FileContent{}, actionbus.Errorf(actionbus.CodeActionArgsInvalid, "%s is not a text file", p).WithDetail("path", p)
	}
	content := b
	if len(content) > w.MaxReadBytes {
		content, out.Truncated = content[:w.MaxReadBytes], true
	}
	out.Content = strings.ToValidUTF8(string(content), "")
	w.noteRead(runID, p, out.SHA256)
	return out, nil
}

// GlobArgs is the input of glob_files.
type GlobArgs struct {
	Pattern string `json:"pattern" jsonschema:"description=A glob with ** for any depth, e.g. **/*.go"`
}

// GlobResult is the output of glob_files.
type GlobResult struct {
	Paths     []string `json:"paths"`
	Truncated bool     `json:"truncated"`
}

const maxGlob = 1000

// GlobFiles lists files matching a pattern (doublestar syntax).
func (w *Workspace) GlobFiles(in GlobArgs) (GlobResult, error) {
	if _, err := clean(in.Pattern); err != nil {
		return GlobResult{}, err
	}
	if !doublestar.ValidatePattern(in.Pattern) {
		return GlobResult{}, actionbus.Errorf(actionbus.CodeActionArgsInvalid, "pattern %q is not a valid glob", in.Pattern).WithDetail("key", "pattern")
	}
	matches, err := doublestar.Glob(w.root.FS(), in.Pattern, doublestar.WithFilesOnly(), doublestar.WithNoFollow())
	if err != nil {
		return GlobResult{}, fmt.Errorf("builtin: glob: %w", err)
	}
	sort.Strings(matches)
	out := GlobResult{Paths: matches}
	if len(matches) > maxGlob {
		out.Paths, out.Truncated = matches[:maxGlob], true
	}
	if out.Paths == nil {
		out.Paths = []string{}
	}
	return out, nil
}

// GrepArgs is the input of grep_files.
type GrepArgs struct {
	Pattern    string `json:"pattern" jsonschema:"description=An RE2 regular expression."`
	Glob       string `json:"glob,omitempty" jsonschema:"description=Only files matching this glob; default **/*"`
	MaxMatches int    `json:"maxMatches,omitempty" jsonschema:"minimum=1,maximum=1000"`
}

// GrepMatch is one matching line.
type GrepMatch struct {
	Path string `json:"path"`
	Line int    `json:"line"`
	Text string `json:"text"`
}

// GrepResult is the output of grep_files.
type GrepResult struct {
	Matches   []GrepMatch `json:"matches"`
	Truncated bool        `json:"truncated"`
}

// GrepFiles searches text files for a regular expression.
func (w *Workspace) GrepFiles(in GrepArgs) (GrepResult, error) {
	re, err := regexp.Compile(in.Pattern)
	if err != nil {
		return GrepResult{}, actionbus.Errorf(actionbus.CodeActionArgsInvalid, "pattern is not a valid regular expression: %v", err).WithDetail("key", "pattern")
	}
	glob := in.Glob
	if glob == "" {
		glob = "**/*"
	}
	files, err := w.GlobFiles(GlobArgs{Pattern: glob})
	if err != nil {
		return GrepResult{}, err
	}
	limit := in.MaxMatches
	if limit <= 0 {
		limit = 200
	}
	out := GrepResult{Matches: []GrepMatch{}}
	for _, p := range files.Paths {
		b, err := w.root.ReadFile(p)
		if err != nil || !utf8.Valid(b) || bytes.IndexByte(b, 0) >= 0 {
			continue // unreadable or binary
		}
		for i, line := range strings.Split(string(b), "\n") {
			if re.MatchString(line) {
				if len(out.Matches) == limit {
					out.Truncated = true
					return out, nil
				}
				out.Matches = append(out.Matches, GrepMatch{Path: p, Line: i + 1, Text: strings.TrimRight(line, "\r")})
			}
		}
	}
	return out, nil
}

// EditArgs is the input of edit_file.
type EditArgs struct {
	Path           string `json:"path"`
	OldString      string `json:"old_string"`
	NewString      string `json:"new_string"`
	ReplaceAll     bool   `json:"replace_all,omitempty"`
	ExpectedSHA256 string `json:"expected_sha256,omitempty" jsonschema:"description=The file's SHA-256 as last read; the edit is refused if it changed since."`
}

// WriteResult is the output of the mutating workspace actions.
type WriteResult struct {
	Path         string `json:"path"`
	SHA256       string `json:"sha256"`
	Bytes        int    `json:"bytes"`
	Replacements int    `json:"replacements,omitempty"`
	Created      bool   `json:"created,omitempty"`
}

// guard refuses a change to an existing file whose current hash is not
// the one the caller expects: expected_sha256 when given, else the hash
// this run last read.
func (w *Workspace) guard(runID, p, current, expected string) error {
	if expected == "" {
		h, ok := w.readHash(runID, p)
		if !ok {
			return actionbus.Errorf(actionbus.CodeStaleFile, "%s was not read in this run; read it first or pass expected_sha256", p).WithDetail("path", p)
		}
		expected = h
	}
	if !strings.EqualFold(expected, current) {
		return actionbus.Errorf(actionbus.CodeStaleFile, "%s changed since it was read (sha256 %s, expected %s); read it again", p, current, expected).
			WithDetail("path", p).WithDetail("sha256", current)
	}
	return nil
}

// EditFile replaces an exact string in a file.
func (w *Workspace) EditFile(runID string, in EditArgs) (WriteResult, error) {
	p, err := clean(in.Path)
	if err != nil {
		return WriteResult{}, err
	}
	b, err := w.root.ReadFile(p)
	if err != nil {
		return WriteResult{}, rootErr(p, err)
	}
	if err := w.guard(runID, p, sum(b), in.ExpectedSHA256); err != nil {
		return WriteResult{}, err
	}
	if in.OldString == "" {
		return WriteResult{}, actionbus.Errorf(actionbus.CodeActionArgsInvalid, "old_string is required").WithDetail("key", "old_string")
	}
	n := strings.Count(string(b), in.OldString)
	switch {
	case n == 0:
		return WriteResult{}, actionbus.Errorf(actionbus.CodeActionArgsInvalid, "old_string does not occur in %s", p).WithDetail("path", p)
	case n > 1 && !in.ReplaceAll:
		return WriteResult{}, actionbus.Errorf(actionbus.CodeActionArgsInvalid, "old_string occurs %d times in %s; make it unique or set replace_all", n, p).WithDetail("path", p)
	}
	if !in.ReplaceAll {
		n = 1
	}
	updated := strings.Replace(string(b), in.OldString, in.NewString, n)
	return w.write(runID, p, []byte(updated), n, false)
}

func (w *Workspace) write(runID, p string, data []byte, replacements int, created bool) (WriteResult, error) {
	if dir := path.Dir(p); dir != "." {
		if err := w.root.MkdirAll(dir, 0o755); err != nil {
			return WriteResult{}, rootErr(p, err)
		}
	}
	if err := w.root.WriteFile(p, data, 0o644); err != nil {
		return WriteResult{}, rootErr(p, err)
	}
	h := sum(data)
	w.noteRead(runID, p, h) // the run knows what it wrote
	return WriteResult{Path: p, SHA256: h, Bytes: len(data), Replacements: replacements, Created: created}, nil
}

// WriteArgs is the input of write_file.
type WriteArgs struct {
	Path           string `json:"path"`
	Content        string `json:"content"`
	ExpectedSHA256 string `json:"expected_sha256,omitempty"`
}

// WriteFile writes a whole file. A new file is created; an existing one
// is only overwritten after a read in the run or with its expected hash.
func (w *Workspace) WriteFile(runID string, in WriteArgs) (WriteResult, error) {
	p, err := clean(in.Path)
	if err != nil {
		return WriteResult{}, err
	}
	b, err := w.root.ReadFile(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return w.write(runID, p, []byte(in.Content), 0, true)
	case err != nil:
		return WriteResult{}, rootErr(p, err)
	}
	if err := w.guard(runID, p, sum(b), in.ExpectedSHA256); err != nil {
		return WriteResult{}, err
	}
	return w.write(runID, p, []byte(in.Content), 0, false)
}

// PatchArgs is the input of apply_patch.
type PatchArgs struct {
	Patch string `json:"patch" jsonschema:"description=A unified diff (git or diff -u format)."`
	// ExpectedFiles maps paths to the SHA-256 they must have before the
	// patch applies.
	ExpectedFiles map[string]string `json:"expected_files,omitempty"`
}

// PatchResult is the output of apply_patch.
type PatchResult struct {
	Files []WriteResult `json:"files"`
}

// ApplyPatch applies a unified diff: every hunk must apply exactly and
// every expected hash must match, or nothing is written.
func (w *Workspace) ApplyPatch(runID string, in PatchArgs) (PatchResult, error) {
	files, _, err := gitdiff.Parse(strings.NewReader(in.Patch))
	if err != nil {
		return PatchResult{}, actionbus.Errorf(actionbus.CodePatchRejected, "the patch does not parse: %v", err)
	}
	if len(files) == 0 {
		return PatchResult{}, actionbus.Errorf(actionbus.CodePatchRejected, "the patch changes no file")
	}
	for name, want := range in.ExpectedFiles {
		p, err := clean(name)
		if err != nil {
			return PatchResult{}, err
		}
		b, err := w.root.ReadFile(p)
		if err != nil {
			return PatchResult{}, rootErr(p, err)
		}
		if got := sum(b); !strings.EqualFold(got, want) {
			return PatchResult{}, actionbus.Errorf(actionbus.CodePatchRejected, "%s has sha256 %s, the patch expects %s; nothing was written", p, got, want).
				WithDetail("path", p)
		}
	}
	type change struct {
		path    string
		data    []byte
		created bool
		deleted bool
	}
	var changes []change
	for _, f := range files {
		if f.IsBinary || f.IsCopy {
			return PatchResult{}, actionbus.Errorf(actionbus.CodePatchRejected, "binary and copy patches are not supported")
		}
		name := stripPrefix(f.NewName)
		if f.IsDelete {
			name = stripPrefix(f.OldName)
		}
		if f.IsRename {
			return PatchResult{}, actionbus.Errorf(actionbus.CodePatchRejected, "renames are not supported; delete and create instead")
		}
		p, err := clean(name)
		if err != nil {
			return PatchResult{}, err
		}
		var src []byte
		if !f.IsNew {
			if src, err = w.root.ReadFile(p); err != nil {
				return PatchResult{}, rootErr(p, err)
			}
		}
		var dst bytes.Buffer
		if err := gitdiff.Apply(&dst, bytes.NewReader(src), f); err != nil {
			return PatchResult{}, actionbus.Errorf(actionbus.CodePatchRejected, "%s: the patch does not apply: %v; nothing was written", p, err).WithDetail("path", p)
		}
		changes = append(changes, change{path: p, data: dst.Bytes(), created: f.IsNew, deleted: f.IsDelete})
	}
	var out PatchResult
	for _, c := range changes {
		if c.deleted {
			if err := w.root.Remove(c.path); err != nil {
				return out, rootErr(c.path, err)
			}
			out.Files = append(out.Files, WriteResult{Path: c.path})
			continue
		}
		res, err := w.write(runID, c.path, c.data, 0, c.created)
		if err != nil {
			return out, err
		}
		out.Files = append(out.Files, res)
	}
	return out, nil
}

// stripPrefix drops the a/ and b/ prefixes of git diffs.
func stripPrefix(name string) string {
	if strings.HasPrefix(name, "a/") || strings.HasPrefix(name, "b/") {
		return name[2:]
	}
	return name
}

// Root returns the workspace directory.
func (w *Workspace) Root() string { return w.root.Name() }
