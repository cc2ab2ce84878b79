package dispatch_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/run"
)

// startDispatcher runs a dispatcher with cfg (prepared by prepare, when
// given) until the test ends or the returned stop is called (which waits
// for it to return).
func startDispatcher(t *testing.T, srv *actionbustest.Server, cfg dispatch.Config, prepare ...func(*dispatch.Dispatcher)) (stop func()) {
	t.Helper()
	d, err := dispatch.New(srv.Connect(t), cfg)
	require.NoError(t, err)
	for _, p := range prepare {
		p(d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var stopped bool
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("dispatcher: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("dispatcher not ready")
	}
	return stop
}

// startHolding starts a server, the recorder, a stack of gated actions
// without dispatcher, and a dispatcher that runs five calls at once and
// holds results for up to a minute (prepared by prepare, when given).
func startHolding(t *testing.T, prepare ...func(*dispatch.Dispatcher)) (*actionbustest.Server, *actionbustest.Recorder, *actionbustest.Stack, *wfActions, func()) {
	t.Helper()
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "")
	w := &wfActions{gate: make(chan struct{})}
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, Register: w.register, Slots: 8})
	stop := startDispatcher(t, srv, dispatch.Config{RunLimits: events.RunLimits{MaxPlanParallel: 5}, ResultLinger: time.Minute, InstanceID: "holding"}, prepare...)
	return srv, rec, st, w, stop
}

// fanOut starts a workflow of five independent gated steps and waits until
// all five run.
func fanOut(t *testing.T, ctx context.Context, srv *actionbustest.Server, rec *actionbustest.Recorder, st *actionbustest.Stack, w *wfActions) string {
	t.Helper()
	b := client.NewWorkflow("fan-out")
	for _, id := range []string{"s1", "s2", "s3", "s4", "s5"} {
		b.Step(id, "wf.gated", map[string]any{"id": id})
	}
	runID, err := st.Client.Start(ctx, client.RunRequest{Workflow: b.Build()})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.inFlight == 5
	}, 10*time.Second, time.Millisecond)
	// The admission hands its work out while it writes the state and
	// publishes its progress after: both are waited for.
	admitted(t, ctx, srv, runID)
	rec.WaitForStep(t, 10*time.Second, func(s events.RunStep) bool { return s.RunID == runID && s.Name == "action-dispatched" })
	return runID
}

// finishFanOut lets the fifth step of runID finish and returns the run's
// outputs by step and its steps, once it completed.
func finishFanOut(t *testing.T, ctx context.Context, st *actionbustest.Stack, w *wfActions, runID string) (map[string]any, []any) {
	t.Helper()
	w.gate <- struct{}{}
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	outputs, steps := output(res)
	require.Len(t, steps, 5)
	return outputs, steps
}

// completedSteps waits for n action-completed progress steps of runID. The
// dispatcher publishes a result's progress after it stored the result, or
// decided to hold it: once they are seen, no write for them is pending.
func completedSteps(t *testing.T, rec *actionbustest.Recorder, runID string, n int) {
	t.Helper()
	rec.WaitForSteps(t, 10*time.Second, n, func(s events.RunStep) bool {
		return s.RunID == runID && s.Name == string(run.StepActionCompleted)
	})
}

// TestResultsOfAFanOutAreCommittedWithTheRunsEnd: four of five parallel
// steps finish; their results change only the state (the fifth is still
// out), so they are held, unacknowledged, instead of written one by one:
// the stored state is still the admission's. The fifth result ends the
// run, and its end is the commit: it names the five results, no state is
// written after the admission's, and the ended state a reader (a retry, a
// replay) rebuilds from the two holds all five.
func TestResultsOfAFanOutAreCommittedWithTheRunsEnd(t *testing.T) {
	var d *dispatch.Dispatcher
	srv, rec, st, w, _ := startHolding(t, func(x *dispatch.Dispatcher) { d = x })
	ctx := ctxT(t)
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)
	kv, err := js.KeyValue(ctx, "ab_runs")
	require.NoError(t, err)

	runID := fanOut(t, ctx, srv, rec, st, w)
	admitted, err := kv.Get(ctx, runID)
	require.NoError(t, err)
	for range 4 {
		w.gate <- struct{}{}
	}
	completedSteps(t, rec, runID, 4)
	now, err := kv.Get(ctx, runID)
	require.NoError(t, err)
	assert.Equal(t, admitted.Revision(), now.Revision(), "four results held, none written")

	_, steps := finishFanOut(t, ctx, st, w, runID)
	for i, s := range steps {
		assert.Equal(t, []string{"s1", "s2", "s3", "s4", "s5"}[i], s.(map[string]any)["id"])
	}
	// Once the five results are acknowledged, the transition is done.
	settled(t, js)
	stream, err := js.Stream(ctx, "KV_ab_runs")
	require.NoError(t, err)
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter("$KV.ab_runs."+runID))
	require.NoError(t, err)
	assert.Equal(t, admitted.Revision(), info.State.LastSeq, "no state written after the admission's")
	end := storedEnd(t, js, runID, "completed")
	assert.Equal(t, 5, strings.Count(end.Header.Get("Ab-Ended-By"), events.TypeActionCompleted), "the end names the five results: %s", end.Header.Get("Ab-Ended-By"))

	ended, err := dispatch.EndedState(ctx, d, "", runID)
	require.NoError(t, err)
	assert.Equal(t, run.StatusCompleted, ended.Status)
	require.Len(t, ended.Workflow.Steps, 5)
	for i, s := range ended.Workflow.Steps {
		assert.Equal(t, run.StepStatusDone, s.Status, "step %d", i)
	}
	byStep := ended.Terminal.Output.(map[string]any)["outputByStep"].(map[string]any)
	for _, id := range []string{"s1", "s2", "s3", "s4", "s5"} {
		assert.Equal(t, map[string]any{"id": id}, byStep[id], "the output of %s", id)
	}
}

