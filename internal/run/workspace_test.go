package run

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
)

const draft = "# Report\n\n## Summary\n\nThree jobs failed.\n\n## Next steps\n\nRetry them."

func workspaceHarness(t *testing.T) *harness {
	return newHarness(t, events.RunLimits{}).start(events.RunRequested{Prompt: "repair the report", Workspace: map[string]string{"report.md": draft}})
}

func TestTheWorkspaceActionsRunInTheDispatcher(t *testing.T) {
	h := workspaceHarness(t)
	req := h.decisionRequest()
	require.NotNil(t, req.Workspace, "the planner sees the workspace")
	assert.Equal(t, []events.WorkspaceFileView{{Path: "report.md", Version: 1, Words: 12, Headings: 3}}, req.Workspace.Files)

	out := h.decide(action(WorkspaceRead, map[string]any{"path": "report.md"}))
	assert.False(t, has(out, EffectAct), "no executor is asked")
	assert.Equal(t, draft, h.lastObs().Output.(map[string]any)["content"])

	h.decide(action(WorkspaceAppend, map[string]any{"path": "report.md", "content": "## Owners\n\nThe delivery team."}))
	assert.Equal(t, 2.0, h.lastObs().Output.(map[string]any)["version"])
	h.decide(action(WorkspaceInsert, map[string]any{"path": "report.md", "heading": "Summary", "content": "All in the north region."}))
	assert.Equal(t, 3.0, h.lastObs().Output.(map[string]any)["version"])
	h.decide(action(WorkspaceInsert, map[string]any{"path": "report.md", "heading": "Causes", "content": "x"}))
	assert.Equal(t, "not_found", h.lastObs().Error.Details["reason"])
	h.decide(action(WorkspaceList, nil))
	assert.Equal(t, 3, h.decisionRequest().Workspace.Files[0].Version)

	out = h.decide(plan(action(WorkspaceAppend, map[string]any{"path": "report.md", "content": "x"}), action("t.read", nil)))
	assert.False(t, has(out, EffectAct))
	assert.Equal(t, actionbus.CodePlanRejected, h.st.Agent.Feedback.Code, "workspace actions run alone, in order")
}

// The report repair: a blocked preview withholds propose and apply from the
// next decision (calling them anyway is refused); the planner grows the
// report, proposes a valid patch, applies it and publishes the document.
func TestAReportIsRepairedThroughTheTwoStepPatch(t *testing.T) {
	h := workspaceHarness(t)
	h.decide(action(WorkspacePropose, map[string]any{"path": "report.md", "operations": []any{
		map[string]any{"type": "replace", "content": "# A whole new report"}}}))
	prop := h.lastObs().Output.(map[string]any)
	assert.Equal(t, "blocked", prop["status"])
	assert.Contains(t, prop["riskFlags"], "whole_document_replace")
	assert.Equal(t, []string{WorkspacePropose, WorkspaceApply}, h.decisionRequest().Hidden, "withheld from the next surface")

	h.decide(action(WorkspaceApply, map[string]any{"patchId": prop["patchId"]}))
	assert.Equal(t, "withheld_after_blocked_preview", h.lastObs().Error.Details["reason"])
	assert.Empty(t, h.decisionRequest().Hidden, "for one decision only")

	h.decide(action(WorkspaceApply, map[string]any{"patchId": prop["patchId"]}))
	assert.Equal(t, "preview_blocked", h.lastObs().Error.Details["reason"], "and never applies")

	h.decide(action(WorkspacePropose, map[string]any{"path": "report.md", "operations": []any{
		map[string]any{"type": "replace", "find": "Three jobs failed.", "replace": "Three delivery jobs failed on Monday, all in the north region."}}}))
	prop = h.lastObs().Output.(map[string]any)
	require.Equal(t, "ready", prop["status"], "%v", prop)
	assert.Equal(t, 1.0, prop["baseVersion"])
	assert.Equal(t, 8.0, prop["deltaWords"])
	assert.Empty(t, h.decisionRequest().Hidden)

	h.decide(action(WorkspaceApply, map[string]any{"patchId": prop["patchId"], "baseVersion": 1.0}))
	assert.Equal(t, 2.0, h.lastObs().Output.(map[string]any)["version"])
	assert.Nil(t, h.st.Agent.Workspace.Pending)

	out := h.decide(action(WorkspacePublish, map[string]any{"path": "report.md"}))
	require.True(t, has(out, EffectEnd))
	assert.Equal(t, StatusCompleted, h.st.Status)
	assert.Contains(t, h.st.Terminal.Answer, "all in the north region.")
	assert.Equal(t, "workspace_document", h.st.Terminal.Output.(map[string]any)["kind"])
}

