package dispatch_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/run"
)

// determinismScenarios are the planner runs of the determinism test: an
// agent run (actions, a plan, a final answer), a skill run and a
// workspace run (a patch proposed blocked, revised, applied, published).
var determinismScenarios = `
scenarios:
  agent:
    decisions:
      - {type: action, name: wf.search, args: {status: [FAILED]}}
      - {type: plan, actions: [{type: action, name: wf.count, args: {jobIds: [j1, j2]}}, {type: action, name: wf.search, args: {status: [DONE]}}]}
      - {type: final, answer: "two jobs failed"}
  skills:
    decisions:
      - {type: action, name: list_agent_skills, args: {}}
      - {type: action, name: read_agent_skill, args: {skillName: report}}
      - {type: action, name: use_agent_skill, args: {skillName: report}}
      - {type: action, name: execute_skill_tool, args: {toolName: count_rows, table: jobs}}
      - {type: action, name: handoff_to_skill, args: {skillName: review, handoffContext: "Counted.", inputFilter: {actionHistory: {keepLast: 0}, toolHistory: {keepLast: 1}}}}
      - {type: action, name: execute_skill_tool, args: {skillName: review, toolName: approve_report, args: {}}}
` + repairScenarios

// repairScenarios is repairScenario's run, under the same scenarios key.
var repairScenarios = repairScenario[len("\nscenarios:\n"):]

// storedState is a state as JSON values, for comparison.
func storedState(t *testing.T, st *run.State) map[string]any {
	t.Helper()
	b, err := st.Encode()
	require.NoError(t, err)
	var v map[string]any
	require.NoError(t, json.Unmarshal(b, &v))
	return v
}

// maxHandlingLag bounds how long after the server stored an event the
// dispatcher read its clock for it, in these tests.
const maxHandlingLag = 5 * time.Second

// sameUpToTheClock requires two states (as JSON values) to be equal but
// for their instants, and each replayed instant to be the stored one or
// earlier by at most maxHandlingLag: a replay reads the clock as the
// stored time of each event, where the dispatcher read its own clock when
// it handled the event.
//
// The fence its writer held is not compared (a replay writes nothing).
// The outbox is compared by ids only, the replay's within the stored
// one's: it holds what the run's last write left to publish, and a
// dispatcher groups the results of parallel calls that arrive together
// into one write (group commit) and applies them in the order they
// reached it — not recorded in the log, which holds them in the order
// the server stored them. That order numbers their progress steps (the
// same ids, each naming another call's completion) and nothing else.
func sameUpToTheClock(t *testing.T, stored, replayed map[string]any) {
	t.Helper()
	ids := func(st map[string]any) []any {
		var out []any
		outbox, _ := st["outbox"].([]any)
		for _, e := range outbox {
			out = append(out, e.(map[string]any)["id"])
		}
		delete(st, "outbox")
		return out
	}
	storedIDs, replayedIDs := ids(stored), ids(replayed)
	// The fence is the writer's, not the run's: a replay writes nothing.
	delete(stored, "fence")
	delete(replayed, "fence")
	assert.Subset(t, storedIDs, replayedIDs, "the replay's last transition publishes what the last write did")
	var walk func(path string, a, b any) (any, any)
	walk = func(path string, a, b any) (any, any) {
		switch x := a.(type) {
		case map[string]any:
			y, ok := b.(map[string]any)
			if !ok {
				return a, b
			}
			xo, yo := map[string]any{}, map[string]any{}
			for k, v := range x {
				xo[k], yo[k] = walk(path+"/"+k, v, y[k])
			}
			for k, v := range y {
				if _, ok := x[k]; !ok {
					yo[k] = v
				}
			}
			return xo, yo
		case []any:
			y, ok := b.([]any)
			if !ok || len(x) != len(y) {
				return a, b
			}
			xo, yo := make([]any, len(x)), make([]any, len(y))
			for i := range x {
				xo[i], yo[i] = walk(fmt.Sprintf("%s/%d", path, i), x[i], y[i])
			}
			return xo, yo
		case string:
			y, ok := b.(string)
			ta, errA := time.Parse(time.RFC3339Nano, x)
			tb, errB := time.Parse(time.RFC3339Nano, y)
			if !ok || errA != nil || errB != nil {
				return a, b
			}
			lag := ta.Sub(tb)
			assert.True(t, lag >= 0 && lag <= maxHandlingLag, "%s: replayed %s, stored %s", path, y, x)
			return "(instant)", "(instant)"
		}
		return a, b
	}
	a, b := walk("", stored, replayed)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("the replayed state differs from the stored one (-stored +replayed):\n%s", diff)
	}
}

// replaysToItsState replays the stored log of run runID and requires the
// state the runs bucket holds (see sameUpToTheClock).
func replaysToItsState(t *testing.T, d *dispatch.Dispatcher, res *client.Result) {
	t.Helper()
	replaysTo(t, d, res, sameUpToTheClock)
}