// settled waits until the dispatcher's consumers of the runs stream have
// nothing pending or unacknowledged: every result was applied and its
// transition committed.
func settled(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	ctx := ctxT(t)
	for _, c := range (bus.Topology{}).DispatcherConsumers(0) {
		if c.Stream != "AB_RUNS" {
			continue
		}
		cons, err := js.Consumer(ctx, c.Stream, c.Config.Durable)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			info, err := cons.Info(ctx)
			return err == nil && info.NumAckPending == 0 && info.NumPending == 0
		}, 10*time.Second, time.Millisecond, "the dispatcher acknowledged every result")
	}
}

// storedEnd is the stored message of run runID's end of verb.
func storedEnd(t *testing.T, js jetstream.JetStream, runID, verb string) *jetstream.RawStreamMsg {
	t.Helper()
	stream, err := js.Stream(ctxT(t), "AB_RUNS")
	require.NoError(t, err)
	for _, subject := range (bus.Topology{}).Subjects().StoredForms("default", runID, verb) {
		if m, err := stream.GetLastMsgForSubject(ctxT(t), subject); err == nil {
			return m
		}
	}
	t.Fatalf("run %s: no %s end stored", runID, verb)
	return nil
}

// TestHeldResultsSurviveTheirDispatcher: the dispatcher holding four
// results stops before writing them; they were never acknowledged, so
// another dispatcher gets them again and the run ends with all five, each
// step run once.
func TestHeldResultsSurviveTheirDispatcher(t *testing.T) {
	srv, rec, st, w, stop := startHolding(t)
	ctx := ctxT(t)

	runID := fanOut(t, ctx, srv, rec, st, w)
	for range 4 {
		w.gate <- struct{}{}
	}
	completedSteps(t, rec, runID, 4)
	stop()
	startDispatcher(t, srv, dispatch.Config{RunLimits: events.RunLimits{MaxPlanParallel: 5}, InstanceID: "second"})
	outputs, _ := finishFanOut(t, ctx, st, w, runID)
	for _, id := range []string{"s1", "s2", "s3", "s4", "s5"} {
		assert.Equal(t, map[string]any{"id": id}, outputs[id])
	}
	// The second dispatcher sends the admission's outbox again (it cannot
	// know it was sent); the stream keeps each work item once.
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)
	work, err := js.Stream(ctx, "AB_WORK")
	require.NoError(t, err)
	info, err := work.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(5), info.State.Msgs, "each step was requested once")
}

// chain starts a workflow of three gated steps, each bound to the one
// before it, and waits until the first runs and the admission's state is
// stored; it returns the run id and that state's revision.
func chain(t *testing.T, ctx context.Context, srv *actionbustest.Server, rec *actionbustest.Recorder, st *actionbustest.Stack) (string, uint64) {
	t.Helper()
	b := client.NewWorkflow("chain").Step("s1", "wf.gated", map[string]any{"id": "s1"})
	b.Step("s2", "wf.gated", map[string]any{"id": "s2", "after": client.FromStep("s1", "/id")})
	b.Step("s3", "wf.gated", map[string]any{"id": "s3", "after": client.FromStep("s2", "/id")})
	runID, err := st.Client.Start(ctx, client.RunRequest{Workflow: b.Build()})
	require.NoError(t, err)
	dispatchedSteps(t, rec, runID, 1)
	return runID, admitted(t, ctx, srv, runID)
}

// admitted waits until runID's state is stored (its admission hands its
// work out while it writes it) and returns the state's revision.
func admitted(t *testing.T, ctx context.Context, srv *actionbustest.Server, runID string) uint64 {
	t.Helper()
	kv, err := srv.JS.KeyValue(ctx, "ab_runs")
	require.NoError(t, err)
	var revision uint64
	require.Eventually(t, func() bool {
		e, err := kv.Get(ctx, runID)
		if err == nil {
			revision = e.Revision()
		}
		return err == nil
	}, 10*time.Second, time.Millisecond, "the run's state is stored")
	return revision
}

