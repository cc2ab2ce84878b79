package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/limits"
	"github.com/actionbus/actionbus/internal/policy"
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
// dispatcher publishes a run's end from a state it holds, then crashes.
// The client has its result at once (the end is the commit); the result
// is redelivered and meets the stored end: the stream holds one end, the
// ended state readers rebuild is the completed run with its call's
// result, the action ran once.
func TestARunsEndIsPublishedBeforeItsStateAndACrashBetweenIsRepaired(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	counted := &hitCounter{hits: map[string]int{}}
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: counted.register})
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)
	var mu sync.Mutex
	crashed := map[string]bool{}
	var d *dispatch.Dispatcher
	startDispatcher(t, srv, dispatch.Config{InstanceID: "ending"}, func(x *dispatch.Dispatcher) {
		d = x
		dispatch.SetCrashAfterEnd(x, func(runID string) bool {
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
	// The run was admitted unstored, and its completed end is its commit:
	// the crash lost what the dispatcher held, and no state is written
	// (the events that came again meet the stored end). Its ended state is
	// what readers rebuild from its request and its end.
	ended, err := dispatch.EndedState(ctxT(t), d, events.DefaultTenant, res.RunID)
	require.NoError(t, err)
	stored := *ended
	assert.Equal(t, run.StatusCompleted, stored.Status)
	assert.Equal(t, map[string]uint64{"completed": 1}, storedEnds(t, js, res.RunID))
	// The rebuild recomputed the transition that ended the run from the
	// result in the log: the state records the call's result (a retry
	// reuses what a run's state says its calls did), as the state written
	// without a crash does — its stored log replays to it.
	require.Len(t, stored.Calls, 1)
	call := stored.Calls[0]
	assert.True(t, call.Done && call.OK, "the call's result is recorded: %+v", call)
	assert.NotEmpty(t, call.Executor)
	assert.NotNil(t, call.Output)
	repairedReplaysToItsState(t, d, res)
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
	var d *dispatch.Dispatcher
	startDispatcher(t, srv, dispatch.Config{InstanceID: "ending"}, func(x *dispatch.Dispatcher) {
		d = x
		dispatch.SetCrashAfterEnd(x, func(string) bool {
			crash := false
			once.Do(func() { crash = true })
			return crash
		})
	})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Action: &client.ActionCall{Name: "count.hit", Args: map[string]any{"n": 1}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	require.NoError(t, st.Client.Cancel(ctxT(t), res.RunID, "too late"))
	// The cancel is handled (acknowledged) before the state is read.
	requestsSettled(t, js)
	ended, err := dispatch.EndedState(ctxT(t), d, events.DefaultTenant, res.RunID)
	require.NoError(t, err)
	stored := *ended
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

// TestAReadThatLacksThePartitionsLastEndIsRetriedUnderANewFence: a run's
// end is its commit (no state is written after it), so a read of a run's
// state and stored end must come from a replica that holds every end its
// dispatcher stored: one that lags (a follower of a replicated stream
// answering a direct get) would take an ended run for one still going.
// Run A ends; run B, of the same partition, waits on its action. A's end
// is taken out of the stream, as a lagging replica would not have it; B's
// state is read from the bucket again (as after a cache eviction). The
// read does not hold A's end, so it is not trusted: the dispatcher fences
// the partition again (a fence stored after every end it stored) and
// retries, and B completes, with one end. Without the removal, B's read
// is trusted at once: no new fence.
func TestAReadThatLacksThePartitionsLastEndIsRetriedUnderANewFence(t *testing.T) {
	for _, lagging := range []bool{false, true} {
		t.Run(map[bool]string{false: "a replica with the end", true: "a replica without it"}[lagging], func(t *testing.T) {
			srv := actionbustest.NewServer(t, actionbustest.Options{})
			g := newGated()
			counted := &hitCounter{hits: map[string]int{}}
			st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: func(ex *executor.Executor) error {
				return errors.Join(g.register(ex), counted.register(ex))
			}})
			js, err := jetstream.New(srv.Connect(t))
			require.NoError(t, err)
			var d *dispatch.Dispatcher
			startDispatcher(t, srv, dispatch.Config{InstanceID: "owner"}, func(x *dispatch.Dispatcher) { d = x })

			runB, err := st.Client.Start(ctxT(t), client.RunRequest{Action: &client.ActionCall{Name: "gate.wait", Args: map[string]any{}}})
			require.NoError(t, err)
			g.awaitStarted(t)
			a, err := st.Client.Run(ctxT(t), client.RunRequest{Action: &client.ActionCall{Name: "count.hit", Args: map[string]any{"n": 1}}}, nil)
			require.NoError(t, err)
			require.Equal(t, client.StatusCompleted, a.Status, "%+v", a.Error)
			require.Equal(t, partitionOf(t, js, runB), partitionOf(t, js, a.RunID))
			settled(t, js)
			fence := events.MustSubjects("ab").Fence(partitionOf(t, js, runB))
			before := lastSeq(t, js, fence)
			if lagging {
				s, err := js.Stream(ctxT(t), "AB_RUNS")
				require.NoError(t, err)
				require.NoError(t, s.Purge(ctxT(t), jetstream.WithPurgeSubject(storedEnd(t, js, a.RunID, "completed").Subject)))
			}
			dispatch.ForgetStates(d)
			close(g.gate)

			res, err := st.Client.Wait(ctxT(t), runB)
			require.NoError(t, err)
			require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
			// The client hears the end as the server takes it in, which may
			// be before the stream has stored it.
			awaitEnd(t, js, runB)
			assert.Equal(t, map[string]uint64{"completed": 1}, storedEnds(t, js, runB))
			if lagging {
				assert.Greater(t, lastSeq(t, js, fence), before, "the partition was fenced again")
			} else {
				assert.Equal(t, before, lastSeq(t, js, fence), "the read was trusted: no new fence")
			}
		})
	}
}

// TestAnEventOnATerminalSubjectWithoutTheRunsEndIDIsNotItsEnd: a run
// waits on its action; its dispatcher is replaced (the next one looks for
// the run's stored end before it admits the run again from its request,
// handed back, or reads its state before its first transition of it), and a run.canceled that is not the run's (its id is not the
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
	var second *dispatch.Dispatcher
	startDispatcher(t, srv, dispatch.Config{InstanceID: "second"}, func(d *dispatch.Dispatcher) { second = d })

	forger, err := bus.Open(nc, bus.BusConfig{Source: "forger"})
	require.NoError(t, err)
	_, err = forger.Emit(ctxT(t), events.TypeRunCanceled, events.NewID(), events.DefaultTenant, runID, "", &events.RunCanceled{RunID: runID, Reason: "forged"})
	require.NoError(t, err)
	close(g.gate)
	awaitEnd(t, js, runID, "completed")
	// The run was admitted unstored, and again by the second dispatcher
	// (its request handed back by the first): its ended state is what
	// readers rebuild.
	ended, err := dispatch.EndedState(ctxT(t), second, events.DefaultTenant, runID)
	require.NoError(t, err)
	stored := *ended
	assert.Equal(t, run.StatusCompleted, stored.Status, "%+v", stored.Terminal)
	assert.Equal(t, map[string]uint64{"completed": 1, "canceled": 1}, storedEnds(t, js, runID), "the run's own end is stored beside the forged one")
}

// lateResultAfterCrash starts a dispatcher that crashes after the first
// end it publishes first, once it has opened g's gate and the run's call,
// finishing after the end, has its result stored: that result (a late one:
// the executors were not told of the end) comes back with, or after, the
// events that ended the run.
func lateResultAfterCrash(t *testing.T, srv *actionbustest.Server, g *gated) {
	t.Helper()
	rec := srv.Record(t, "")
	var once sync.Once
	startDispatcher(t, srv, dispatch.Config{InstanceID: "ending"}, func(x *dispatch.Dispatcher) {
		dispatch.SetCrashAfterEnd(x, func(runID string) bool {
			crash := false
			once.Do(func() {
				crash = true
				close(g.gate)
				_, _ = rec.Await(ctxT(t), func(r actionbustest.Recorded) bool {
					return r.Event != nil && r.Event.Extensions()[events.ExtRunID] == runID && (r.Type() == events.TypeActionCompleted || r.Type() == events.TypeActionFailed)
				})
			})
			return crash
		})
	})
}

// TestALateResultOfACanceledRunIsNotRecordedByItsRepair: a cancel ends an
// exec run whose call is running, its end published first, and the
// dispatcher crashes before the state. The call then finishes: its result
// is stored after the run's end. Without a crash it meets the ended state
// and is refused; the repair must not record it either (it is no part of
// the transition that ended the run). The late result, a first delivery,
// usually finds the end before the cancel comes back: the end is then
// adopted on the state as read, without the cancel's step (the gap
// docs/architecture.md names), so the state is not compared with the
// log's here.
func TestALateResultOfACanceledRunIsNotRecordedByItsRepair(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	g := newGated()
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: g.register})
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)
	lateResultAfterCrash(t, srv, g)
	runID, err := st.Client.Start(ctxT(t), client.RunRequest{Action: &client.ActionCall{Name: "gate.wait", Args: map[string]any{}}})
	require.NoError(t, err)
	g.awaitStarted(t)
	require.NoError(t, st.Client.Cancel(ctxT(t), runID, "operator"))
	res, err := st.Client.Wait(ctxT(t), runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCanceled, res.Status, "%+v", res.Error)
	stored := endedState(t, js, runID)
	require.Equal(t, run.StatusCanceled, stored.Status)
	assert.Equal(t, map[string]uint64{"canceled": 1}, storedEnds(t, js, runID))
	require.Len(t, stored.Calls, 1)
	assert.False(t, stored.Calls[0].Done, "a result stored after the run's end was recorded: %+v", stored.Calls[0])
}

