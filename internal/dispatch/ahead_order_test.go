package dispatch

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/run"
)

// TestTheEndNamesItsEventsInTheOrderTheyWereApplied: a batch delivered
// again after its holder died, in the order [the next cycle's decision
// (ahead), the result that asks for it]: applyJobs applies the result,
// then the decision, and the run completes. The end names them in that
// order, so that recompute — what every reader of an end published first
// does — rebuilds the ended state from them instead of adopting the end
// without the result.
func TestTheEndNamesItsEventsInTheOrderTheyWereApplied(t *testing.T) {
	ctx := context.Background()
	var lim events.RunLimits
	lim.SetDefaults()
	d := &Dispatcher{cfg: Config{RunLimits: lim}}
	d.machine = run.New(env{d}, d.machineConfig())
	base := []byte(`{"runId":"run-1","idKey":"k","tenant":"acme","kind":"agent","status":"running","phase":"acting","cycle":1,
		"agent":{"observations":[]},"calls":[{"callId":"c1","planIndex":0,"action":"t.read","pool":"p","origin":"model","dispatched":true}]}`)
	st, err := run.DecodeState(base)
	require.NoError(t, err)
	dec := &job{typ: events.TypeDecisionMade, tenant: "acme", pos: "AB_RUNS:11", ev: run.Event{ID: "d2",
		Data: &events.DecisionMade{RunID: "run-1", Cycle: 2, Decision: events.Decision{Type: events.DecisionFinal, Answer: "done"}}}}
	res := &job{typ: events.TypeActionCompleted, tenant: "acme", pos: "AB_RUNS:10", ev: run.Event{ID: "r1",
		Data: &events.ActionCompleted{RunID: "run-1", CallID: "c1", Cycle: 1, Output: map[string]any{"x": 1}, Executor: "x"}}}
	_, ordered, err := d.applyJobs(ctx, &st, []*job{dec, res})
	require.NoError(t, err)
	require.Equal(t, run.StatusCompleted, st.Status, "applyJobs applies the decision after the result")
	assert.Equal(t, []*job{res, dec}, ordered)
	committed := slices.DeleteFunc(slices.Clone(ordered), func(j *job) bool { return j.ahead }) // as applyBatch
	end := &endInStream{Terminal: st.Terminal, endedBy: parseEndedBy(endedBy(committed)), at: time.Now()}
	stored, err := run.DecodeState(base)
	require.NoError(t, err)
	rebuilt, _ := d.recompute(ctx, &stored, end, committed)
	require.NotNil(t, rebuilt, "the ended state is rebuilt from what the end names; Ab-Ended-By = %q", endedBy(committed))
	require.Len(t, rebuilt.Agent.Observations, 1, "with the result")
}
