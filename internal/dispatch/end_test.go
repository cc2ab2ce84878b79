package dispatch_test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/run"
)

// startEnding starts a server, a stack of count.hit without dispatcher,
// and a dispatcher that simulates a crash between publishing a run's end
// and writing its state whenever crash returns true. prepare runs before
// the dispatcher starts.
func startEnding(t *testing.T, crash func(runID, endType string) bool, prepare func(js jetstream.JetStream)) (*actionbustest.Stack, *hitCounter, jetstream.JetStream) {
	t.Helper()
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	counted := &hitCounter{hits: map[string]int{}}
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: counted.register})
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)
	if prepare != nil {
		prepare(js)
	}
	startDispatcher(t, srv, dispatch.Config{InstanceID: "ending"}, func(d *dispatch.Dispatcher) { dispatch.SetCrashAfterEnd(d, crash) })
	return st, counted, js
}

// storedEnds returns the terminal events stored for run runID, by type:
// what the stream holds, not what a subscriber saw (a second copy of an
// end has the first's id).
func storedEnds(t *testing.T, js jetstream.JetStream, runID string) map[string]uint64 {
	t.Helper()
	s, err := js.Stream(ctxT(t), "AB_RUNS")
	require.NoError(t, err)
	info, err := s.Info(ctxT(t), jetstream.WithSubjectFilter("ab.run.default."+runID+".*"))
	require.NoError(t, err)
	ends := map[string]uint64{}
	for subject, n := range info.State.Subjects {
		for _, typ := range []string{"completed", "failed", "canceled"} {
			if subject == "ab.run.default."+runID+"."+typ {
				ends[typ] = n
			}
		}
	}
	return ends
}

// endedState waits for the stored state of run runID to be terminal and
// returns it.
func endedState(t *testing.T, js jetstream.JetStream, runID string) run.State {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctxT(t), 20*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, bus.Topology{}.BucketRuns())
	require.NoError(t, err)
	w, err := kv.Watch(ctx, runID)
	require.NoError(t, err)
	defer func() { _ = w.Stop() }()
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				continue
			}
			var st run.State
			require.NoError(t, json.Unmarshal(e.Value(), &st))
			if st.IsTerminal() {
				return st
			}
		case <-ctx.Done():
			t.Fatalf("run %s: its state was not written ended", runID)
		}
	}
}

// waitPastTheWindow publishes a probe with message id probe to the work
// stream and returns once the stream stores it again: its duplicate window
// has passed since the call.
func waitPastTheWindow(ctx context.Context, t *testing.T, js jetstream.JetStream, probe string) {
	t.Helper()
	_, err := js.Publish(ctx, "ab.pool.nobody.request", nil, jetstream.WithMsgID(probe))
	require.NoError(t, err)
	for {
		ack, err := js.Publish(ctx, "ab.pool.nobody.request", nil, jetstream.WithMsgID(probe))
		require.NoError(t, err)
		if !ack.Duplicate {
			return
		}
	}
}

// crashWhile crashes every end of type endType while on is set.
func crashWhile(on *atomic.Bool, endType string) func(string, string) bool {
	return func(_, typ string) bool { return on.Load() && typ == endType }
}

