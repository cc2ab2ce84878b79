package dispatch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/run"
)

// stateWrites is how many writes the runs bucket ever stored.
func stateWrites(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	s, err := js.Stream(ctxT(t), "KV_"+bus.Topology{}.BucketRuns())
	require.NoError(t, err)
	info, err := s.Info(ctxT(t))
	require.NoError(t, err)
	return info.State.LastSeq
}

// TestARunThatCompletesWithinItsAlarmDelayIsNeverStored: a one-action run
// admitted on its request's first delivery stores no state: its work goes
// out, its result completes it, and its end is its commit. The runs
// bucket stores nothing for it, yet every reader of its state has it: the
// ended state rebuilt from its request and its end (a retry's PriorRun,
// the replay, whose log reaches the same state).
func TestARunThatCompletesWithinItsAlarmDelayIsNeverStored(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	counted := &hitCounter{hits: map[string]int{}}
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: counted.register})
	var d *dispatch.Dispatcher
	startDispatcher(t, srv, dispatch.Config{InstanceID: "unstored", AlarmDelay: time.Minute}, func(x *dispatch.Dispatcher) { d = x })
	ctx := ctxT(t)
	before := stateWrites(t, srv.JS)
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "count.hit", Args: map[string]any{"n": 7}}, UserID: "u1"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, before, stateWrites(t, srv.JS), "the runs bucket stored nothing for the run")
	kv, err := srv.JS.KeyValue(ctx, bus.Topology{}.BucketRuns())
	require.NoError(t, err)
	_, err = kv.Get(ctx, res.RunID)
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound)
	assert.Equal(t, map[string]uint64{"completed": 1}, storedEnds(t, srv.JS, res.RunID))
	assert.Equal(t, 1, counted.total())

	ended, err := dispatch.EndedState(ctx, d, events.DefaultTenant, res.RunID)
	require.NoError(t, err)
	assert.Equal(t, run.StatusCompleted, ended.Status)
	assert.Equal(t, run.KindExec, ended.Kind)
	assert.Equal(t, "u1", ended.UserID)
	assert.Equal(t, res.Output, asJSON(t, ended.Terminal.Output), "the rebuilt end is the stored one")

	prior, err := dispatch.PriorRun(ctx, d, events.DefaultTenant, res.RunID)
	require.NoError(t, err)
	require.NotNil(t, prior, "a retry finds the run")
	assert.Equal(t, run.StatusCompleted, prior.Status)
	other, err := dispatch.PriorRun(ctx, d, "acme", res.RunID)
	require.NoError(t, err)
	assert.Nil(t, other, "another tenant finds no such run")

	// The replay reaches the rebuilt state (an ended state rebuilt, as a
	// repair's, publishes nothing: outboxes are not compared).
	repairedReplaysToItsState(t, d, res)
}

// asJSON is v encoded and decoded again, as a client reads it.
func asJSON(t *testing.T, v any) any {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	var out any
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

// TestARunOutlivingItsAlarmDelayIsStoredWhenItsAlarmIsArmed: a run
// admitted unstored whose action outlasts Config.AlarmDelay is created in
// the bucket, as admitted, before its alarm is armed; it then ends as any
// stored run.
func TestARunOutlivingItsAlarmDelayIsStoredWhenItsAlarmIsArmed(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	g := newGated()
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: g.register})
	startDispatcher(t, srv, dispatch.Config{InstanceID: "outliving", AlarmDelay: 200 * time.Millisecond})
	ctx := ctxT(t)
	runID, err := st.Client.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: "gate.wait", Args: map[string]any{}}})
	require.NoError(t, err)
	g.awaitStarted(t)
	kv, err := srv.JS.KeyValue(ctx, bus.Topology{}.BucketRuns())
	require.NoError(t, err)
	w, err := kv.Watch(ctx, runID)
	require.NoError(t, err)
	defer func() { _ = w.Stop() }()
	var stored run.State
	for e := range w.Updates() {
		if e != nil {
			stored, err = run.DecodeState(e.Value())
			require.NoError(t, err)
			break
		}
	}
	assert.Equal(t, run.StatusRunning, stored.Status, "created as admitted")
	assert.Equal(t, runID, stored.RunID)
	// Its alarm is armed: a schedule of the run is stored.
	require.Eventually(t, func() bool {
		s, err := srv.JS.Stream(ctx, "AB_TIMERS")
		if err != nil {
			return false
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter("ab.run.default."+runID+".>"))
		return err == nil && info.State.Msgs > 0
	}, 10*time.Second, 20*time.Millisecond, "the alarm is armed after the state is created")
	close(g.gate)
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	assert.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
}

