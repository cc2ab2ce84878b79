package dispatch_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/dispatch"
)

// alarmDelay is the dispatchers' AlarmDelay in these tests.
const alarmDelay = 300 * time.Millisecond

// gatedActions hosts hold.quick, which answers at once, and hold.gated,
// which answers when the gate closes (or its context ends).
type gatedActions struct{ gate chan struct{} }

func (g *gatedActions) register(ex *executor.Executor) error {
	quick := func(_ context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
		return executor.Result[map[string]any]{Output: in}, nil
	}
	gated := func(ctx context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
		select {
		case <-g.gate:
			return executor.Result[map[string]any]{Output: in}, nil
		case <-ctx.Done():
			return executor.Result[map[string]any]{}, ctx.Err()
		}
	}
	return errors.Join(
		executor.Register(ex, executor.Action{Name: "hold.quick"}, quick),
		executor.Register(ex, executor.Action{Name: "hold.gated", Timeout: time.Minute}, gated),
	)
}

func startGated(t *testing.T, prepare ...func(*dispatch.Dispatcher)) (*actionbustest.Server, *actionbustest.Stack, *gatedActions) {
	t.Helper()
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	g := &gatedActions{gate: make(chan struct{})}
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: g.register})
	startDispatcher(t, srv, dispatch.Config{AlarmDelay: alarmDelay, InstanceID: "deferring"}, prepare...)
	return srv, st, g
}

// timersWritten is how many messages the timers stream has ever stored
// (its last sequence: a purge does not lower it).
func timersWritten(t *testing.T, srv *actionbustest.Server) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := srv.JS.Stream(ctx, bus.Topology{Prefix: events.DefaultPrefix}.StreamTimers())
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	return info.State.LastSeq
}

// requestsPending is how many run requests the dispatcher holds
// unacknowledged.
func requestsPending(t *testing.T, srv *actionbustest.Server) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := srv.JS.Consumer(ctx, bus.Topology{Prefix: events.DefaultPrefix}.StreamRequests(), bus.PartitionConsumer(bus.ConsumerDispatcherRequests, 0))
	require.NoError(t, err)
	info, err := c.Info(ctx)
	require.NoError(t, err)
	return info.NumAckPending + int(info.NumPending)
}

// TestARunThatEndsWithinTheAlarmDelayStoresNoSchedule: a one-action run
// ends in milliseconds; its request is acknowledged when it ends, and no
// schedule was ever written to the timers stream for it.
func TestARunThatEndsWithinTheAlarmDelayStoresNoSchedule(t *testing.T) {
	srv, st, _ := startGated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before := timersWritten(t, srv)
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "hold.quick", Args: map[string]any{"n": 1}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	require.Eventually(t, func() bool { return requestsPending(t, srv) == 0 }, 10*time.Second, 20*time.Millisecond, "the request is acknowledged once the run ended")
	assert.Equal(t, before, timersWritten(t, srv), "no schedule was stored for a run that ended within the alarm delay")
}

// TestARunStillGoingAfterTheAlarmDelayHasItsAlarmArmed: a run whose action
// is still running when the delay ends has its alarm armed (a schedule of
// its own in the timers stream) and only then its request acknowledged;
// when it ends, the schedule is purged.
func TestARunStillGoingAfterTheAlarmDelayHasItsAlarmArmed(t *testing.T) {
	srv, st, g := startGated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	runID, err := st.Client.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: "hold.gated", Args: map[string]any{}}})
	require.NoError(t, err)
	schedules := "ab.run.*." + runID + ".sched.>"
	require.Eventually(t, func() bool { return srv.Stored(t, "AB_TIMERS", schedules) == 1 }, 10*time.Second, 20*time.Millisecond, "the alarm is armed after the delay")
	require.Eventually(t, func() bool { return requestsPending(t, srv) == 0 }, 10*time.Second, 20*time.Millisecond, "the request is acknowledged once the alarm is armed")
	close(g.gate)
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	require.Eventually(t, func() bool { return srv.Stored(t, "AB_TIMERS", schedules) == 0 }, 10*time.Second, 20*time.Millisecond, "the ended run's alarm is canceled")
}

// TestACrashHoldingANewRunsAlarmLosesNoAlarm: the dispatcher crashes while
// it holds a new run's alarm (never arming it). The run's request, not
// acknowledged, is delivered again, finds the run stored and arms its
// alarm: the run, whose action never answers, ends at its 2 s deadline
// instead of waiting for the action's one-minute timeout.
func TestACrashHoldingANewRunsAlarmLosesNoAlarm(t *testing.T) {
	var mu sync.Mutex
	crashed := map[string]bool{}
	srv, st, _ := startGated(t, func(d *dispatch.Dispatcher) {
		dispatch.SetCrashHoldingAlarm(d, func(runID string) bool {
			mu.Lock()
			defer mu.Unlock()
			first := !crashed[runID]
			crashed[runID] = true
			return first
		})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "hold.gated", Args: map[string]any{}}, Deadline: 2 * time.Second}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	assert.Equal(t, actionbus.CodeRunDeadline, res.Error.Code, "%+v", res.Error)
	mu.Lock()
	assert.Len(t, crashed, 1, "the holder crashed")
	mu.Unlock()
	assert.Zero(t, srv.Stored(t, "AB_TIMERS", "ab.run.*."+res.RunID+".sched.>"), "the ended run's alarms are canceled")
}

// TestAHandOutThatFailsAfterTheAlarmDelayIsPublishedAgain: a run admitted
// without a state write hands its work out while its alarm is held; the
// publish outlasts the alarm delay (a stream electing a leader answers
// nothing for seconds) and then fails. The alarm, due meanwhile, must not
// store the run as admitted — a state with no outbox, for work never
// published — or the request, delivered again, finds the run stored and
// publishes nothing, and the run waits for its action's timeout. Seen in
// the three-node cluster test when a node was killed as a run was
// admitted. The run completes.
func TestAHandOutThatFailsAfterTheAlarmDelayIsPublishedAgain(t *testing.T) {
	arming := make(chan string, 16)
	var failed sync.Map
	var server atomic.Pointer[actionbustest.Server] // set before any run starts
	srv, st, _ := startGated(t, func(d *dispatch.Dispatcher) {
		dispatch.SetArming(d, func(runID string) { arming <- runID })
		dispatch.SetFailHandingOut(d, func(runID string) error {
			if _, again := failed.LoadOrStore(runID, true); again {
				return nil
			}
			select {
			case <-arming:
			case <-time.After(10 * time.Second):
				return errors.New("test: the alarm delay never passed")
			}
			// An alarm that does not wait for the admission stores the
			// run now; give it the time to, then fail.
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			kv, err := server.Load().JS.KeyValue(ctx, bus.Topology{Prefix: events.DefaultPrefix}.BucketRuns())
			if err != nil {
				return err
			}
			for ctx.Err() == nil {
				if _, err := kv.Get(ctx, runID); err == nil {
					break
				}
			}
			return errors.New("test: the server went away mid-publish")
		})
	})
	server.Store(srv)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "hold.quick", Args: map[string]any{"n": 1}}}, nil)
	require.NoError(t, err, "the run ended")
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	_, hooked := failed.Load(res.RunID)
	assert.True(t, hooked, "the run's first hand-out failed")
}