// dispatchedSteps waits for n action-dispatched progress steps of runID.
func dispatchedSteps(t *testing.T, rec *actionbustest.Recorder, runID string, n int) {
	t.Helper()
	rec.WaitForSteps(t, 10*time.Second, n, func(s events.RunStep) bool {
		return s.RunID == runID && s.Name == "action-dispatched"
	})
}

// lastStateWrite is the sequence of the last write of runID's state.
func lastStateWrite(t *testing.T, js jetstream.JetStream, runID string) uint64 {
	t.Helper()
	stream, err := js.Stream(ctxT(t), "KV_ab_runs")
	require.NoError(t, err)
	info, err := stream.Info(ctxT(t), jetstream.WithSubjectFilter("$KV.ab_runs."+runID))
	require.NoError(t, err)
	return info.State.LastSeq
}

// TestAChainHandsOutEachStepFromAHeldState: each result of a chain hands
// the next step out without writing the run's state (its result stays
// unacknowledged instead); the last ends the run, and its end is the
// commit. So a chain of three stores its state once, at admission, and
// the end names the three results, from which a reader rebuilds the ended
// state with every step's output.
func TestAChainHandsOutEachStepFromAHeldState(t *testing.T) {
	var d *dispatch.Dispatcher
	srv, rec, st, w, _ := startHolding(t, func(x *dispatch.Dispatcher) { d = x })
	ctx := ctxT(t)
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)

	runID, admitted := chain(t, ctx, srv, rec, st)
	for n := 2; n <= 3; n++ {
		w.gate <- struct{}{}
		dispatchedSteps(t, rec, runID, n)
		assert.Equal(t, admitted, lastStateWrite(t, js, runID), "step %d handed out without a state write", n)
	}
	w.gate <- struct{}{}
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	outputs, _ := output(res)
	assert.Equal(t, map[string]any{"id": "s3", "after": "s2"}, outputs["s3"])

	settled(t, js)
	assert.Equal(t, admitted, lastStateWrite(t, js, runID), "no state written after the admission's")
	end := storedEnd(t, js, runID, "completed")
	assert.Equal(t, 3, strings.Count(end.Header.Get("Ab-Ended-By"), events.TypeActionCompleted), "the end names the three results: %s", end.Header.Get("Ab-Ended-By"))
	ended, err := dispatch.EndedState(ctx, d, "", runID)
	require.NoError(t, err)
	assert.Equal(t, run.StatusCompleted, ended.Status)
	for i, s := range ended.Workflow.Steps {
		assert.Equal(t, run.StepStatusDone, s.Status, "step %d", i)
	}
}

// TestAHeldChainSurvivesItsDispatcher: the dispatcher holding a chain's
// first result — the second step handed out, the state not written —
// stops; the second step finishes while no dispatcher runs. The next
// dispatcher gets the second result and the first again, in whichever
// order: a second result applied before the first would be ahead of the
// run (its step not handed out in the stored state) and is handed back
// until the first is applied, not dropped. The run completes with each
// step requested once and run once.
func TestAHeldChainSurvivesItsDispatcher(t *testing.T) {
	srv, rec, st, w, stop := startHolding(t)
	ctx := ctxT(t)
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)

	runID, admitted := chain(t, ctx, srv, rec, st)
	w.gate <- struct{}{}
	dispatchedSteps(t, rec, runID, 2)
	require.Equal(t, admitted, lastStateWrite(t, js, runID), "the first result is held")
	stop()
	w.gate <- struct{}{} // the second step ends while no dispatcher runs
	stored, err := js.Stream(ctx, "AB_RUNS")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := stored.Info(ctx, jetstream.WithSubjectFilter("ab.run.default."+runID+".result.*"))
		if err != nil {
			return false
		}
		results := uint64(0)
		for _, n := range info.State.Subjects { // one subject per partition
			results += n
		}
		return results == 2
	}, 10*time.Second, time.Millisecond, "both results stored")

	startDispatcher(t, srv, dispatch.Config{RunLimits: events.RunLimits{MaxPlanParallel: 5}, ResultLinger: time.Minute, InstanceID: "second"})
	dispatchedSteps(t, rec, runID, 3)
	w.gate <- struct{}{}
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	outputs, _ := output(res)
	assert.Equal(t, map[string]any{"id": "s2", "after": "s1"}, outputs["s2"])
	assert.Equal(t, map[string]any{"id": "s3", "after": "s2"}, outputs["s3"])
	work, err := js.Stream(ctx, "AB_WORK")
	require.NoError(t, err)
	info, err := work.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), info.State.Msgs, "each step was requested once")
}