// TestARepairedCanceledWorkflowIsRetriedFromWhatItDid: a workflow (hit,
// then wait) is canceled while its last step runs, the dispatcher crashing
// after the end; the step's result comes after the end. Were it applied
// to the state as read, the workflow would complete there (its outputs
// moved to a terminal the stored cancel replaces) and its retry would
// reuse every step, outputs lost, running nothing. The retry reruns the
// step the run did not finish and returns both outputs.
func TestARepairedCanceledWorkflowIsRetriedFromWhatItDid(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	g := newGated()
	counted := &hitCounter{hits: map[string]int{}}
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true,
		Register: func(ex *executor.Executor) error { return errors.Join(g.register(ex), counted.register(ex)) }})
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)
	lateResultAfterCrash(t, srv, g)
	wf := client.NewWorkflow("late").
		Step("hit", "count.hit", map[string]any{"n": 1}).
		Step("wait", "gate.wait", map[string]any{"after": client.FromStep("hit", "/call")}).
		Build()
	runID, err := st.Client.Start(ctxT(t), client.RunRequest{Workflow: wf})
	require.NoError(t, err)
	g.awaitStarted(t)
	require.NoError(t, st.Client.Cancel(ctxT(t), runID, "operator"))
	res, err := st.Client.Wait(ctxT(t), runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCanceled, res.Status)
	stored := endedState(t, js, runID)
	require.Equal(t, run.StatusCanceled, stored.Status)
	require.NotNil(t, stored.Workflow)
	assert.NotEqual(t, run.StepStatusDone, stored.Workflow.Steps[1].Status, "step wait's result came after the cancel")

	retryID, err := st.Client.Retry(ctxT(t), runID)
	require.NoError(t, err)
	rres, err := st.Client.Wait(ctxT(t), retryID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, rres.Status, "%+v", rres.Error)
	out, _ := rres.Output.(map[string]any)
	byStep, _ := out["outputByStep"].(map[string]any)
	assert.NotNil(t, byStep["hit"], "the retry's output of step hit (reused)")
	assert.NotNil(t, byStep["wait"], "the retry's output of step wait (run again)")
	assert.Len(t, g.started, 1, "the retry ran step wait again")
}

