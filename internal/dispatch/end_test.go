package dispatch_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/run"
)

// endedState waits for the stored state of run runID to be terminal and
// returns it.
func endedState(t *testing.T, js jetstream.JetStream, runID string) run.State {
	t.Helper()
	st, err := run.DecodeState(endedEntry(t, js, runID).Value())
	require.NoError(t, err)
	return st
}

// endedEntry waits for the stored state of run runID to be terminal and
// returns its entry: a run's end may be published before its state is
// written, so a client that has the result may read the state before.
func endedEntry(t *testing.T, js jetstream.JetStream, runID string) jetstream.KeyValueEntry {
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
			st, err := run.DecodeState(e.Value())
			require.NoError(t, err)
			if st.IsTerminal() {
				return e
			}
		case <-ctx.Done():
			t.Fatalf("run %s: its state was not written ended", runID)
			return nil
		}
	}
}

// gated is an action, gate.wait, that reports each call it starts and
// finishes when the test opens its gate.
type gated struct {
	started chan struct{}
	gate    chan struct{}
}

func newGated() *gated { return &gated{started: make(chan struct{}, 8), gate: make(chan struct{})} }

func (g *gated) register(ex *executor.Executor) error {
	return executor.Register(ex, executor.Action{Name: "gate.wait", Description: "Wait for the test's gate."},
		func(ctx context.Context, _ map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
			g.started <- struct{}{}
			select {
			case <-g.gate:
				return executor.Result[map[string]any]{Output: map[string]any{"ok": true}}, nil
			case <-ctx.Done():
				return executor.Result[map[string]any]{}, ctx.Err()
			}
		})
}

// awaitStarted waits for the gated action to start.
func (g *gated) awaitStarted(t *testing.T) {
	t.Helper()
	select {
	case <-g.started:
	case <-ctxT(t).Done():
		t.Fatal("the gated action did not start")
	}
}

// lastSeq returns the stream sequence of the last message in AB_RUNS on
// any of filters (0: none).
func lastSeq(t *testing.T, js jetstream.JetStream, filters ...string) uint64 {
	t.Helper()
	msgs, err := jetstreamext.GetLastMsgsFor(ctxT(t), js, "AB_RUNS", filters)
	require.NoError(t, err)
	var last uint64
	for m, err := range msgs {
		if errors.Is(err, jetstreamext.ErrNoMessages) {
			break
		}
		require.NoError(t, err)
		last = max(last, m.Sequence)
	}
	return last
}

// awaitEnd waits for an end of run runID to be stored in AB_RUNS and
// returns its stream sequence (the first, should there be more). verbs
// are the ends to wait for: completed, failed or canceled (none: any).
func awaitEnd(t *testing.T, js jetstream.JetStream, runID string, verbs ...string) uint64 {
	t.Helper()
	if len(verbs) == 0 {
		verbs = []string{"completed", "failed", "canceled"}
	}
	var filters []string
	for _, verb := range verbs {
		filters = append(filters, events.MustSubjects("ab").StoredForms(events.DefaultTenant, runID, verb)...)
	}
	c, err := js.OrderedConsumer(ctxT(t), "AB_RUNS", jetstream.OrderedConsumerConfig{FilterSubjects: filters})
	require.NoError(t, err)
	m, err := c.Next(jetstream.FetchMaxWait(20 * time.Second))
	require.NoError(t, err, "run %s: no end stored", runID)
	md, err := m.Metadata()
	require.NoError(t, err)
	return md.Sequence.Stream
}

// partitionOf returns the partition the runs stream stores runID under.
func partitionOf(t *testing.T, js jetstream.JetStream, runID string) int {
	t.Helper()
	s, err := js.Stream(ctxT(t), "AB_RUNS")
	require.NoError(t, err)
	n, err := bus.PartitionsOf(s.CachedInfo().Config)
	require.NoError(t, err)
	return bus.RunPartition(runID, n)
}