// TestAnEventForARunThatCompletedUnstoredIsAcknowledged: a cancel sent
// after a run completed without a state stored meets the ended run: it is
// acknowledged at once, not handed back until its deliveries run out as
// an event of a run whose request may still be on its way.
func TestAnEventForARunThatCompletedUnstoredIsAcknowledged(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	counted := &hitCounter{hits: map[string]int{}}
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: counted.register})
	startDispatcher(t, srv, dispatch.Config{InstanceID: "late-cancel", AlarmDelay: time.Minute})
	ctx := ctxT(t)
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "count.hit", Args: map[string]any{"n": 1}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	require.NoError(t, st.Client.Cancel(ctx, res.RunID, "too late"))
	stored := storedCount(t, srv.JS, "AB_REQUESTS")
	cons, err := srv.JS.Consumer(ctx, "AB_REQUESTS", "dispatcher-requests-p0")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.AckFloor.Stream >= stored && info.NumRedelivered == 0
	}, 5*time.Second, 20*time.Millisecond, "the cancel was acknowledged on its first delivery")
	assert.Equal(t, map[string]uint64{"completed": 1}, storedEnds(t, srv.JS, res.RunID))
}

// TestARejectedRequestOnALiveUnstoredRunsSubjectDoesNotEndIt: junk sent
// as a run.requested on the subject of a run that is running unstored
// (no state in the bucket) is rejected and leaves the run alone; junk on
// a subject no run has creates that run failed, so that whoever waits on
// the id learns why.
func TestARejectedRequestOnALiveUnstoredRunsSubjectDoesNotEndIt(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	g := newGated()
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: g.register})
	startDispatcher(t, srv, dispatch.Config{InstanceID: "junk", AlarmDelay: time.Minute})
	ctx := ctxT(t)
	runID, err := st.Client.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: "gate.wait", Args: map[string]any{}}})
	require.NoError(t, err)
	g.awaitStarted(t)
	nc := srv.Connect(t)
	junk := func(id string) {
		t.Helper()
		msg := &nats.Msg{Subject: "ab.run.default." + id + ".requested", Header: nats.Header{}, Data: []byte(`{"not":"a request"}`)}
		msg.Header.Set(jetstream.MsgIDHeader, events.NewID())
		msg.Header.Set("ce-specversion", "1.0")
		msg.Header.Set("ce-type", events.TypeRunRequested)
		msg.Header.Set("ce-source", "/junk")
		msg.Header.Set("ce-id", events.NewID())
		_, err := nc.RequestMsg(msg, 5*time.Second)
		require.NoError(t, err)
	}
	rejectedBefore := storedCount(t, srv.JS, "AB_REJECTED")
	junk(runID)
	require.Eventually(t, func() bool { return storedCount(t, srv.JS, "AB_REJECTED") > rejectedBefore }, 10*time.Second, 20*time.Millisecond)

	// A run never requested, with junk for its request, fails.
	other := events.NewID()
	junk(other)
	failed, err := st.Client.Wait(ctx, other)
	require.NoError(t, err)
	assert.Equal(t, client.StatusFailed, failed.Status)

	close(g.gate)
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	assert.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, map[string]uint64{"completed": 1}, storedEnds(t, srv.JS, runID))
}

// requestsSettled waits until the dispatcher's requests consumer has
// acknowledged everything stored in the requests stream.
func requestsSettled(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	ctx := ctxT(t)
	cons, err := js.Consumer(ctx, "AB_REQUESTS", "dispatcher-requests-p0")
	require.NoError(t, err)
	stored := storedCount(t, js, "AB_REQUESTS")
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.AckFloor.Stream >= stored && info.NumAckPending == 0
	}, 20*time.Second, 20*time.Millisecond)
}