// TestARepairAppliesExactlyWhatEndedTheRun: a workflow runs gate.wait and
// waits for the approval of ops.restart; a cancel ends it, its end
// published first (naming the cancel as what ended the run), and the
// dispatcher crashes before the state. A grant sent after the end may
// come back in one batch with the cancel's redelivery, before it; the
// repair applies the cancel only — the grant meets the ended state, as it
// does without a crash — and adopts the end on the state as read when
// what ended the run is not all in hand.
func TestARepairAppliesExactlyWhatEndedTheRun(t *testing.T) {
	_, rec, g, _, st, js, d, asRead := grantAndCancelSetup(t)
	wf := client.NewWorkflow("grant").
		Step("wait", "gate.wait", map[string]any{}).
		Step("restart", "ops.restart", map[string]any{"service": "api"}).
		Build()
	runID, err := st.Client.Start(ctxT(t), client.RunRequest{UserID: "operator_1", AllowedModes: []string{"read", "mutate"}, Workflow: wf})
	require.NoError(t, err)
	approvalID := awaitingApproval(t, rec, runID)
	g.awaitStarted(t)
	p, err := st.Client.Approval(ctxT(t), approvalID)
	require.NoError(t, err)
	token, err := policy.Sign("k1", approvalKey, policy.ApprovalContext(p.Context))
	require.NoError(t, err)
	require.NoError(t, st.Client.Cancel(ctxT(t), runID, "operator"))
	res, err := st.Client.Wait(ctxT(t), runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCanceled, res.Status)
	var before run.State
	select {
	case before = <-asRead:
	case <-ctxT(t).Done():
		t.Fatal("the dispatcher did not crash after the end")
	}
	stored := endedState(t, js, runID)
	assert.NotContains(t, stored.ApprovalsDone, approvalID, "the state written records no grant")

	// What the repair does with what may be in hand, from the state as
	// read: the end names the cancel.
	grant := run.Event{ID: events.NewID(), Data: &events.ApprovalGranted{RunID: runID, ApprovalID: approvalID, Token: token, Approver: "alice", Context: &p.Context}}
	cancel := run.Event{ID: events.NewID(), Data: &events.CancelRequested{RunID: runID, Reason: "operator", RequestedBy: "client"}}
	end := &run.Terminal{Type: events.TypeRunCanceled, Reason: "operator"}
	copyOf := func() *run.State {
		val, err := before.Encode()
		require.NoError(t, err)
		s, err := run.DecodeState(val)
		require.NoError(t, err)
		return &s
	}
	// (Their stored positions are made up: a repair finds an event it has
	// in hand by its position, as it finds one in the log.)
	typedGrant := dispatch.Typed{Type: events.TypeApprovalGranted, Event: grant, Pos: "AB_REQUESTS:1000001"}
	typedCancel := dispatch.Typed{Type: events.TypeCancelRequested, Event: cancel, Pos: "AB_REQUESTS:1000002"}
	endedByCancel := dispatch.EndedBy(typedCancel)
	rebuilt, kept := dispatch.Recompute(ctxT(t), d, copyOf(), end, endedByCancel, []dispatch.Typed{typedGrant, typedCancel}, events.DefaultTenant)
	require.True(t, kept, "the cancel in hand ends the run as stored")
	assert.Equal(t, run.StatusCanceled, rebuilt.Status)
	assert.NotContains(t, rebuilt.ApprovalsDone, approvalID, "a grant sent after the end is no part of what ended the run")
	_, kept = dispatch.Recompute(ctxT(t), d, copyOf(), end, endedByCancel, []dispatch.Typed{typedGrant}, events.DefaultTenant)
	assert.False(t, kept, "what ended the run is neither in hand nor in its log: the end is adopted on the state as read")
	// Another cancel of the client's under the same id, stored elsewhere
	// (another Nats-Msg-Id), is not the one that ended the run.
	early := dispatch.Typed{Type: events.TypeCancelRequested, Pos: "AB_REQUESTS:1000000",
		Event: run.Event{ID: cancel.ID, Data: &events.CancelRequested{RunID: runID, Reason: "early", RequestedBy: "client"}}}
	rebuilt, kept = dispatch.Recompute(ctxT(t), d, copyOf(), end, endedByCancel, []dispatch.Typed{early, typedCancel}, events.DefaultTenant)
	require.True(t, kept, "a cancel of the same type and id stored elsewhere was taken for the one that ended the run")
	assert.Equal(t, "operator", rebuilt.Terminal.Reason)
	// A header of an earlier release names ids (or types and ids) only:
	// nothing it names can be found, so the end is adopted.
	for _, old := range []string{cancel.ID, events.TypeCancelRequested + " " + cancel.ID} {
		_, kept = dispatch.Recompute(ctxT(t), d, copyOf(), end, old, []dispatch.Typed{typedCancel}, events.DefaultTenant)
		assert.False(t, kept, "a name without a position was trusted: %s", old)
	}

	// What the run's stored end names is in its log: with nothing in hand
	// (the republisher; a late first delivery that finds the end before
	// the redelivery), the repair reads it from there.
	endedBy := storedEndedBy(t, js, runID)
	require.NotEmpty(t, endedBy, "the end published first names the events that ended the run")
	rebuilt, kept = dispatch.Recompute(ctxT(t), d, copyOf(), end, endedBy, nil, events.DefaultTenant)
	require.True(t, kept, "the events that ended the run are read from its log")
	assert.Equal(t, run.StatusCanceled, rebuilt.Status)
	assert.NotContains(t, rebuilt.ApprovalsDone, approvalID, "the grant, also in the log, is no part of what ended the run")
	// A client's input in hand that reuses an id the end names is passed
	// over: the named events are read from the log all the same.
	forged := dispatch.Typed{Type: events.TypeInputProvided, Pos: "AB_REQUESTS:1000003", Event: run.Event{ID: endedByIDs(endedBy)[0], Data: &events.InputProvided{RunID: runID, Answer: "x", ProvidedBy: "client"}}}
	rebuilt, kept = dispatch.Recompute(ctxT(t), d, copyOf(), end, endedBy, []dispatch.Typed{forged}, events.DefaultTenant)
	require.True(t, kept, "an input reusing a named id was taken for the event that ended the run")
	assert.Equal(t, run.StatusCanceled, rebuilt.Status)
	_, kept = dispatch.Recompute(ctxT(t), d, copyOf(), &run.Terminal{Type: events.TypeRunCanceled, Reason: "another"}, endedByCancel, []dispatch.Typed{typedCancel}, events.DefaultTenant)
	assert.False(t, kept, "a copy that ends otherwise is not kept")
}

