package dispatch_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
)

// progressMessages returns the step names of every run.progress message
// of runID the recorder saw, one list per message, in the order they
// arrived, after checking each against its schema.
func progressMessages(t *testing.T, rec *actionbustest.Recorder, runID string) [][]string {
	t.Helper()
	var out [][]string
	for _, r := range rec.All() {
		if r.Type() != events.TypeRunProgress || r.Event.Extensions()[events.ExtRunID] != runID {
			continue
		}
		require.NoError(t, events.Validate(r.Event), "a run.progress valid against schemas/run.progress.json")
		assert.Equal(t, events.SchemaURL(events.TypeRunProgress), r.Event.DataSchema())
		var p events.RunProgress
		require.NoError(t, events.DataAs(r.Event, &p))
		assert.Equal(t, events.ProgressVersion, p.Version)
		names := []string{}
		for _, s := range p.Steps {
			assert.Equal(t, runID, s.RunID)
			names = append(names, s.Name)
		}
		out = append(out, names)
	}
	return out
}

// TestATransitionsLiveStepsTravelAsOneProgressMessageInOrder: every
// transition of an agent run (admitted; the planner's action decision;
// the action's result; the final decision) publishes its live steps as one
// run.progress message on the real server, in the order the run took them,
// and a follower still sees every step, in that order.
func TestATransitionsLiveStepsTravelAsOneProgressMessageInOrder(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "")
	st := srv.StartStack(t, actionbustest.StackOptions{Scenarios: echoScenario, Register: echoExecutor})
	ctx := ctxT(t)
	var followed []string
	res, err := st.Client.Run(ctx, client.RunRequest{Prompt: "echo", Scenario: "echo"}, func(e client.Event) {
		if s, ok := e.Step(); ok && e.Type == events.TypeRunProgress {
			followed = append(followed, s.Name)
		}
	})
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	rec.WaitForType(t, 0, events.TypeRunCompleted, res.RunID)

	msgs := progressMessages(t, rec, res.RunID)
	// Four transitions imply progress: the admission, the action decision,
	// the result, the final decision. One message each, its steps in the
	// order the run took them (one step apiece, they were ten messages).
	assert.Equal(t, [][]string{
		{"decide"},
		{"policy-evaluated", "act", "action-dispatched"},
		{"action-completed", "observe", "evaluate", "orient", "decide"},
		{"final"},
	}, msgs, "one run.progress message per transition")
	var carried []string
	for _, m := range msgs {
		carried = append(carried, m...)
	}
	assert.Equal(t, carried, followed, "the follower sees every step, in order")
}

// TestAHeldResultsProgressIsOneMessage: a result that only changes the
// state (four of five parallel steps) is held, not written; its
// transition's progress still goes out at once, as one run.progress
// message of version 2 carrying its step.
func TestAHeldResultsProgressIsOneMessage(t *testing.T) {
	srv, rec, st, w, _ := startHolding(t)
	ctx := ctxT(t)
	runID := fanOut(t, ctx, srv, rec, st, w)
	admission := len(progressMessages(t, rec, runID))
	for i := 1; i <= 4; i++ {
		w.gate <- struct{}{}
		completedSteps(t, rec, runID, i)
		msgs := progressMessages(t, rec, runID)
		require.Len(t, msgs, admission+i, "one message per held result")
		assert.Equal(t, []string{"action-completed"}, msgs[len(msgs)-1])
	}
	finishFanOut(t, ctx, st, w, runID)
}
