package run

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/workspace"
)

// The workspace actions run in the dispatcher, on the run's virtual
// workspace (internal/workspace): like the skill actions, each result is
// an observation and the planner is asked again; workspace_publish ends
// the run with the document. They change only the run's own state, so no
// policy judges them; they are refused inside plans (their order matters).
const (
	WorkspaceList    = "workspace_list"
	WorkspaceRead    = "workspace_read"
	WorkspaceAppend  = "workspace_append"
	WorkspaceInsert  = "workspace_insert_after_section"
	WorkspacePropose = "workspace_propose_patch"
	WorkspaceApply   = "workspace_apply_patch"
	WorkspacePublish = "workspace_publish"
)

// WorkspaceActions are the workspace actions' names.
var WorkspaceActions = []string{WorkspaceList, WorkspaceRead, WorkspaceAppend, WorkspaceInsert, WorkspacePropose, WorkspaceApply, WorkspacePublish}

// isWorkspaceAction reports whether name is a workspace action.
func isWorkspaceAction(name string) bool { return slices.Contains(WorkspaceActions, name) }

// withheldAfterBlock are the actions a blocked preview withholds from the
// next decision.
var withheldAfterBlock = []string{WorkspacePropose, WorkspaceApply}

// onWorkspaceAction runs one workspace action. hidden are the actions the
// decision's surface withheld: calling one anyway is refused.
func (m *Machine) onWorkspaceAction(ctx context.Context, st *State, dec events.Decision, hidden []string) ([]Effect, error) {
	if st.Agent.Workspace == nil {
		st.Agent.Workspace = &workspace.Workspace{Files: map[string]*workspace.File{}}
	}
	ws := st.Agent.Workspace
	if err := m.loadWorkspace(ctx, st.Tenant, ws); err != nil {
		var abErr *actionbus.Error
		if errors.As(err, &abErr) {
			return m.fail(st, abErr), nil // a document was altered in the store
		}
		return nil, err
	}
	str := func(k string) string { s, _ := dec.Args[k].(string); return s }
	sep := func() *string {
		if s, ok := dec.Args["separator"].(string); ok {
			return &s
		}
		return nil
	}
	fileOut := func(p string, f *workspace.File) map[string]any {
		return map[string]any{"path": p, "version": f.Version, "workspaceVersion": ws.Version, "stats": f.Stats}
	}
	var out any
	var summary string
	var failed *actionbus.Error
	switch {
	case slices.Contains(hidden, dec.Name):
		failed = actionbus.Errorf(actionbus.CodePatchRejected,
			"%s is withheld after a blocked preview: grow the document with workspace_append or workspace_insert_after_section, or publish it as it is", dec.Name).
			WithDetail("reason", "withheld_after_blocked_preview")
	case dec.Name == WorkspaceList:
		out, summary = workspaceView(ws), fmt.Sprintf("%d file(s), version %d", len(ws.Files), ws.Version)
	case dec.Name == WorkspaceRead:
		f, err := ws.File(str("path"))
		if failed = err; err == nil {
			out = map[string]any{"path": str("path"), "version": f.Version, "stats": f.Stats, "content": f.Content}
			summary = fmt.Sprintf("%s v%d, %d words", str("path"), f.Version, f.Stats.Words)
		}
	case dec.Name == WorkspaceAppend:
		f, err := ws.Append(str("path"), str("content"), sep())
		if failed = err; err == nil {
			out, summary = fileOut(str("path"), f), fmt.Sprintf("appended to %s: v%d, %d words", str("path"), f.Version, f.Stats.Words)
		}
	case dec.Name == WorkspaceInsert:
		f, err := ws.InsertAfterSection(str("path"), str("heading"), str("content"), sep())
		if failed = err; err == nil {
			out, summary = fileOut(str("path"), f), fmt.Sprintf("inserted after %q in %s: v%d", str("heading"), str("path"), f.Version)
		}
	case dec.Name == WorkspacePropose:
		ops, err := workspace.ParseOps(dec.Args["operations"])
		if failed = err; err != nil {
			break
		}
		p, err := ws.Propose(str("path"), ops, patchID(st.Cycle, str("path"), ws.Version, dec.Args["operations"]))
		if failed = err; err == nil {
			out, summary = p, fmt.Sprintf("patch %s %s: %s", p.PatchID, p.Status, p.PreviewSummary)
		}
	case dec.Name == WorkspaceApply:
		base := 0
		if v, ok := dec.Args["baseVersion"].(float64); ok {
			base = int(v)
		}
		pending := ws.Pending
		f, err := ws.Apply(str("patchId"), base)
		if failed = err; err == nil {
			out, summary = fileOut(pending.Path, f), fmt.Sprintf("applied %s to %s: v%d", pending.ID, pending.Path, f.Version)
		}
	case dec.Name == WorkspacePublish:
		return m.publishDocument(ctx, st, str("path"), str("as"))
	}
	steps := m.observeRuntime(st, dec.Name, out, summary, failed)
	// A blocked preview withholds propose and apply from the next
	// decision: the planner grows the document or publishes it instead
	// of repeating the same invalid preview.
	st.Agent.Withhold = nil
	if dec.Name == WorkspacePropose && ws.Blocked() {
		st.Agent.Withhold = withheldAfterBlock
	}
	puts := m.storeWorkspace(st, ws)
	return append(append(puts, steps...), m.askPlanner(st)...), nil
}