// endedByIDs returns the event ids an Ab-Ended-By header names, in
// order.
func endedByIDs(header string) []string {
	var ids []string
	for _, name := range strings.Split(header, ",") {
		if f := strings.Fields(name); len(f) > 1 {
			ids = append(ids, f[1])
		}
	}
	return ids
}

// storedEndedBy returns what the stored end of run runID names as the
// events that ended it (its Ab-Ended-By header).
func storedEndedBy(t *testing.T, js jetstream.JetStream, runID string) string {
	t.Helper()
	s, err := js.Stream(ctxT(t), "AB_RUNS")
	require.NoError(t, err)
	info, err := s.Info(ctxT(t), jetstream.WithSubjectFilter("ab.run.default."+runID+".>"))
	require.NoError(t, err)
	for subject := range info.State.Subjects {
		switch events.MustSubjects("ab").Canonical(subject) {
		case "ab.run.default." + runID + ".completed", "ab.run.default." + runID + ".failed", "ab.run.default." + runID + ".canceled":
			m, err := s.GetLastMsgForSubject(ctxT(t), subject)
			require.NoError(t, err)
			if h := m.Header.Get("Ab-Ended-By"); h != "" {
				return h
			}
		}
	}
	return ""
}

// A reader of a run that has not ended — a retry naming it, a replay —
// waits a moment for an end on its way (a client may hear an end before
// the stream stores it) and is then told the run has not ended.
func TestARunThatHasNotEndedIsNeitherRetriedNorReplayed(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	g := newGated()
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: g.register})
	t.Cleanup(func() { close(g.gate) }) // before the stack stops
	var d *dispatch.Dispatcher
	startDispatcher(t, srv, dispatch.Config{InstanceID: "reader"}, func(x *dispatch.Dispatcher) { d = x })
	running, err := st.Client.Start(ctxT(t), client.RunRequest{Action: &client.ActionCall{Name: "gate.wait", Args: map[string]any{}}})
	require.NoError(t, err)
	g.awaitStarted(t)
	// The admission hands its work out while it writes the state: the
	// action may start before the state is stored.
	admitted(t, ctxT(t), srv, running)

	_, err = d.ReplayLog(ctxT(t), "default", running)
	require.ErrorContains(t, err, "has not ended")

	res, err := st.Client.Run(ctxT(t), client.RunRequest{RetryOf: running, Action: &client.ActionCall{Name: "gate.wait", Args: map[string]any{}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	require.NotNil(t, res.Error)
	assert.Equal(t, actionbus.CodeRetryRefused, res.Error.Code)
	assert.Contains(t, res.Error.Message, "is running")

	// What a reader waits for is bounded, and tells one tenant nothing of
	// another's runs. Each reader below has less time than a wait for an
	// end in flight takes (500 ms): one that waits fails with its
	// context's error instead of answering.
	short := func() context.Context {
		ctx, cancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}
	// Another tenant's running run is no run, told without waiting for
	// its end (a wait would tell it from a missing one by its time).
	prior, err := dispatch.PriorRun(short(), d, "acme", running)
	require.NoError(t, err, "a retry of tenant acme naming the default tenant's running run waited for its end")
	assert.Nil(t, prior, "another tenant's run is no run")
	_, err = d.ReplayLog(short(), "acme", running)
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "a replay of another tenant's run is one of no run")
	// Only a few readers wait at once (each holds a handler and a run's
	// lock, and a client may ask as often as it likes): beyond them, a
	// run that looks unended is answered as it is, at once.
	release := dispatch.HoldEndWaits(d, dispatch.MaxEndWaits)
	prior, err = dispatch.PriorRun(short(), d, "default", running)
	release()
	require.NoError(t, err, "a reader waited for an end although as many readers as are allowed were waiting")
	require.NotNil(t, prior)
	assert.Equal(t, run.StatusRunning, prior.Status)
}

// grantAndCancelSetup starts a server, the recorder, a stack with a gated
// action and ops.restart (approval key k1), and a dispatcher that crashes
// after publishing the first run end it publishes first, handing the
// state it read then to asRead.
func grantAndCancelSetup(t *testing.T) (*actionbustest.Server, *actionbustest.Recorder, *gated, *opsActions, *actionbustest.Stack, jetstream.JetStream, *dispatch.Dispatcher, <-chan run.State) {
	t.Helper()
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "")
	g := newGated()
	t.Cleanup(func() { close(g.gate) })
	ops := &opsActions{}
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, ApprovalKeys: approvalKeys(),
		Register: func(ex *executor.Executor) error { return errors.Join(g.register(ex), ops.register(ex)) }})
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)
	kv, err := js.KeyValue(ctxT(t), bus.Topology{}.BucketRuns())
	require.NoError(t, err)
	var once sync.Once
	asRead := make(chan run.State, 1)
	var d *dispatch.Dispatcher
	startDispatcher(t, srv, dispatch.Config{InstanceID: "ending", ApprovalKeys: policy.Keys{"k1": {Secret: approvalKey, Holder: "alice"}}}, func(x *dispatch.Dispatcher) {
		d = x
		dispatch.SetCrashAfterEnd(x, func(runID string) bool {
			crash := false
			once.Do(func() {
				crash = true
				if e, err := kv.Get(ctxT(t), runID); err == nil {
					if s, err := run.DecodeState(e.Value()); err == nil {
						asRead <- s
					}
				}
			})
			return crash
		})
	})
	return srv, rec, g, ops, st, js, d, asRead
}

