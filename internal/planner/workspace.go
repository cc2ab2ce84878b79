package planner

import (
	"encoding/json"
	"slices"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/run"
)

// workspaceEntries are the workspace actions as planner-visible entries,
// offered when the run has a workspace; the dispatcher runs them.
var workspaceEntries = func() []actions.Entry {
	obj := func(props map[string]any, required ...string) json.RawMessage {
		return objectSchema(props, false, required...)
	}
	str := func(d string) map[string]any { return map[string]any{"type": "string", "description": d} }
	path := str("a workspace file, e.g. report.md")
	op := map[string]any{"type": "object", "description": "one Patch v1 operation: {type: replace, find, replace, replace_all?} | " +
		"{type: append, content, separator?} | {type: insert_after_section, heading, content, separator?} | " +
		"{type: normalize_headings, headings: [{lineNumber, text}]}"}
	defs := []actions.Definition{
		{Name: run.WorkspaceList, Description: "List the workspace's files with their versions and word counts, and the pending patch.", InputSchema: obj(map[string]any{})},
		{Name: run.WorkspaceRead, Description: "Read one workspace file.", InputSchema: obj(map[string]any{"path": path}, "path")},
		{Name: run.WorkspaceAppend, Description: "Append content to a workspace file (creating it).",
			InputSchema: obj(map[string]any{"path": path, "content": str("markdown to add"), "separator": str("default a blank line")}, "path", "content")},
		{Name: run.WorkspaceInsert, Description: "Add content at the end of one section (after its heading's text, before the next heading of its level).",
			InputSchema: obj(map[string]any{"path": path, "heading": str("the section's heading"), "content": str("markdown to add"), "separator": str("default a blank line")}, "path", "heading", "content")},
		{Name: run.WorkspacePropose, Description: "Preview a patch of structured operations on a file (nothing changes): returns patchId, baseVersion, word counts, status and riskFlags. A blocked preview must be revised.",
			InputSchema: obj(map[string]any{"path": path, "operations": map[string]any{"type": "array", "minItems": 1, "items": op}}, "path", "operations")},
		{Name: run.WorkspaceApply, Description: "Apply the latest valid pending patch, on the version it was previewed on.",
			InputSchema: obj(map[string]any{"patchId": str("the pending patch's id"), "baseVersion": map[string]any{"type": "integer"}}, "patchId")},
		{Name: run.WorkspacePublish, Description: "Publish a workspace file as the run's final answer (as: answer, the default) or as an artifact; the run ends.",
			InputSchema: obj(map[string]any{"path": path, "as": map[string]any{"type": "string", "enum": []any{"answer", "artifact"}}}, "path")},
	}
	out := make([]actions.Entry, 0, len(defs))
	for _, d := range defs {
		d.Mode, d.Version, d.Pool = actions.ModeDraft, "1", "dispatcher"
		d.Planner = &actions.PlannerMeta{StateMutator: true}
		out = append(out, actions.Entry{Definition: d})
	}
	return out
}()

// surface returns the actions a decision may choose from: the catalog's
// planner-visible actions, the skill actions when the catalog holds
// skills, the workspace actions when the run has a workspace — without
// those the request withholds.
func surface(entries []actions.Entry, hasSkills bool, req *events.DecisionRequested) []actions.Entry {
	out := withSkills(entries, hasSkills)
	if req.Workspace != nil {
		out = append(slices.Clone(out), workspaceEntries...)
	}
	if len(req.Hidden) > 0 {
		out = slices.DeleteFunc(slices.Clone(out), func(e actions.Entry) bool { return slices.Contains(req.Hidden, e.Name) })
	}
	return out
}

// workspacePrompt tells the planner what the run's workspace holds.
func workspacePrompt(ws *events.WorkspaceView) string {
	if ws == nil {
		return ""
	}
	b, _ := json.Marshal(ws)
	return "The run has a virtual workspace (read files with workspace_read; grow them with workspace_append or " +
		"workspace_insert_after_section; repair them with workspace_propose_patch, then workspace_apply_patch once the " +
		"preview is ready; publish the result with workspace_publish). Its state (JSON): " + string(b)
}