// junkRequest stores junk as a run.requested on run id's subject.
func junkRequest(t *testing.T, nc *nats.Conn, id string) {
	t.Helper()
	msg := &nats.Msg{Subject: "ab.run.default." + id + ".requested", Header: nats.Header{}, Data: []byte(`{"not":"a request"}`)}
	msg.Header.Set(jetstream.MsgIDHeader, events.NewID())
	msg.Header.Set("ce-specversion", "1.0")
	msg.Header.Set("ce-type", events.TypeRunRequested)
	msg.Header.Set("ce-source", "/junk")
	msg.Header.Set("ce-id", events.NewID())
	_, err := nc.RequestMsg(msg, 5*time.Second)
	require.NoError(t, err)
}

// TestReadersRebuildAnUnstoredRunFromTheRequestThatAdmittedIt: a client
// stores another request for its completed run (another user, a body the
// machine would refuse), then junk on its subject. Nothing runs again,
// and every reader still tells the run from the request that admitted it
// — the first — and its end: the ended state, a retry's prior run, the
// listing.
func TestReadersRebuildAnUnstoredRunFromTheRequestThatAdmittedIt(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	counted := &hitCounter{hits: map[string]int{}}
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: counted.register})
	var d *dispatch.Dispatcher
	startDispatcher(t, srv, dispatch.Config{InstanceID: "first-request", AlarmDelay: time.Minute}, func(x *dispatch.Dispatcher) { d = x })
	ctx := ctxT(t)
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "count.hit", Args: map[string]any{"n": 7}}, UserID: "u1"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status)
	kv, err := srv.JS.KeyValue(ctx, bus.Topology{}.BucketRuns())
	require.NoError(t, err)
	_, err = kv.Get(ctx, res.RunID)
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "completed unstored")

	readers := func(t *testing.T) {
		t.Helper()
		ended, err := dispatch.EndedState(ctx, d, events.DefaultTenant, res.RunID)
		require.NoError(t, err)
		assert.Equal(t, "u1", ended.UserID, "the ended state names the admitted request's user")
		assert.Equal(t, run.StatusCompleted, ended.Status)
		prior, err := dispatch.PriorRun(ctx, d, events.DefaultTenant, res.RunID)
		require.NoError(t, err)
		require.NotNil(t, prior, "a retry finds the run")
		assert.Equal(t, run.StatusCompleted, prior.Status)
		list, err := dispatch.UnstoredRuns(ctx, srv.JS, kv, bus.Topology{}, func(string) bool { return false })
		require.NoError(t, err)
		found := false
		for _, s := range list {
			if s.RunID == res.RunID {
				found = true
				assert.Equal(t, "u1", s.UserID, "the listing names the admitted request's user")
				assert.Equal(t, run.StatusCompleted, s.Status)
			}
		}
		assert.True(t, found, "the listing has the run")
	}

	eb, err := bus.Open(srv.Connect(t), bus.BusConfig{Prefix: "ab", Source: "/client"})
	require.NoError(t, err)
	_, err = eb.Emit(ctx, events.TypeRunRequested, events.NewID(), events.DefaultTenant, res.RunID, "",
		&events.RunRequested{RunID: res.RunID, UserID: "mallory", Action: &events.ActionCall{Name: "count.hit", Args: map[string]any{"n": 99}},
			Workspace: map[string]string{"a.md": "x"}})
	require.NoError(t, err)
	requestsSettled(t, srv.JS)
	assert.Equal(t, 1, counted.total(), "nothing ran again")
	readers(t)

	junkRequest(t, srv.Connect(t), res.RunID)
	requestsSettled(t, srv.JS)
	readers(t)
	assert.Equal(t, map[string]uint64{"completed": 1}, storedEnds(t, srv.JS, res.RunID))
}

// failing registers fail.now, which fails at once.
func failing(ex *executor.Executor) error {
	return executor.Register(ex, executor.Action{Name: "fail.now", Description: "Fail."},
		func(context.Context, map[string]any, executor.Call) (executor.Result[map[string]any], error) {
			return executor.Result[map[string]any]{}, actionbus.Errorf("flaky", "fails")
		})
}