// TestRebuildingACompletedRunsEndStoresNoArtifactAgain: a workflow whose
// step returns an output too large to keep inline has it put to the
// artifact store by the transition that takes the result — here the one
// that completes the run, whose end is its commit (no ended state is
// written). A reader that needs the ended state (a retry's PriorRun, a
// replay) applies that transition again; it reaches the same reference
// and stores nothing: the object store's stream has no new message.
func TestRebuildingACompletedRunsEndStoresNoArtifactAgain(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	var d *dispatch.Dispatcher
	startDispatcher(t, srv, dispatch.Config{}, func(x *dispatch.Dispatcher) { d = x })
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "wf.big"}, func(_ context.Context, _ map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
			return executor.Result[map[string]any]{Output: map[string]any{"blob": strings.Repeat("b", 2*events.DefaultInlineOutputBytes)}}, nil
		})
	}})
	ctx := ctxT(t)
	res, err := st.Client.Run(ctx, client.RunRequest{Workflow: client.NewWorkflow("big").Step("s0", "wf.big", nil).Build()}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	kv, err := srv.JS.KeyValue(ctx, "ab_runs")
	require.NoError(t, err)
	// The run's end is its commit: the state stored, if any (a run admitted
	// unstored that completes within the alarm's delay has none), is the
	// one before it.
	if entry, err := kv.Get(ctx, res.RunID); err == nil {
		asStored, err := run.DecodeState(entry.Value())
		require.NoError(t, err)
		require.False(t, asStored.IsTerminal(), "the run's end is its commit: the state stored is the one before it")
	} else {
		require.ErrorIs(t, err, jetstream.ErrKeyNotFound)
	}

	objects, err := srv.JS.Stream(ctx, "OBJ_"+bus.Topology{}.BucketArtifacts())
	require.NoError(t, err)
	before, err := objects.Info(ctx)
	require.NoError(t, err)
	require.NotZero(t, before.State.LastSeq, "the completing transition stored the step's output")

	ended, err := dispatch.EndedState(ctx, d, "", res.RunID)
	require.NoError(t, err)
	require.True(t, ended.IsTerminal())
	stepOutput := func(st *run.State) any { // as stored: encoded and decoded again
		b, err := st.Encode()
		require.NoError(t, err)
		decoded, err := run.DecodeState(b)
		require.NoError(t, err)
		out, _ := decoded.Terminal.Output.(map[string]any)
		byStep, _ := out["outputByStep"].(map[string]any)
		return byStep["s0"]
	}
	ref, ok := stepOutput(ended).(map[string]any)["artifact"].(map[string]any)
	require.True(t, ok, "the rebuilt end keeps the step's output by reference: %v", stepOutput(ended))
	data, _, err := st.Client.Artifact(ctx, ref["id"].(string))
	require.NoError(t, err, "the reference the rebuild computed is the one stored")
	assert.Len(t, data, int(ref["bytes"].(float64)))

	replayed, err := d.ReplayLog(ctx, "default", res.RunID)
	require.NoError(t, err)
	assert.Equal(t, stepOutput(ended), stepOutput(replayed.Replayed), "a replay reaches the same reference")

	after, err := objects.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, before.State.LastSeq, after.State.LastSeq, "a reader stored the artifact again")
}