// TestARunsEndIsPublishedBeforeItsStateAndACrashBetweenIsRepaired: the
// dispatcher publishes a run's end from a state it wrote, then crashes
// before writing the ended state. The client has its result at once (the
// end is the commit); the result is redelivered, its transition finds the
// end stored and adopts it: the stream holds one end, the state is the
// completed run, the action ran once.
func TestARunsEndIsPublishedBeforeItsStateAndACrashBetweenIsRepaired(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	counted := &hitCounter{hits: map[string]int{}}
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: counted.register})
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)
	var mu sync.Mutex
	crashed := map[string]bool{}
	startDispatcher(t, srv, dispatch.Config{InstanceID: "ending"}, func(d *dispatch.Dispatcher) {
		dispatch.SetCrashAfterEnd(d, func(runID string) bool {
			mu.Lock()
			defer mu.Unlock()
			first := !crashed[runID]
			crashed[runID] = true
			return first
		})
	})
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
	require.Len(t, counted.hits, 1)
	for call, n := range counted.hits {
		assert.Equal(t, 1, n, "call %s ran %d times", call, n)
	}
}

// TestAStoredEndIsTheRunsEndWhateverALaterTransitionDecides: the run's
// end (completed) is published and its state not written (the dispatcher
// crashes); a cancel, sent once the client has the result, ends the
// stored state, which still runs the action, its own way unless it finds
// the stored end. It does, whichever of the cancel and the redelivered
// result comes first: the run is completed, with one end.
func TestAStoredEndIsTheRunsEndWhateverALaterTransitionDecides(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	counted := &hitCounter{hits: map[string]int{}}
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: counted.register})
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)
	var once sync.Once
	startDispatcher(t, srv, dispatch.Config{InstanceID: "ending"}, func(d *dispatch.Dispatcher) {
		dispatch.SetCrashAfterEnd(d, func(string) bool {
			crash := false
			once.Do(func() { crash = true })
			return crash
		})
	})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Action: &client.ActionCall{Name: "count.hit", Args: map[string]any{"n": 1}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	require.NoError(t, st.Client.Cancel(ctxT(t), res.RunID, "too late"))
	stored := endedState(t, js, res.RunID)
	assert.Equal(t, run.StatusCompleted, stored.Status)
	assert.Equal(t, events.TypeRunCompleted, stored.Terminal.Type)
	assert.Equal(t, map[string]uint64{"completed": 1}, storedEnds(t, js, res.RunID))
}

// TestAnOwnerThatLostItsPartitionCannotPublishARunsEnd: a run's action
// is in flight when another dispatcher fences the run's partition (as a
// successor does when it takes the partition, before it reads any state).
// The action completes; the old owner's end, published before its state
// from the state it wrote under its own fence, is refused by the server,
// so no end is stored that the successor did not decide. Here the old
// owner still serves the partition: it fences again, reads the state and
// ends the run, once, after its new fence.
func TestAnOwnerThatLostItsPartitionCannotPublishARunsEnd(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	g := newGated()
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: g.register})
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)
	startDispatcher(t, srv, dispatch.Config{InstanceID: "owner"})

	runID, err := st.Client.Start(ctxT(t), client.RunRequest{Action: &client.ActionCall{Name: "gate.wait", Args: map[string]any{}}})
	require.NoError(t, err)
	g.awaitStarted(t)
	fence := events.MustSubjects("ab").Fence(partitionOf(t, js, runID))
	own := lastSeq(t, js, fence)
	require.NotZero(t, own, "the owner fenced the run's partition before its first transition")
	ack, err := js.Publish(ctxT(t), fence, []byte("successor"))
	require.NoError(t, err)
	close(g.gate)

	res, err := st.Client.Wait(ctxT(t), runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	end := awaitEnd(t, js, runID)
	endedState(t, js, runID)
	assert.Equal(t, map[string]uint64{"completed": 1}, storedEnds(t, js, runID))
	refenced := lastSeq(t, js, fence)
	assert.Greater(t, refenced, ack.Sequence, "the owner fenced the partition again")
	m, err := js.Stream(ctxT(t), "AB_RUNS")
	require.NoError(t, err)
	last, err := m.GetLastMsgForSubject(ctxT(t), fence)
	require.NoError(t, err)
	assert.Equal(t, "owner", string(last.Data))
	assert.Greater(t, end, refenced, "the end was stored after the owner's new fence, not under the one the successor superseded")
}

