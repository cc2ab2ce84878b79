package dispatch_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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