// TestARebuildTakesNoRateTokenOrSlot: a rebuild applies a run's ending
// transition again; a call that transition dispatched under a limit took
// its slot or token when it was first applied. The rebuild's grant
// (frozenEnv) names the same key and takes nothing: the limits bucket is
// not written, and every token is still there for the calls after.
func TestARebuildTakesNoRateTokenOrSlot(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	const name = "lim.once"
	var d *dispatch.Dispatcher
	limit := limits.Spec{Key: "{{.tenant}}", Rate: &limits.Rate{Limit: 2, PerMs: time.Hour.Milliseconds(), Burst: 2}}
	startDispatcher(t, srv, dispatch.Config{Policy: &policy.Config{Limits: map[string]limits.Spec{name: limit}}}, func(x *dispatch.Dispatcher) { d = x })
	srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: name}, func(context.Context, map[string]any, executor.Call) (executor.Result[map[string]any], error) {
			return executor.Result[map[string]any]{Output: map[string]any{}}, nil
		})
	}})
	ctx := ctxT(t)
	rs := &run.State{RunID: events.NewID(), Tenant: "default"}
	call := func(i int) run.CallState { return run.CallState{CallID: fmt.Sprintf("call-%d", i), Action: name} }
	// The executor's announcement reaches the dispatcher's catalog view
	// (asking frozen takes nothing, so asking until it is there is harmless).
	require.Eventually(t, func() bool {
		_, err := dispatch.Acquire(ctx, d, true, rs, call(0))
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "the action is not in the dispatcher's catalog")

	bucket, err := srv.JS.Stream(ctx, "KV_"+bus.Topology{}.BucketLimits())
	require.NoError(t, err)
	before, err := bucket.Info(ctx)
	require.NoError(t, err)
	for i := range 3 {
		c, err := dispatch.Acquire(ctx, d, true, rs, call(i))
		require.NoError(t, err)
		assert.True(t, c.OK, "a rebuild grants the call its writer was granted")
		assert.Equal(t, name+"|default", c.Key, "under its limit's key")
	}
	after, err := bucket.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, before.State.LastSeq, after.State.LastSeq, "a rebuild wrote to the limits bucket")

	// Both tokens are still there, and they are the last.
	for i, want := range []bool{true, true, false} {
		c, err := dispatch.Acquire(ctx, d, false, rs, call(10+i))
		require.NoError(t, err)
		assert.Equal(t, want, c.OK, "call %d: two tokens an hour, none of them taken by a rebuild", i)
	}
}