// repairedReplaysToItsState is replaysToItsState for a run whose ended
// state was written by a repair (its end published first, its writer
// crashed before the state): the state is the one its log implies, but
// for its outbox — the repair publishes what is left to send, not the
// end its crashed writer published.
func repairedReplaysToItsState(t *testing.T, d *dispatch.Dispatcher, res *client.Result) {
	t.Helper()
	replaysTo(t, d, res, func(t *testing.T, stored, replayed map[string]any) {
		t.Helper()
		delete(stored, "outbox")
		delete(replayed, "outbox")
		sameUpToTheClock(t, stored, replayed)
	})
}

func replaysTo(t *testing.T, d *dispatch.Dispatcher, res *client.Result, same func(t *testing.T, stored, replayed map[string]any)) {
	t.Helper()
	rep, err := d.ReplayLog(ctxT(t), "default", res.RunID)
	require.NoError(t, err)
	require.NotNil(t, rep.Replayed.Terminal, "the replay ends the run; events applied: %v", rep.Events)
	assert.Equal(t, res.Answer, rep.Replayed.Terminal.Answer)
	if res.Error != nil {
		require.NotNil(t, rep.Replayed.Terminal.Error)
		assert.Equal(t, res.Error.Code, rep.Replayed.Terminal.Error.Code)
	}
	same(t, storedState(t, rep.Stored), storedState(t, rep.Replayed))
}

// TestAReplayOfAStoredLogReachesTheStoredState: an agent run, a workflow
// run, a skill run and a workspace run, each run on the real services;
// each run's stored log (its request and every event the dispatcher
// consumed, read from the streams) is replayed through a new machine from
// the run's stored id key, and reaches the state the runs bucket holds —
// the same ids (calls, events, the patch), observations, workspace,
// outputs and answer — but for the clock (see sameUpToTheClock). The
// planner runs are also replayed as `actionbus replay` does, as new runs
// given the recorded decisions, without a divergence.
func TestAReplayOfAStoredLogReachesTheStoredState(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	w := &wfActions{gate: make(chan struct{})}
	var counted atomic.Int32
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, Scenarios: determinismScenarios,
		Register: func(ex *executor.Executor) error { return errors.Join(w.register(ex), registerSkills(&counted)(ex)) }})
	var d *dispatch.Dispatcher
	startDispatcher(t, srv, dispatch.Config{}, func(x *dispatch.Dispatcher) { d = x })
	ctx := ctxT(t)

	wf := client.NewWorkflow("triage").
		Step("jobs", "wf.search", map[string]any{"status": []any{"FAILED"}}).
		Step("count", "wf.count", map[string]any{"jobIds": client.FromStep("jobs", "/jobIds")}).
		Step("again", "wf.search", map[string]any{"status": []any{"DONE"}}).
		Build()
	for _, tc := range []struct {
		name string
		req  client.RunRequest
	}{
		{"agent", client.RunRequest{Scenario: "agent", Prompt: "How many jobs failed?"}},
		{"workflow", client.RunRequest{Workflow: wf}},
		{"skill", client.RunRequest{Scenario: "skills", Prompt: "report"}},
		{"workspace", client.RunRequest{Scenario: "repair", Prompt: "Repair the report.", Workspace: map[string]string{"report.md": repairDoc}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := st.Client.Run(ctx, tc.req, nil)
			require.NoError(t, err)
			require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
			replaysToItsState(t, d, res)
			if tc.req.Workflow == nil {
				// `actionbus replay`: a new run given the recorded
				// decisions reproduces the run.
				rep, err := st.Client.Replay(ctx, res.RunID)
				require.NoError(t, err)
				assert.Empty(t, rep.Divergences)
				assert.Equal(t, res.Answer, rep.Replayed.Result.Answer)
			}
		})
	}

	// A retry (its claim on the failed run is read, not written), and a
	// second retry, refused.
	t.Run("retries", func(t *testing.T) {
		broken := client.NewWorkflow("broken").
			Step("jobs", "wf.search", map[string]any{"status": []any{"FAILED"}}).
			Step("broken", "wf.broken", map[string]any{"after": client.FromStep("jobs", "/jobIds")}).
			Build()
		first, err := st.Client.Run(ctx, client.RunRequest{Workflow: broken}, nil)
		require.NoError(t, err)
		require.Equal(t, client.StatusFailed, first.Status)
		for i := range 2 {
			id, err := st.Client.Retry(ctx, first.RunID)
			require.NoError(t, err)
			res, err := st.Client.Wait(ctx, id)
			require.NoError(t, err)
			require.Equal(t, client.StatusFailed, res.Status)
			if i == 1 {
				require.Equal(t, actionbus.CodeRetryRefused, res.Error.Code)
			}
			replaysToItsState(t, d, res)
		}
	})
}