// TestAFenceThatAgedOutIsRenewed: the partition's fence is removed from
// the stream (it aged out with the stream's MaxAge, or an operator purged
// the subject) while a run's action is in flight. The end that expects it
// is refused; the dispatcher, which no other dispatcher fenced, publishes
// a fence again, one that expects none, and the run ends once.
func TestAFenceThatAgedOutIsRenewed(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	g := newGated()
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: g.register})
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)
	startDispatcher(t, srv, dispatch.Config{InstanceID: "owner"})

	runID, err := st.Client.Start(ctxT(t), client.RunRequest{Action: &client.ActionCall{Name: "gate.wait", Args: map[string]any{}}})
	require.NoError(t, err)
	g.awaitStarted(t)
	fence := events.MustSubjects("ab").Fence(partitionOf(t, js, runID))
	own := lastSeq(t, js, fence)
	require.NotZero(t, own)
	s, err := js.Stream(ctxT(t), "AB_RUNS")
	require.NoError(t, err)
	require.NoError(t, s.Purge(ctxT(t), jetstream.WithPurgeSubject(fence)))
	close(g.gate)

	res, err := st.Client.Wait(ctxT(t), runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	end := awaitEnd(t, js, runID)
	endedState(t, js, runID)
	assert.Equal(t, map[string]uint64{"completed": 1}, storedEnds(t, js, runID))
	renewed := lastSeq(t, js, fence)
	assert.Greater(t, renewed, own, "the fence was published again")
	info, err := s.Info(ctxT(t), jetstream.WithSubjectFilter(fence))
	require.NoError(t, err)
	assert.Equal(t, map[string]uint64{fence: 1}, info.State.Subjects, "one fence: the renewed one")
	assert.Greater(t, end, renewed)
}

// TestAnEventOnATerminalSubjectWithoutTheRunsEndIDIsNotItsEnd: a run
// waits on its action; its dispatcher is replaced (the next one reads the
// run's state, and looks for its stored end, before its first transition
// of it), and a run.canceled that is not the run's (its id is not the
// run's end id, which only the dispatcher derives) is stored on the run's
// canceled subject. When the action finishes, the new dispatcher passes
// over the forged end, and the run completes.
func TestAnEventOnATerminalSubjectWithoutTheRunsEndIDIsNotItsEnd(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	g := newGated()
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: g.register})
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	stopFirst := startDispatcher(t, srv, dispatch.Config{InstanceID: "first"})
	runID, err := st.Client.Start(ctxT(t), client.RunRequest{Action: &client.ActionCall{Name: "gate.wait", Args: map[string]any{}}})
	require.NoError(t, err)
	g.awaitStarted(t)
	stopFirst()
	startDispatcher(t, srv, dispatch.Config{InstanceID: "second"})

	forger, err := bus.Open(nc, bus.BusConfig{Source: "forger"})
	require.NoError(t, err)
	_, err = forger.Emit(ctxT(t), events.TypeRunCanceled, events.NewID(), events.DefaultTenant, runID, "", &events.RunCanceled{RunID: runID, Reason: "forged"})
	require.NoError(t, err)
	close(g.gate)
	awaitEnd(t, js, runID, "completed")
	stored := endedState(t, js, runID)
	assert.Equal(t, run.StatusCompleted, stored.Status, "%+v", stored.Terminal)
	assert.Equal(t, map[string]uint64{"completed": 1, "canceled": 1}, storedEnds(t, js, runID), "the run's own end is stored beside the forged one")
}
