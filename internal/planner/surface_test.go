package planner

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/run"
	"github.com/actionbus/actionbus/internal/skills"
)

// What a decision may choose from: the catalog's actions, the skill
// actions when skills exist, the workspace actions when the run has a
// workspace, without what the request withholds.
func TestTheSurfaceFollowsTheRequest(t *testing.T) {
	catalog := []actions.Entry{{Definition: actions.Definition{Name: "t.read"}}}
	names := func(es []actions.Entry) []string {
		var out []string
		for _, e := range es {
			out = append(out, e.Name)
		}
		return out
	}
	plain := names(surface(catalog, false, &events.DecisionRequested{}))
	assert.Equal(t, []string{"t.read"}, plain)

	withSkills := names(surface(catalog, true, &events.DecisionRequested{}))
	assert.Contains(t, withSkills, skills.ExecuteTool)
	assert.NotContains(t, withSkills, run.WorkspaceRead)

	ws := &events.WorkspaceView{Files: []events.WorkspaceFileView{{Path: "r.md", Version: 1}}}
	withWS := names(surface(catalog, false, &events.DecisionRequested{Workspace: ws}))
	for _, n := range run.WorkspaceActions {
		assert.Contains(t, withWS, n)
	}
	hidden := names(surface(catalog, false, &events.DecisionRequested{Workspace: ws, Hidden: []string{run.WorkspacePropose, run.WorkspaceApply}}))
	assert.NotContains(t, hidden, run.WorkspacePropose)
	assert.NotContains(t, hidden, run.WorkspaceApply)
	assert.Contains(t, hidden, run.WorkspaceAppend)
	assert.Len(t, catalog, 1, "the catalog listing is not changed")
}