// TestAFailedRunWhoseDispatcherDiesAfterItsEndIsStoredAndRetried: a run
// admitted unstored fails; its end is published, and its dispatcher dies
// before the ended state — which a failed run must have stored, for its
// retry — is written, losing the run it held. Its request, delivered
// again, finds the end and writes the ended state from it; the run can
// then be claimed and retried, and the retry ends.
func TestAFailedRunWhoseDispatcherDiesAfterItsEndIsStoredAndRetried(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{AckWait: time.Second})
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: failing})
	var d *dispatch.Dispatcher
	first := onceEach()
	startDispatcher(t, srv, dispatch.Config{InstanceID: "dies-after-end", AlarmDelay: time.Minute}, func(x *dispatch.Dispatcher) {
		d = x
		dispatch.SetCrashAfterEnd(x, first)
	})
	ctx := ctxT(t)
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "fail.now", Args: map[string]any{}}, UserID: "u1"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	kv, err := srv.JS.KeyValue(ctx, bus.Topology{}.BucketRuns())
	require.NoError(t, err)
	w, err := kv.Watch(ctx, res.RunID)
	require.NoError(t, err)
	defer func() { _ = w.Stop() }()
	for e := range w.Updates() {
		if e == nil {
			continue
		}
		stored, err := run.DecodeState(e.Value())
		require.NoError(t, err)
		if stored.IsTerminal() {
			assert.Equal(t, run.StatusFailed, stored.Status)
			break
		}
	}
	assert.Equal(t, map[string]uint64{"failed": 1}, storedEnds(t, srv.JS, res.RunID))

	retryID, err := dispatch.ClaimRetry(ctx, d, res.RunID, events.NewID())
	require.NoError(t, err, "a failed run can be claimed by its retry")
	assert.NotEmpty(t, retryID)
}

// TestARequestStoredAgainAfterItAgedOutDoesNotRunItsRunAgain: a run that
// outlived its alarm delay is stored; its request ages out of the
// requests stream (retention shortened here) while its state is kept, and
// the same request is stored again past the duplicate windows. That
// request is the run's first message in the requests stream, but the run
// is in the bucket: nothing is handed out, and the run ends once.
func TestARequestStoredAgainAfterItAgedOutDoesNotRunItsRunAgain(t *testing.T) {
	// Short windows that still cover twice the ack wait: admissions hand
	// their work out early.
	const window = 3 * time.Second
	srv := actionbustest.NewServer(t, actionbustest.Options{AckWait: time.Second, DuplicateWindow: window})
	ctx := ctxT(t)
	g := newGated()
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: g.register})
	startDispatcher(t, srv, dispatch.Config{InstanceID: "aged-out", AlarmDelay: 100 * time.Millisecond})
	runID := events.NewID()
	req := client.RunRequest{RunID: runID, Action: &client.ActionCall{Name: "gate.wait", Args: map[string]any{}}, UserID: "u1"}
	_, err := st.Client.Start(ctx, req)
	require.NoError(t, err)
	g.awaitStarted(t)
	kv, err := srv.JS.KeyValue(ctx, bus.Topology{}.BucketRuns())
	require.NoError(t, err)
	require.Eventually(t, func() bool { _, err := kv.Get(ctx, runID); return err == nil }, 10*time.Second, 20*time.Millisecond,
		"it outlived its alarm delay: its state is stored")
	close(g.gate)
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status)
	requestsSettled(t, srv.JS)

	// The request ages out of the requests stream; state and end remain.
	s, err := srv.JS.Stream(ctx, "AB_REQUESTS")
	require.NoError(t, err)
	cfg := s.CachedInfo().Config
	cfg.MaxAge, cfg.Duplicates = time.Second, time.Second
	_, err = srv.JS.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	agedAt := time.Now()
	require.Eventually(t, func() bool {
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs == 0 && time.Since(agedAt) > 2*window
	}, 20*time.Second, 50*time.Millisecond, "the request aged out, and the duplicate windows passed")
	_, err = kv.Get(ctx, runID)
	require.NoError(t, err, "the state is still stored")

	// The same request, stored again (a client's retried publish).
	_, err = st.Client.Start(ctx, req)
	require.NoError(t, err)
	requestsSettled(t, srv.JS)
	assert.EqualValues(t, 1, storedCount(t, srv.JS, "AB_WORK"), "no work item was handed out again")
	assert.Equal(t, map[string]uint64{"completed": 1}, storedEnds(t, srv.JS, runID), "the run ended once")
}

