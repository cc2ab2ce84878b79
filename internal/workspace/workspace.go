// Package workspace is a run's virtual workspace (seed 000): markdown
// documents held in run state, with versions and text statistics, and the
// two-step patch contract for repairing them — workspace_propose_patch
// previews structured operations (never a diff, never content the runtime
// made up) and flags what could go wrong; workspace_apply_patch applies only
// the latest valid pending patch, on the version it was previewed on.
//
// Everything here is pure: the run machine stores the Workspace with the
// run's state and turns these results into observations.
package workspace

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
)

// Bounds of a workspace. It lives in run state; a document over
// InlineBytes is kept there by artifact reference (Ref), its content in
// the artifact store.
const (
	MaxFiles     = 32
	MaxFileBytes = 1 << 20
	MaxTotal     = 4 << 20
	InlineBytes  = 4 << 10
	maxOps       = 64 // the operation log keeps the last ones
	maxPatchOps  = 32
)

// Risk flags of a preview. Every one blocks the patch: the planner must
// revise it, or grow the document with workspace_append /
// workspace_insert_after_section instead.
const (
	FlagNotFound             = "not_found"
	FlagAmbiguous            = "ambiguous"
	FlagNoGrowth             = "no_growth"
	FlagStructureMaybeWorse  = "structure_maybe_worse"
	FlagWholeDocumentReplace = "whole_document_replace"
)

// Patch statuses.
const (
	StatusReady   = "ready"
	StatusBlocked = "blocked"
)

// Workspace is a run's virtual workspace.
type Workspace struct {
	// Version counts the workspace's changes.
	Version int              `json:"version"`
	Files   map[string]*File `json:"files"`
	// Pending is the latest proposed patch, ready or blocked.
	Pending *Patch `json:"pendingPatch,omitempty"`
	// Operations log the changes, the last ones.
	Operations []Operation `json:"operations,omitempty"`
}

// File is one document. Content is empty in stored state when Ref holds
// it (a document over InlineBytes): the run machine loads it before a
// workspace action and stores it again after.
type File struct {
	Content string              `json:"content,omitempty"`
	Ref     *events.ArtifactRef `json:"ref,omitempty"`
	Version int                 `json:"version"`
	Stats   Stats               `json:"stats"`
}

// Stats are a document's text statistics.
type Stats struct {
	Bytes    int `json:"bytes"`
	Words    int `json:"words"`
	Lines    int `json:"lines"`
	Headings int `json:"headings"`
	// DuplicateHeadings counts headings whose text another heading has.
	DuplicateHeadings int `json:"duplicateHeadings"`
}

// Operation is one entry of the change log.
type Operation struct {
	Action  string `json:"action"`
	Path    string `json:"path"`
	Version int    `json:"version"`
	PatchID string `json:"patchId,omitempty"`
}

// Op is one Patch v1 operation:
//
//	replace              {find, replace, replace_all?}
//	append               {content, separator?}
//	insert_after_section {heading, content, separator?}
//	normalize_headings   {headings: [{lineNumber, text}]}
type Op struct {
	Type       string       `json:"type"`
	Find       string       `json:"find,omitempty"`
	Replace    *string      `json:"replace,omitempty"`
	ReplaceAll bool         `json:"replace_all,omitempty"`
	Content    *string      `json:"content,omitempty"`
	Separator  *string      `json:"separator,omitempty"`
	Heading    string       `json:"heading,omitempty"`
	Headings   []HeadingFix `json:"headings,omitempty"`
}

// HeadingFix replaces the heading at LineNumber (1-based) with Text.
type HeadingFix struct {
	LineNumber int    `json:"lineNumber"`
	Text       string `json:"text"`
}

// Patch is a proposed patch, kept until applied or replaced.
type Patch struct {
	ID          string   `json:"patchId"`
	Path        string   `json:"path"`
	BaseVersion int      `json:"baseVersion"`
	Ops         []Op     `json:"operations"`
	Status      string   `json:"status"`
	RiskFlags   []string `json:"riskFlags,omitempty"`
	// PreviewHash is the SHA-256 of the base content and the preview: an
	// apply recomputes it.
	PreviewHash string `json:"previewHash"`
}

