package dispatch_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
)

// repairScenario repairs a report: a blocked whole-document replace, a
// growth, a valid patch proposed, applied and the document published.
const repairScenario = `
scenarios:
  repair:
    decisions:
      - {type: action, name: workspace_read, args: {path: report.md}}
      - {type: action, name: workspace_propose_patch, args: {path: report.md, operations: [{type: replace, content: "# A new report"}]}}
      - {type: action, name: workspace_insert_after_section, args: {path: report.md, heading: Failures, content: "job_1042 was never picked up by a worker."}}
      - type: action
        name: workspace_propose_patch
        args:
          path: report.md
          operations:
            - {type: replace, find: "Three jobs failed.", replace: "Three delivery jobs failed on Monday, all in the north region."}
      - type: action
        name: workspace_apply_patch
        args:
          patchId: '{{ index .Results "workspace_propose_patch" "patchId" }}'
          baseVersion: '{{ toJson (index .Results "workspace_propose_patch" "baseVersion") }}'
      - {type: action, name: workspace_publish, args: {path: report.md}}
`

// repairDoc is the report repairScenario repairs.
const repairDoc = "# Delivery report\n\n## Summary\n\nThree jobs failed.\n\n## Failures\n\njob_1041 timed out.\n\n## Next steps\n\nRetry them."

// A report repaired through the real services with the script planner:
// a whole-document replace previews blocked, the next surface withholds
// propose and apply, the planner grows the report instead, proposes a
// valid patch, applies it on the version it previewed and publishes the
// document as the run's answer.
func TestAReportIsRepairedProposedBlockedRevisedAppliedPublished(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "ab.run.>")
	st := srv.StartStack(t, actionbustest.StackOptions{Scenarios: repairScenario})
	ctx := ctxT(t)
	doc := "# Delivery report\n\n## Summary\n\nThree jobs failed.\n\n## Failures\n\njob_1041 timed out.\n\n## Next steps\n\nRetry them."
	res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "repair", Prompt: "Repair the report.", Workspace: map[string]string{"report.md": doc}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, "# Delivery report\n\n## Summary\n\nThree delivery jobs failed on Monday, all in the north region.\n\n## Failures\n\n"+
		"job_1041 timed out.\n\njob_1042 was never picked up by a worker.\n\n## Next steps\n\nRetry them.", res.Answer)
	assert.Equal(t, 3.0, res.Output.(map[string]any)["version"], "two changes after the first version")

	// The recorder reads core NATS: the run's end can reach the client
	// before the recorder has every request.
	isRequest := func(r actionbustest.Recorded) bool {
		return r.Type() == events.TypeDecisionRequested && r.Event.Extensions()[events.ExtRunID] == res.RunID
	}
	rec.WaitForN(t, 10*time.Second, 6, isRequest)
	var reqs []events.DecisionRequested
	for _, r := range rec.All() {
		if isRequest(r) {
			var d events.DecisionRequested
			require.NoError(t, events.DataAs(r.Event, &d))
			reqs = append(reqs, d)
		}
	}
	require.Len(t, reqs, 6)
	require.NotNil(t, reqs[0].Workspace)
	assert.Equal(t, 1, reqs[0].Workspace.Files[0].Version)
	blocked := reqs[2].Observations[len(reqs[2].Observations)-1].Output.(map[string]any)
	assert.Equal(t, "blocked", blocked["status"])
	assert.NotContains(t, blocked, "preview", "never the preview's text")
	assert.Equal(t, []string{"workspace_propose_patch", "workspace_apply_patch"}, reqs[2].Hidden, "withheld after the blocked preview")
	assert.Empty(t, reqs[3].Hidden)
	assert.Equal(t, "ready", reqs[4].Workspace.PendingPatch["status"])
}

// TestAReplayOfAWorkspaceRunProposesTheSamePatchAndApplies: `actionbus
// replay` of a run that proposed and applied a patch: the replayed run
// proposes the patch under the id the recorded apply names (a patch's id
// derives from the proposal, not from the run), so the apply is not
// refused patch_id_mismatch and nothing diverges.
func TestAReplayOfAWorkspaceRunProposesTheSamePatchAndApplies(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Scenarios: repairScenario})
	ctx := ctxT(t)
	res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "repair", Prompt: "Repair the report.", Workspace: map[string]string{"report.md": repairDoc}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	rep, err := st.Client.Replay(ctx, res.RunID)
	require.NoError(t, err)
	assert.Empty(t, rep.Divergences)
	assert.Equal(t, client.StatusCompleted, rep.Replayed.Result.Status, "%+v", rep.Replayed.Result.Error)
	assert.Equal(t, res.Answer, rep.Replayed.Result.Answer)
}