// TestAHeldRequestDeliveredAgainWhileHeldStoresItsRun: with an alarm
// delay longer than the requests consumer's ack wait, the held request of
// a run admitted unstored is delivered again while it is held. That
// delivery, acknowledged, must not leave the run unstored: it stores the
// run as admitted first. The dispatcher then stops; the next one
// completes the run.
func TestAHeldRequestDeliveredAgainWhileHeldStoresItsRun(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{AckWait: time.Second})
	g := newGated()
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: g.register})
	stop := startDispatcher(t, srv, dispatch.Config{InstanceID: "held-long", AlarmDelay: time.Minute})
	ctx := ctxT(t)
	runID, err := st.Client.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: "gate.wait", Args: map[string]any{}}})
	require.NoError(t, err)
	g.awaitStarted(t)
	kv, err := srv.JS.KeyValue(ctx, bus.Topology{}.BucketRuns())
	require.NoError(t, err)
	require.Eventually(t, func() bool { _, err := kv.Get(ctx, runID); return err == nil }, 20*time.Second, 20*time.Millisecond,
		"the request delivered again while held stored the run")
	stop()
	startDispatcher(t, srv, dispatch.Config{InstanceID: "held-long-next", AlarmDelay: time.Minute})
	close(g.gate)
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err, "the run survives its dispatcher's stop")
	assert.Equal(t, client.StatusCompleted, res.Status)
}

// withOther registers what register does and count.other, which counts
// its calls in others: the action of a second request for a run.
func withOther(register func(*executor.Executor) error, others *atomic.Int32) func(*executor.Executor) error {
	return func(ex *executor.Executor) error {
		if err := register(ex); err != nil {
			return err
		}
		return executor.Register(ex, executor.Action{Name: "count.other", Description: "Count another hit."},
			func(context.Context, map[string]any, executor.Call) (executor.Result[map[string]any], error) {
				others.Add(1)
				return executor.Result[map[string]any]{Output: map[string]any{"other": true}}, nil
			})
	}
}

// TestASecondRequestForARunHeldUnstoredIsNotWhatItIsAdmittedFrom: while a
// run admitted unstored is held, its client stores a second, different
// request for it (another action, under another message id), and the
// dispatcher dies holding the run: the second request is delivered before
// the first comes again. The run is admitted again from its first request,
// as readers rebuild it: it completes with the output of the call the
// first handed out, that call ran once, the second's action never ran,
// and the run read back names the first request's action.
func TestASecondRequestForARunHeldUnstoredIsNotWhatItIsAdmittedFrom(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	counted := &hitCounter{hits: map[string]int{}}
	var others atomic.Int32
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: withOther(counted.register, &others)})
	ctx := ctxT(t)
	runID := events.NewID()
	eb, err := bus.Open(srv.Connect(t), bus.BusConfig{Prefix: "ab", Source: "/client"})
	require.NoError(t, err)
	crashed := onceEach()
	var d *dispatch.Dispatcher
	startDispatcher(t, srv, dispatch.Config{InstanceID: "holder"}, func(x *dispatch.Dispatcher) {
		d = x
		dispatch.SetCrashHandingOut(d, func(id string) bool {
			if id != runID || !crashed(id) {
				return false
			}
			// The first request's work is handed out; the client stores
			// another request for the run now, delivered while this
			// handler still holds the run.
			_, err := eb.Emit(ctx, events.TypeRunRequested, events.NewID(), events.DefaultTenant, runID, "",
				&events.RunRequested{RunID: runID, Action: &events.ActionCall{Name: "count.other", Args: map[string]any{}}})
			return assert.NoError(t, err, "the second request is stored")
		})
	})
	_, err = st.Client.Start(ctx, client.RunRequest{RunID: runID, Action: &client.ActionCall{Name: "count.hit", Args: map[string]any{}}})
	require.NoError(t, err)
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Contains(t, fmt.Sprint(res.Output), "call", "the output is the first request's call's")
	assert.Equal(t, 1, counted.total(), "the first request's call ran once")
	assert.Zero(t, others.Load(), "the second request's action never ran")
	ended, err := dispatch.EndedState(ctx, d, events.DefaultTenant, runID)
	require.NoError(t, err)
	require.Len(t, ended.Calls, 1)
	assert.Equal(t, "count.hit", ended.Calls[0].Action, "the run read back is the first request's")
}