// Proposal is what workspace_propose_patch returns: never the preview's
// text, only what it would do.
type Proposal struct {
	PatchID         string    `json:"patchId"`
	Path            string    `json:"path"`
	BaseVersion     int       `json:"baseVersion"`
	BeforeWords     int       `json:"beforeWords"`
	AfterWords      int       `json:"afterWords"`
	DeltaWords      int       `json:"deltaWords"`
	Changed         bool      `json:"changed"`
	Status          string    `json:"status"`
	RiskFlags       []string  `json:"riskFlags"`
	PreviewSummary  string    `json:"previewSummary"`
	StructureBefore Structure `json:"structureBefore"`
	StructureAfter  Structure `json:"structureAfter"`
	Suggestion      string    `json:"suggestion,omitempty"`
}

// Structure is a compact summary of a document's headings.
type Structure struct {
	Headings int `json:"headings"`
	// Duplicates are heading texts found more than once (at most 5).
	Duplicates []string `json:"duplicates,omitempty"`
	// Outline is the first headings, as written (at most 12).
	Outline []string `json:"outline,omitempty"`
}

func refused(reason, format string, a ...any) *actionbus.Error {
	return actionbus.Errorf(actionbus.CodePatchRejected, format, a...).WithDetail("reason", reason)
}

// New returns a workspace holding files (path → content).
func New(files map[string]string) (*Workspace, *actionbus.Error) {
	w := &Workspace{Files: map[string]*File{}}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, p := range paths {
		if err := w.put(p, files[p], "create", ""); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// CheckPath refuses a path that is not a plain relative name.
func CheckPath(p string) *actionbus.Error {
	if p == "" || len(p) > 128 || strings.HasPrefix(p, "/") || strings.Contains(p, "..") || strings.ContainsAny(p, "\\\x00") {
		return actionbus.Errorf(actionbus.CodeWorkspacePath, "workspace paths are relative names without '..' (at most 128 bytes)").WithDetail("path", clip(p))
	}
	return nil
}

// File returns the file at p, or a typed error naming the files there are.
func (w *Workspace) File(p string) (*File, *actionbus.Error) {
	if f, ok := w.Files[p]; ok {
		return f, nil
	}
	return nil, actionbus.Errorf(actionbus.CodeWorkspacePath, "no workspace file %q (files: %s)", clip(p), strings.Join(w.Paths(), ", ")).WithDetail("path", clip(p))
}

// Paths lists the files, sorted.
func (w *Workspace) Paths() []string {
	out := make([]string, 0, len(w.Files))
	for p := range w.Files {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// put writes content to p (creating it), checking the bounds, and logs
// the change.
func (w *Workspace) put(p, content, action, patchID string) *actionbus.Error {
	if err := CheckPath(p); err != nil {
		return err
	}
	f, exists := w.Files[p]
	if !exists && len(w.Files) >= MaxFiles {
		return actionbus.Errorf(actionbus.CodeWorkspacePath, "a workspace holds at most %d files", MaxFiles)
	}
	if len(content) > MaxFileBytes {
		return refused("too_large", "%s would be %d bytes; a workspace file holds at most %d", p, len(content), MaxFileBytes).WithDetail("path", p)
	}
	total := len(content)
	for q, g := range w.Files {
		if q != p {
			total += len(g.Content)
		}
	}
	if total > MaxTotal {
		return refused("too_large", "the workspace would hold %d bytes; at most %d", total, MaxTotal)
	}
	if !exists {
		f = &File{}
		w.Files[p] = f
	}
	f.Content, f.Stats = content, StatsOf(content)
	f.Version++
	w.Version++
	w.Operations = append(w.Operations, Operation{Action: action, Path: p, Version: f.Version, PatchID: patchID})
	if len(w.Operations) > maxOps {
		w.Operations = w.Operations[len(w.Operations)-maxOps:]
	}
	return nil
}

// Append adds content to p (creating it) after separator (default a
// blank line).
func (w *Workspace) Append(p, content string, separator *string) (*File, *actionbus.Error) {
	cur := ""
	if f, ok := w.Files[p]; ok {
		cur = f.Content
	}
	if strings.TrimSpace(content) == "" {
		return nil, refused(FlagNoGrowth, "workspace_append needs content")
	}
	if err := w.put(p, appendText(cur, content, separator), "append", ""); err != nil {
		return nil, err
	}
	return w.Files[p], nil
}

// InsertAfterSection adds content at the end of the section of heading in p.
func (w *Workspace) InsertAfterSection(p, heading, content string, separator *string) (*File, *actionbus.Error) {
	f, err := w.File(p)
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(content) == "" {
		return nil, refused(FlagNoGrowth, "workspace_insert_after_section needs content")
	}
	after, flag := insertAfter(f.Content, heading, content, separator)
	if flag != "" {
		return nil, refused(flag, "heading %q: %s in %s", clip(heading), strings.ReplaceAll(flag, "_", " "), p).WithDetail("heading", clip(heading))
	}
	if err := w.put(p, after, "insert_after_section", ""); err != nil {
		return nil, err
	}
	return w.Files[p], nil
}

// ParseOps reads Patch v1 operations with exactly their shapes: an
// unknown type or key, a missing field or a wrong type is an error. The
// one tolerated misuse is {type: replace, content: <whole document>},
// which previews as blocked (whole_document_replace).
func ParseOps(raw any) ([]Op, *actionbus.Error) {
	list, ok := raw.([]any)
	if !ok || len(list) == 0 || len(list) > maxPatchOps {
		return nil, actionbus.Errorf(actionbus.CodeActionArgsInvalid, "operations must be a list of 1–%d Patch v1 operations", maxPatchOps).WithDetail("key", "operations")
	}
	allowed := map[string][]string{
		"replace":              {"type", "find", "replace", "replace_all"},
		"append":               {"type", "content", "separator"},
		"insert_after_section": {"type", "heading", "content", "separator"},
		"normalize_headings":   {"type", "headings"},
	}
	out := make([]Op, 0, len(list))
	for i, item := range list {
		bad := func(format string, a ...any) *actionbus.Error {
			return actionbus.Errorf(actionbus.CodeActionArgsInvalid, "operations[%d]: "+format, append([]any{i}, a...)...).WithDetail("key", fmt.Sprintf("operations/%d", i))
		}
		m, ok := item.(map[string]any)
		if !ok {
			return nil, bad("an operation is an object")
		}
		typ, _ := m["type"].(string)
		keys, known := allowed[typ]
		if !known {
			return nil, bad("type %q is not a Patch v1 operation (replace, append, insert_after_section, normalize_headings)", clip(typ))
		}
		if typ == "replace" && m["find"] == nil && m["content"] != nil {
			out = append(out, Op{Type: "replace"}) // the whole-document shape: previews blocked
			continue
		}
		for k := range m {
			if !slices.Contains(keys, k) {
				return nil, bad("%s takes %s, not %q", typ, strings.Join(keys[1:], ", "), clip(k))
			}
		}
		b, _ := json.Marshal(m)
		dec := json.NewDecoder(bytes.NewReader(b))
		var op Op
		if err := dec.Decode(&op); err != nil {
			return nil, bad("%v", err)
		}
		switch typ {
		case "replace":
			if op.Find == "" || op.Replace == nil {
				return nil, bad("replace needs find and replace (exact current text and its replacement)")
			}
		case "append":
			if op.Content == nil {
				return nil, bad("append needs content")
			}
		case "insert_after_section":
			if op.Heading == "" || op.Content == nil {
				return nil, bad("insert_after_section needs heading and content")
			}
		case "normalize_headings":
			if len(op.Headings) == 0 {
				return nil, bad("normalize_headings needs headings [{lineNumber, text}]")
			}
		}
		out = append(out, op)
	}
	return out, nil
}

// Preview applies ops to content and reports what is wrong with the result.
func Preview(content string, ops []Op) (after string, flags []string) {
	after = content
	flag := func(f string) {
		if !slices.Contains(flags, f) {
			flags = append(flags, f)
		}
	}
	onlyGrowth := true
	for _, op := range ops {
		switch op.Type {
		case "replace":
			onlyGrowth = false
			if op.Replace == nil {
				flag(FlagWholeDocumentReplace)
				continue
			}
			switch n := strings.Count(after, op.Find); {
			case n == 0:
				flag(FlagNotFound)
			case n > 1 && !op.ReplaceAll:
				flag(FlagAmbiguous)
			case op.ReplaceAll:
				after = strings.ReplaceAll(after, op.Find, *op.Replace)
			default:
				after = strings.Replace(after, op.Find, *op.Replace, 1)
			}
		case "append":
			after = appendText(after, *op.Content, op.Separator)
		case "insert_after_section":
			next, f := insertAfter(after, op.Heading, *op.Content, op.Separator)
			if f != "" {
				flag(f)
				continue
			}
			after = next
		case "normalize_headings":
			onlyGrowth = false
			lines := strings.Split(after, "\n")
			for _, h := range op.Headings {
				if h.LineNumber < 1 || h.LineNumber > len(lines) || !isHeading(lines[h.LineNumber-1]) {
					flag(FlagNotFound)
					continue
				}
				lines[h.LineNumber-1] = h.Text
			}
			after = strings.Join(lines, "\n")
		}
	}
	before, now := StatsOf(content), StatsOf(after)
	if after == content || (onlyGrowth && now.Words <= before.Words) {
		flag(FlagNoGrowth)
	}
	if now.Headings < before.Headings || now.DuplicateHeadings > before.DuplicateHeadings {
		flag(FlagStructureMaybeWorse)
	}
	return after, flags
}

// Propose previews ops on p's current content and makes the result the
// pending patch (ready, or blocked by its risk flags). Nothing of p
// changes.
func (w *Workspace) Propose(p string, ops []Op, patchID string) (Proposal, *actionbus.Error) {
	f, err := w.File(p)
	if err != nil {
		return Proposal{}, err
	}
	after, flags := Preview(f.Content, ops)
	before, now := StatsOf(f.Content), StatsOf(after)
	status := StatusReady
	if len(flags) > 0 {
		status = StatusBlocked
	}
	w.Pending = &Patch{ID: patchID, Path: p, BaseVersion: f.Version, Ops: ops, Status: status, RiskFlags: flags, PreviewHash: previewHash(f.Content, after)}
	prop := Proposal{PatchID: patchID, Path: p, BaseVersion: f.Version, BeforeWords: before.Words, AfterWords: now.Words,
		DeltaWords: now.Words - before.Words, Changed: after != f.Content, Status: status, RiskFlags: append([]string{}, flags...),
		StructureBefore: StructureOf(f.Content), StructureAfter: StructureOf(after)}
	prop.PreviewSummary = fmt.Sprintf("%d operation(s) on %s v%d: %d → %d words (%+d), %d → %d headings",
		len(ops), p, f.Version, before.Words, now.Words, now.Words-before.Words, before.Headings, now.Headings)
	if status == StatusBlocked {
		prop.Suggestion = suggestion(flags)
	}
	return prop, nil
}

// Apply applies the pending patch named patchID, previewed on baseVersion
// (0: the pending patch's own): only the latest pending patch, only when
// its preview was valid, only on the version it was previewed on, and only
// while recomputing the preview gives the stored hash. On success the file
// gets the preview, its version and the workspace's go up by one, one
// operation is logged and the pending patch is cleared.
func (w *Workspace) Apply(patchID string, baseVersion int) (*File, *actionbus.Error) {
	pp := w.Pending
	switch {
	case pp == nil:
		return nil, refused("no_pending_patch", "there is no pending patch; propose one with workspace_propose_patch")
	case patchID != pp.ID:
		return nil, refused("patch_id_mismatch", "patch %q is not the pending patch %q; only the latest proposal can be applied", clip(patchID), pp.ID).WithDetail("pendingPatchId", pp.ID)
	case pp.Status != StatusReady:
		return nil, refused("preview_blocked", "patch %s was previewed as blocked (%s); revise it", pp.ID, strings.Join(pp.RiskFlags, ", ")).WithDetail("riskFlags", pp.RiskFlags)
	}
	f, err := w.File(pp.Path)
	if err != nil {
		return nil, err
	}
	if err := checkBaseVersion(pp, f, baseVersion); err != nil {
		return nil, err
	}
	after, flags := Preview(f.Content, pp.Ops)
	if len(flags) > 0 || previewHash(f.Content, after) != pp.PreviewHash {
		return nil, refused("preview_hash_mismatch", "patch %s no longer previews as it did; propose it again", pp.ID)
	}
	if err := w.put(pp.Path, after, "apply_patch", pp.ID); err != nil {
		return nil, err
	}
	w.Pending = nil
	return w.Files[pp.Path], nil
}

// checkBaseVersion refuses, as stale_base_version, a base version the
// caller names that is not the one the patch was previewed on, and a file
// that changed since the preview. The details name each version for what
// it is: baseVersion is the caller's (absent when not given),
// previewVersion the preview's, currentVersion the file's.
func checkBaseVersion(pp *Patch, f *File, baseVersion int) *actionbus.Error {
	var err *actionbus.Error
	switch {
	case baseVersion != 0 && baseVersion != pp.BaseVersion:
		err = refused("stale_base_version", "base version %d is not the version patch %s was previewed on (%d); %s is at version %d", baseVersion, pp.ID, pp.BaseVersion, pp.Path, f.Version).
			WithDetail("baseVersion", baseVersion)
	case f.Version != pp.BaseVersion:
		err = refused("stale_base_version", "%s is at version %d; patch %s was previewed on version %d", pp.Path, f.Version, pp.ID, pp.BaseVersion)
	default:
		return nil
	}
	return err.WithDetail("previewVersion", pp.BaseVersion).WithDetail("currentVersion", f.Version)
}

// Blocked reports whether the pending patch is blocked.
func (w *Workspace) Blocked() bool {
	return w != nil && w.Pending != nil && w.Pending.Status == StatusBlocked
}

func suggestion(flags []string) string {
	var s []string
	for _, f := range flags {
		switch f {
		case FlagNotFound:
			s = append(s, "copy find or heading exactly from the current text (workspace_read)")
		case FlagAmbiguous:
			s = append(s, "make find unique (more context) or set replace_all")
		case FlagNoGrowth:
			s = append(s, "the preview adds nothing: add content, or use workspace_append / workspace_insert_after_section")
		case FlagStructureMaybeWorse:
			s = append(s, "keep every heading and avoid duplicate headings")
		case FlagWholeDocumentReplace:
			s = append(s, "replace takes find + replace of current text; to add sections use workspace_append or workspace_insert_after_section")
		}
	}
	return strings.Join(s, "; ")
}

func previewHash(base, after string) string {
	h := sha256.New()
	h.Write([]byte(base))
	h.Write([]byte{0})
	h.Write([]byte(after))
	return hex.EncodeToString(h.Sum(nil))
}

func appendText(cur, content string, separator *string) string {
	if cur == "" {
		return content
	}
	sep := "\n\n"
	if separator != nil {
		sep = *separator
	}
	return strings.TrimRight(cur, "\n") + sep + content
}

// insertAfter inserts content at the end of heading's section: up to the
// next heading of the same or a higher level.
func insertAfter(content, heading, add string, separator *string) (string, string) {
	lines := strings.Split(content, "\n")
	want := headingText(heading)
	at := -1
	for i, l := range lines {
		if isHeading(l) && headingText(l) == want {
			if at >= 0 {
				return content, FlagAmbiguous
			}
			at = i
		}
	}
	if at < 0 {
		return content, FlagNotFound
	}
	level := headingLevel(lines[at])
	end := len(lines)
	for i := at + 1; i < len(lines); i++ {
		if isHeading(lines[i]) && headingLevel(lines[i]) <= level {
			end = i
			break
		}
	}
	section := strings.TrimRight(strings.Join(lines[:end], "\n"), "\n")
	rest := strings.Join(lines[end:], "\n")
	sep := "\n\n"
	if separator != nil {
		sep = *separator
	}
	out := section + sep + strings.TrimRight(add, "\n")
	if rest != "" {
		out += "\n\n" + rest
	}
	return out, ""
}

func isHeading(line string) bool {
	t := strings.TrimLeft(line, " ")
	n := 0
	for n < len(t) && t[n] == '#' {
		n++
	}
	return n >= 1 && n <= 6 && (len(t) == n || t[n] == ' ')
}

func headingLevel(line string) int {
	t := strings.TrimLeft(line, " ")
	return len(t) - len(strings.TrimLeft(t, "#"))
}

// headingText is a heading without its marks, as the planner names it.
func headingText(s string) string {
	return strings.TrimSpace(strings.TrimLeft(strings.TrimSpace(s), "#"))
}

// StatsOf counts a document's bytes, words, lines and headings.
func StatsOf(content string) Stats {
	st := Stats{Bytes: len(content), Words: len(strings.FieldsFunc(content, func(r rune) bool { return unicode.IsSpace(r) }))}
	if content != "" {
		st.Lines = strings.Count(content, "\n") + 1
	}
	seen := map[string]int{}
	for _, l := range strings.Split(content, "\n") {
		if isHeading(l) {
			st.Headings++
			if seen[strings.ToLower(headingText(l))]++; seen[strings.ToLower(headingText(l))] == 2 {
				st.DuplicateHeadings++
			}
		}
	}
	return st
}

// StructureOf summarizes a document's headings.
func StructureOf(content string) Structure {
	var s Structure
	seen := map[string]int{}
	for _, l := range strings.Split(content, "\n") {
		if !isHeading(l) {
			continue
		}
		s.Headings++
		if len(s.Outline) < 12 {
			s.Outline = append(s.Outline, clip(strings.TrimSpace(l)))
		}
		t := headingText(l)
		if seen[strings.ToLower(t)]++; seen[strings.ToLower(t)] == 2 && len(s.Duplicates) < 5 {
			s.Duplicates = append(s.Duplicates, clip(t))
		}
	}
	return s
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