// patchID is the id of a proposed patch: derived from what the proposal
// is — its cycle, path, the workspace's version and its operations — and
// not from the run's id key, so that a replay of the run (a new run given
// the recorded decisions, `actionbus replay`) proposes the same id and the
// recorded apply names it. It is no secret: the planner is told it, and
// it names a patch of the run's own workspace only.
func patchID(cycle int, path string, wsVersion int, operations any) string {
	ops, err := json.Marshal(operations)
	if err != nil {
		ops = nil // not reached: the operations were decoded from JSON
	}
	return events.DerivedID("workspace-patch", path, cycle, wsVersion, string(ops))
}

// publishDocument ends the run with a workspace document: as its answer
// (the default), or stored as an artifact that the run's output names.
func (m *Machine) publishDocument(ctx context.Context, st *State, path, as string) ([]Effect, error) {
	f, err := st.Agent.Workspace.File(path)
	if err != nil {
		puts := m.storeWorkspace(st, st.Agent.Workspace)
		return append(append(puts, m.observeRuntime(st, WorkspacePublish, nil, "", err)...), m.askPlanner(st)...), nil
	}
	output := map[string]any{"kind": "workspace_document", "path": path, "version": f.Version, "stats": jsonValue(f.Stats)}
	answer := f.Content
	var puts []Effect
	if as == "artifact" {
		ref, put := m.artifact(st, st.derive("document", path, f.Version), []byte(f.Content))
		puts = append(puts, put)
		output["artifact"] = jsonValue(ref)
		answer = fmt.Sprintf("published %s (version %d, %d words) as artifact %s", path, f.Version, f.Stats.Words, ref.ID)
	}
	puts = append(puts, m.storeWorkspace(st, st.Agent.Workspace)...)
	out := append(puts, step(st, StepActionCompleted, nil, WorkspacePublish, "published "+path, "ok"))
	return append(out, m.terminate(st, &Terminal{Type: events.TypeRunCompleted, Answer: answer, Output: output})...), nil
}

// workspaceView is the workspace as the planner sees it.
func workspaceView(ws *workspace.Workspace) *events.WorkspaceView {
	if ws == nil {
		return nil
	}
	v := &events.WorkspaceView{Version: ws.Version, Files: []events.WorkspaceFileView{}}
	for _, p := range ws.Paths() {
		f := ws.Files[p]
		v.Files = append(v.Files, events.WorkspaceFileView{Path: p, Version: f.Version, Words: f.Stats.Words, Headings: f.Stats.Headings})
	}
	if pp := ws.Pending; pp != nil {
		v.PendingPatch = map[string]any{"patchId": pp.ID, "path": pp.Path, "status": pp.Status, "riskFlags": pp.RiskFlags, "baseVersion": pp.BaseVersion}
	}
	return v
}

// jsonValue is v as it reads back from JSON (maps, slices, float64): what
// run state holds after it is stored, so a transition's results are the
// same whether or not the state went through the bucket.
func jsonValue(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		return nil
	}
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

// loadWorkspace fills in the content of the documents kept by artifact
// reference, checking each against its recorded SHA-256.
func (m *Machine) loadWorkspace(ctx context.Context, tenant string, ws *workspace.Workspace) error {
	for _, p := range ws.Paths() {
		f := ws.Files[p]
		if f.Ref == nil || f.Content != "" {
			continue
		}
		data, err := m.env.GetArtifact(ctx, tenant, *f.Ref)
		if err != nil {
			return err
		}
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != f.Ref.SHA256 {
			return actionbus.Errorf(actionbus.CodeArtifactMismatch, "workspace file %s changed in the artifact store", p).WithDetail("path", p)
		}
		f.Content = string(data)
	}
	return nil
}

// storeWorkspace keeps every document over workspace.InlineBytes by
// artifact reference (stored once per version: the effects returned), so
// run state stays small.
func (m *Machine) storeWorkspace(st *State, ws *workspace.Workspace) []Effect {
	var puts []Effect
	for _, p := range ws.Paths() {
		f := ws.Files[p]
		if len(f.Content) <= workspace.InlineBytes {
			f.Ref = nil
			continue
		}
		sum := sha256.Sum256([]byte(f.Content))
		if f.Ref == nil || f.Ref.SHA256 != hex.EncodeToString(sum[:]) {
			ref, put := m.artifact(st, st.derive("workspace", p, f.Version), []byte(f.Content))
			puts = append(puts, put)
			ref.Preview = ""
			f.Ref = &ref
		}
		f.Content = ""
	}
	return puts
}

// artifact is the reference to data kept as artifact id of run st, and
// the effect that asks the shell to store it ([EffectArtifact]).
func (m *Machine) artifact(st *State, id string, data []byte) (events.ArtifactRef, Effect) {
	ref := events.NewArtifactRef(m.artifactStore, id, "output", "application/json", data, 0)
	return ref, Effect{Kind: EffectArtifact, ID: id, Artifact: &ArtifactWrite{Tenant: st.Tenant, RunID: st.RunID, Ref: ref, Data: data}}
}