// TestARunsMarkedFirstRequestIsAdmittedWithoutReadingTheRequestsStream:
// the ingress marks a run's request stored as the run's first message, so
// its admission without a state write reads nothing of the requests
// stream: no direct get is asked of it while runs are admitted, and none
// of them is stored.
func TestARunsMarkedFirstRequestIsAdmittedWithoutReadingTheRequestsStream(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	counted := &hitCounter{hits: map[string]int{}}
	st := srv.StartStack(t, actionbustest.StackOptions{NoPlanner: true, Register: counted.register})
	ctx := ctxT(t)
	_, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "count.hit", Args: map[string]any{}}}, nil)
	require.NoError(t, err, "warm")
	watcher := srv.Connect(t)
	gets := make(chan *nats.Msg, 64)
	for _, subject := range []string{"$JS.API.DIRECT.GET.AB_REQUESTS", "$JS.API.DIRECT.GET.AB_REQUESTS.>"} {
		sub, err := watcher.ChanSubscribe(subject, gets)
		require.NoError(t, err)
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	require.NoError(t, watcher.Flush())
	writes := stateWrites(t, srv.JS)
	const runs = 5
	for range runs {
		res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "count.hit", Args: map[string]any{}}}, nil)
		require.NoError(t, err)
		require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	}
	require.NoError(t, watcher.Flush())
	assert.Zero(t, len(gets), "direct gets of the requests stream while the runs were admitted")
	assert.Equal(t, writes, stateWrites(t, srv.JS), "the runs were admitted without a state write")
	assert.Equal(t, runs+1, counted.total())
}

// TestAnEndFoundByASecondRequestIsCommittedFromTheFirst: a run
// admitted unstored fails; its dispatcher dies after publishing the end,
// before the ended state. A second, different request for the run (another
// id, another user, another action) is delivered before the first comes
// again. It finds the stored end and writes the ended state: that state
// must be the first request's run (fromFirstRequest), not the second's.
// (A reviewer's finding: the end was committed from the delivered
// request.)
func TestAnEndFoundByASecondRequestIsCommittedFromTheFirst(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{AckWait: time.Second})
	var others atomic.Int32
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: withOther(failing, &others)})
	ctx := ctxT(t)
	runID := events.NewID()
	eb, err := bus.Open(srv.Connect(t), bus.BusConfig{Prefix: "ab", Source: "/client"})
	require.NoError(t, err)
	crashed := onceEach()
	var d *dispatch.Dispatcher
	startDispatcher(t, srv, dispatch.Config{InstanceID: "dies-after-end", AlarmDelay: time.Minute}, func(x *dispatch.Dispatcher) {
		d = x
		dispatch.SetCrashAfterEnd(x, func(id string) bool {
			if id != runID || !crashed(id) {
				return false
			}
			_, err := eb.Emit(ctx, events.TypeRunRequested, events.NewID(), events.DefaultTenant, runID, "",
				&events.RunRequested{RunID: runID, UserID: "u2", Action: &events.ActionCall{Name: "count.other", Args: map[string]any{}}})
			return assert.NoError(t, err, "the second request is stored")
		})
	})
	_, err = st.Client.Start(ctx, client.RunRequest{RunID: runID, UserID: "u1", Action: &client.ActionCall{Name: "fail.now", Args: map[string]any{}}})
	require.NoError(t, err)
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)

	kv, err := srv.JS.KeyValue(ctx, bus.Topology{}.BucketRuns())
	require.NoError(t, err)
	var stored run.State
	require.Eventually(t, func() bool {
		e, err := kv.Get(ctx, runID)
		if err != nil {
			return false
		}
		stored, err = run.DecodeState(e.Value())
		return err == nil && stored.IsTerminal()
	}, 15*time.Second, 50*time.Millisecond, "the ended state is written")
	requestsSettled(t, srv.JS)
	assert.Zero(t, others.Load())
	assert.Equal(t, "u1", stored.UserID, "the stored run is the first request's user's")
	require.Len(t, stored.Calls, 1)
	assert.Equal(t, "fail.now", stored.Calls[0].Action, "the stored run is the first request's")
	ended, err := dispatch.EndedState(ctx, d, events.DefaultTenant, runID)
	require.NoError(t, err)
	require.Len(t, ended.Calls, 1)
	assert.Equal(t, "fail.now", ended.Calls[0].Action, "the run read back is the first request's")
}