// TestARunsEndIsPublishedBeforeItsStateAndACrashBetweenIsRepaired: the
// dispatcher publishes a run's end, then crashes before writing its state.
// The client has its result at once (the end is the commit); the result
// is redelivered, ends the run again, finds its end stored (a duplicate),
// and writes the state: the stream holds one end, the state is the
// completed run, the action ran once.
func TestARunsEndIsPublishedBeforeItsStateAndACrashBetweenIsRepaired(t *testing.T) {
	var mu sync.Mutex
	crashed := map[string]bool{}
	st, counted, js := startEnding(t, func(runID, _ string) bool {
		mu.Lock()
		defer mu.Unlock()
		first := !crashed[runID]
		crashed[runID] = true
		return first
	}, nil)
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Action: &client.ActionCall{Name: "count.hit", Args: map[string]any{"n": 1}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	stored := endedState(t, js, res.RunID)
	assert.Equal(t, run.StatusCompleted, stored.Status)
	assert.Equal(t, map[string]uint64{"completed": 1}, storedEnds(t, js, res.RunID))
	mu.Lock()
	assert.True(t, crashed[res.RunID], "the dispatcher crashed after the end")
	mu.Unlock()
	counted.mu.Lock()
	defer counted.mu.Unlock()
	for call, n := range counted.hits {
		assert.Equal(t, 1, n, "call %s ran %d times", call, n)
	}
}

// TestAStoredEndIsTheRunsEndWhateverALaterTransitionDecides: the run's
// end (completed) is published and its state never written (every
// attempt crashes); a cancel then ends the same stored state its own way.
// Its run.canceled is answered as a duplicate of the stored end, so the
// state adopts the end that is stored: the run is completed, with one end.
func TestAStoredEndIsTheRunsEndWhateverALaterTransitionDecides(t *testing.T) {
	var crashing atomic.Bool
	crashing.Store(true)
	st, _, js := startEnding(t, crashWhile(&crashing, events.TypeRunCompleted), nil)
	t.Cleanup(func() { crashing.Store(false) })
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Action: &client.ActionCall{Name: "count.hit", Args: map[string]any{"n": 1}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	require.NoError(t, st.Client.Cancel(ctxT(t), res.RunID, "too late"))
	stored := endedState(t, js, res.RunID)
	assert.Equal(t, run.StatusCompleted, stored.Status)
	assert.Equal(t, events.TypeRunCompleted, stored.Terminal.Type)
	assert.Equal(t, map[string]uint64{"completed": 1}, storedEnds(t, js, res.RunID))
}

// TestAnEndStoredLongerAgoThanTheStreamDeduplicatesIsNotStoredTwice: the
// streams deduplicate for one second; a run's end is published and its
// state not written (every attempt crashes) until the stream no longer
// deduplicates that end. Then the redelivered result and a cancel end the
// run from its stale state: each finds the stored end before publishing
// its own, so the stream still holds one end, and the state is the
// completed run.
func TestAnEndStoredLongerAgoThanTheStreamDeduplicatesIsNotStoredTwice(t *testing.T) {
	var crashing atomic.Bool
	crashing.Store(true)
	const window = time.Second
	st, _, js := startEnding(t, crashWhile(&crashing, events.TypeRunCompleted), func(js jetstream.JetStream) {
		for _, name := range []string{"AB_RUNS", "AB_TIMERS", "AB_WORK"} {
			s, err := js.Stream(ctxT(t), name)
			require.NoError(t, err)
			cfg := s.CachedInfo().Config
			cfg.Duplicates = window
			_, err = js.UpdateStream(ctxT(t), cfg)
			require.NoError(t, err)
		}
	})
	t.Cleanup(func() { crashing.Store(false) })
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Action: &client.ActionCall{Name: "count.hit", Args: map[string]any{"n": 1}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	// The work stream stops deduplicating a probe published after the end:
	// the end's own id is past the window too.
	probe := "probe-" + res.RunID
	ctx, cancel := context.WithTimeout(ctxT(t), 20*time.Second)
	defer cancel()
	waitPastTheWindow(ctx, t, js, probe)
	require.NoError(t, st.Client.Cancel(ctxT(t), res.RunID, "too late"))
	stored := endedState(t, js, res.RunID)
	assert.Equal(t, run.StatusCompleted, stored.Status)
	assert.Equal(t, map[string]uint64{"completed": 1}, storedEnds(t, js, res.RunID))
	// The redelivered result, too, ends the run from the stale state
	// before the cancel wrote it; none of them stored a second end.
	crashing.Store(false)
	assert.Equal(t, map[string]uint64{"completed": 1}, storedEnds(t, js, res.RunID))
}

// TestAnEventOnATerminalSubjectWithoutTheRunsEndIDIsNotItsEnd: the
// streams deduplicate for one second; a run waits on its action until its
// state is older than that, and a run.canceled that is not the run's (its
// id is not the run's end id, which only the dispatcher can derive) is
// stored on the run's canceled subject. When the action finishes, the
// dispatcher looks for a stored end before publishing its own (the state
// is stale): it passes over the forged one, and the run completes.
func TestAnEventOnATerminalSubjectWithoutTheRunsEndIDIsNotItsEnd(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	gate := make(chan struct{})
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "gate.wait", Description: "Wait for the test's gate."},
			func(ctx context.Context, _ map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
				select {
				case <-gate:
					return executor.Result[map[string]any]{Output: map[string]any{"ok": true}}, nil
				case <-ctx.Done():
					return executor.Result[map[string]any]{}, ctx.Err()
				}
			})
	}})
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	for _, name := range []string{"AB_RUNS", "AB_TIMERS", "AB_WORK"} {
		s, err := js.Stream(ctxT(t), name)
		require.NoError(t, err)
		cfg := s.CachedInfo().Config
		cfg.Duplicates = time.Second
		_, err = js.UpdateStream(ctxT(t), cfg)
		require.NoError(t, err)
	}
	startDispatcher(t, srv, dispatch.Config{})
	runID, err := st.Client.Start(ctxT(t), client.RunRequest{Action: &client.ActionCall{Name: "gate.wait", Args: map[string]any{}}})
	require.NoError(t, err)
	// The run's state (written at admission) is past half the window once
	// the work stream no longer deduplicates a probe published now.
	probe := "probe-" + runID
	ctx, cancel := context.WithTimeout(ctxT(t), 20*time.Second)
	defer cancel()
	waitPastTheWindow(ctx, t, js, probe)
	forger, err := bus.Open(nc, bus.BusConfig{Source: "forger"})
	require.NoError(t, err)
	_, err = forger.Emit(ctx, events.TypeRunCanceled, events.NewID(), "default", runID, "", &events.RunCanceled{RunID: runID, Reason: "forged"})
	require.NoError(t, err)
	close(gate)
	stored := endedState(t, js, runID)
	assert.Equal(t, run.StatusCompleted, stored.Status, "%+v", stored.Terminal)
	assert.Equal(t, map[string]uint64{"completed": 1, "canceled": 1}, storedEnds(t, js, runID), "the run's own end is stored beside the forged one")
}