func TestADocumentIsPublishedAsAnArtifact(t *testing.T) {
	h := workspaceHarness(t)
	h.decide(action(WorkspacePublish, map[string]any{"path": "report.md", "as": "artifact"}))
	require.Equal(t, StatusCompleted, h.st.Status)
	ref := h.st.Terminal.Output.(map[string]any)["artifact"].(map[string]any)
	stored := h.env.artifacts[ref["id"].(string)]
	assert.Equal(t, draft, string(stored))
	assert.Contains(t, h.st.Terminal.Answer, "as artifact")

	h = workspaceHarness(t)
	h.decide(action(WorkspacePublish, map[string]any{"path": "nope.md"}))
	assert.False(t, h.st.IsTerminal(), "a missing file goes back to the planner")
	assert.Equal(t, actionbus.CodeWorkspacePath, h.lastObs().Error.Code)
}

func TestAWorkspaceIsForAgentRuns(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).start(events.RunRequested{Action: &events.ActionCall{Name: "t.read"}, Workspace: map[string]string{"a.md": "x"}})
	assert.Equal(t, StatusFailed, h.st.Status)
	h = newHarness(t, events.RunLimits{}).start(events.RunRequested{Prompt: "p", Workspace: map[string]string{"../a.md": "x"}})
	assert.Equal(t, actionbus.CodeWorkspacePath, h.code())
}

// A document over workspace.InlineBytes is kept by artifact reference:
// run state holds its reference, each version is stored once, and a
// document altered in the store fails the run instead of being used.
func TestLargeDocumentsAreKeptByArtifactReference(t *testing.T) {
	big := "# Long report\n\n## Data\n\n" + strings.Repeat("Row of figures for the long report. ", 400)
	h := newHarness(t, events.RunLimits{}).start(events.RunRequested{Prompt: "p", Workspace: map[string]string{"long.md": big, "short.md": "# Short"}})
	f := h.st.Agent.Workspace.Files["long.md"]
	require.NotNil(t, f.Ref, "kept by reference")
	assert.Empty(t, f.Content, "not inline in run state")
	assert.Equal(t, "# Short", h.st.Agent.Workspace.Files["short.md"].Content, "a small document stays inline")
	b, err := json.Marshal(h.st)
	require.NoError(t, err)
	assert.Less(t, len(b), len(big)/2)

	h.decide(action(WorkspacePropose, map[string]any{"path": "long.md", "operations": []any{
		map[string]any{"type": "insert_after_section", "heading": "Data", "content": "A closing note on the figures above."}}}))
	prop := h.lastObs().Output.(map[string]any)
	require.Equal(t, "ready", prop["status"], "%v", prop)
	h.decide(action(WorkspaceApply, map[string]any{"patchId": prop["patchId"]}))
	f = h.st.Agent.Workspace.Files["long.md"]
	assert.Equal(t, 2, f.Version)
	require.NotNil(t, f.Ref)
	stored := string(h.env.artifacts[f.Ref.ID])
	assert.True(t, strings.HasSuffix(stored, "A closing note on the figures above."), "the new version is stored")

	h.env.tamper = true
	h.decide(action(WorkspaceAppend, map[string]any{"path": "long.md", "content": "More."}))
	h.env.tamper = false
	h.decide(action(WorkspaceRead, map[string]any{"path": "long.md"}))
	assert.Equal(t, actionbus.CodeArtifactMismatch, h.code(), "an altered document is never used")
}
