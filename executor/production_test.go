package executor_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/artifacts"
	"github.com/actionbus/actionbus/internal/bus"
)

type blobOut struct {
	Blob string `json:"blob"`
}

func TestLargeOutputsBecomeArtifactsThatReadBackExactly(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	blob := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB
	st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "test.big"},
			func(context.Context, struct{}, executor.Call) (executor.Result[blobOut], error) {
				return executor.Result[blobOut]{Output: blobOut{Blob: blob}, Summary: "a big one"}, nil
			})
	}})
	ctx := ctxT(t)
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.big"}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	ref := res.Output.(map[string]any)["artifact"].(map[string]any)
	assert.Equal(t, "output", ref["role"])
	assert.Equal(t, "application/json", ref["mediaType"])
	assert.Equal(t, true, ref["truncated"])
	assert.LessOrEqual(t, len(ref["preview"].(string)), 1024, "the preview is bounded")
	assert.Equal(t, float64(len(`{"blob":""}`)+len(blob)), ref["bytes"])

	// The executor stored it in its pool's store, recorded as the run's
	// tenant's (the read service reads it with artifacts.Read).
	assert.Equal(t, bus.Topology{}.PoolArtifacts("default"), ref["store"])
	got, err := artifacts.Read(ctx, srv.JS, bus.Topology{}, "default", events.ArtifactRef{ID: ref["id"].(string),
		Store: ref["store"].(string), SHA256: ref["sha256"].(string)})
	require.NoError(t, err)
	want := []byte(`{"blob":"` + blob + `"}`)
	assert.True(t, bytes.Equal(want, got.Data), "the artifact reads back byte-identical")
	assert.Equal(t, res.RunID, got.RunID)
	wantSum := sha256.Sum256(want)
	assert.Equal(t, hex.EncodeToString(wantSum[:]), ref["sha256"])
	byID, err := artifacts.ReadByID(ctx, srv.JS, bus.Topology{}, "default", ref["id"].(string))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(want, byID.Data))
	_, err = artifacts.Read(ctx, srv.JS, bus.Topology{}, "acme", events.ArtifactRef{ID: ref["id"].(string), Store: ref["store"].(string)})
	assert.ErrorIs(t, err, actionbus.ErrArtifactNotFound, "another tenant reads nothing")
}

func TestAHandlerIgnoringItsDeadlineIsReportedTimedOutAtTheDeadline(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	release := make(chan struct{})
	var returned atomic.Bool
	st := srv.StartStack(t, actionbustest.StackOptions{Slots: 1, Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "test.stubborn", Timeout: 200 * time.Millisecond},
			func(context.Context, struct{}, executor.Call) (executor.Result[blobOut], error) {
				<-release // ignores its context on purpose
				returned.Store(true)
				return executor.Result[blobOut]{Output: blobOut{Blob: "late"}}, nil
			})
	}})
	ctx := ctxT(t)
	start := time.Now()
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.stubborn"}}, nil)
	took := time.Since(start)
	require.NoError(t, err)
	assert.Equal(t, client.StatusFailed, res.Status)
	assert.ErrorIs(t, res.Error, actionbus.ErrTimeout)
	assert.Contains(t, res.Error.Message, "ignored its context")
	assert.Equal(t, true, res.Error.Details["ignoredContext"])
	assert.EqualValues(t, 200, res.Error.Details["timeoutMs"])
	assert.False(t, returned.Load(), "the timeout was reported while the handler still ran")
	assert.Less(t, took, 5*time.Second)
	close(release) // the late output is discarded; the slot frees up
	res, err = st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.stubborn"}}, nil)
	require.NoError(t, err)
	assert.Equal(t, client.StatusCompleted, res.Status, "the slot was given back once the handler returned")
}

// TestAHandlerHonouringItsDeadlineIsNotCalledStubborn: a handler that
// returns when its context ends is reported as timed out, with the timeout
// in the details, and not as one that ignored its context.
func TestAHandlerHonouringItsDeadlineIsNotCalledStubborn(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "test.polite", Timeout: 150 * time.Millisecond},
			func(ctx context.Context, _ struct{}, _ executor.Call) (executor.Result[blobOut], error) {
				<-ctx.Done()
				return executor.Result[blobOut]{}, ctx.Err()
			})
	}})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Action: &client.ActionCall{Name: "test.polite"}}, nil)
	require.NoError(t, err)
	require.ErrorIs(t, res.Error, actionbus.ErrTimeout)
	assert.NotContains(t, res.Error.Message, "ignored")
	assert.Equal(t, false, res.Error.Details["ignoredContext"])
	assert.EqualValues(t, 150, res.Error.Details["timeoutMs"])
}

// TestATimedOutHandlerKeepsItsIdempotencyKeyUntilItReturns: a handler that
// ignores its deadline is reported timed out, but its key stays reserved
// while it still runs (a retry with the key would run beside it), and is
// released once it returns.
func TestATimedOutHandlerKeepsItsIdempotencyKeyUntilItReturns(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	release := make(chan struct{})
	st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "test.stubborn", Timeout: 200 * time.Millisecond},
			func(context.Context, struct{}, executor.Call) (executor.Result[blobOut], error) {
				<-release // ignores its context on purpose
				return executor.Result[blobOut]{Output: blobOut{Blob: "late"}}, nil
			})
	}})
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	t.Cleanup(letGo) // before the stack stops, whatever the outcome
	ctx := ctxT(t)
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.stubborn", IdempotencyKey: "k-1"}}, nil)
	require.NoError(t, err)
	require.ErrorIs(t, res.Error, actionbus.ErrTimeout)
	kv, err := srv.JS.KeyValue(ctx, bus.Topology{}.BucketIdempotency("default"))
	require.NoError(t, err)
	// The bucket key: <pool>.<tenant>.<sha256 of the key>.
	sum := sha256.Sum256([]byte("k-1"))
	key := "default.default." + hex.EncodeToString(sum[:])
	entry, err := kv.Get(ctx, key)
	require.NoError(t, err, "the key was released while the handler still ran")
	assert.Contains(t, string(entry.Value()), `"state":"reserved"`)
	letGo()
	require.Eventually(t, func() bool {
		_, err := kv.Get(ctx, key)
		return errors.Is(err, jetstream.ErrKeyNotFound)
	}, 10*time.Second, 20*time.Millisecond, "the key was not released once the handler returned")
}

func TestAnIdempotencyKeyReplaysTheFirstResult(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	var runs atomic.Int32
	st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "test.charge"},
			func(_ context.Context, in map[string]any, call executor.Call) (executor.Result[map[string]any], error) {
				n := runs.Add(1)
				return executor.Result[map[string]any]{Output: map[string]any{"charge": n, "key": call.IdempotencyKey}}, nil
			})
	}})
	ctx := ctxT(t)
	rec := srv.Record(t, "ab.run.*.*.result")
	first, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.charge", IdempotencyKey: "order-42"}}, nil)
	require.NoError(t, err)
	second, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.charge", IdempotencyKey: "order-42"}}, nil)
	require.NoError(t, err)
	assert.Equal(t, int32(1), runs.Load(), "the handler ran once")
	assert.Equal(t, first.Output, second.Output)
	assert.Equal(t, map[string]any{"charge": 1.0, "key": "order-42"}, second.Output)
	r := rec.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
		var c events.ActionCompleted
		return r.Type() == events.TypeActionCompleted && events.DataAs(r.Event, &c) == nil && c.RunID == second.RunID
	})
	var done events.ActionCompleted
	require.NoError(t, events.DataAs(r.Event, &done))
	assert.True(t, done.Replayed)
	assert.Equal(t, 1, done.Deliveries)

	other, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.charge", IdempotencyKey: "order-43"}}, nil)
	require.NoError(t, err)
	assert.Equal(t, 2.0, other.Output.(map[string]any)["charge"], "another key runs")
}

// TestQueuedWorkOfACanceledRunNeverRuns: with the only slot busy, a run is
// canceled while its call waits in the queue. When the slot frees, the
// executor answers the call with run_ended and never calls the handler: no
// effect follows a cancel.
func TestQueuedWorkOfACanceledRunNeverRuns(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	hold := newHold(t)
	var effects atomic.Int32
	st := srv.StartStack(t, actionbustest.StackOptions{Slots: 1, Register: func(ex *executor.Executor) error {
		return errors.Join(
			hold.register(ex),
			executor.Register(ex, executor.Action{Name: "test.effect"},
				func(context.Context, struct{}, executor.Call) (executor.Result[blobOut], error) {
					effects.Add(1)
					return executor.Result[blobOut]{Output: blobOut{Blob: "done"}}, nil
				}))
	}})
	ctx := ctxT(t)
	rec := srv.Record(t, "ab.>")
	holder, err := st.Client.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.hold"}})
	require.NoError(t, err)
	// The only slot is taken once the holder's handler runs (its
	// dispatch step can be seen before its work item is stored).
	hold.started(ctx, t)
	queued, err := st.Client.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.effect"}})
	require.NoError(t, err)
	rec.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
		return r.Type() == events.TypeActionRequested && r.Event.Extensions()[events.ExtRunID] == queued
	})
	require.NoError(t, st.Client.Cancel(ctx, queued, "changed my mind"))
	res, err := st.Client.Wait(ctx, queued)
	require.NoError(t, err)
	require.Equal(t, client.StatusCanceled, res.Status)
	hold.letGo()
	r := rec.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
		return r.Type() == events.TypeActionFailed && r.Event.Extensions()[events.ExtRunID] == queued
	})
	var failed events.ActionFailed
	require.NoError(t, events.DataAs(r.Event, &failed))
	assert.Equal(t, actionbus.CodeRunEnded, failed.Error.Code)
	assert.Equal(t, int32(0), effects.Load(), "the canceled run's queued call ran")
	done, err := st.Client.Wait(ctx, holder)
	require.NoError(t, err)
	assert.Equal(t, client.StatusCompleted, done.Status)
}

// TestALeaseKeepsARunningHandlersKeyFromATakeover: a handler that ignores
// its 200 ms deadline runs on for 2 s, far past what a reservation would
// live without renewal (three heartbeats: 600 ms here). Its executor
// renews the lease while it runs, so a second call with the same key, on
// another executor, waits for it instead of taking the key over: the
// handler never runs twice at once, and the second call runs after the
// first returns.
func TestALeaseKeepsARunningHandlersKeyFromATakeover(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{AckWait: 600 * time.Millisecond})
	var inFlight, most, calls atomic.Int32
	first := make(chan struct{})
	var firstOnce sync.Once
	st := srv.StartStack(t, actionbustest.StackOptions{Executors: 2, Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "test.stubborn", Timeout: 200 * time.Millisecond},
			func(context.Context, struct{}, executor.Call) (executor.Result[blobOut], error) {
				n := inFlight.Add(1)
				defer inFlight.Add(-1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				if calls.Add(1) == 1 {
					firstOnce.Do(func() { close(first) })
					<-time.After(2 * time.Second) // runs on, ignoring its context on purpose
				}
				return executor.Result[blobOut]{Output: blobOut{Blob: "done"}}, nil
			})
	}})
	ctx := ctxT(t)
	req := client.RunRequest{Action: &client.ActionCall{Name: "test.stubborn", IdempotencyKey: "k-lease"}}
	res, err := st.Client.Run(ctx, req, nil)
	require.NoError(t, err)
	require.ErrorIs(t, res.Error, actionbus.ErrTimeout)
	<-first
	res, err = st.Client.Run(ctx, req, nil)
	require.NoError(t, err)
	assert.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.EqualValues(t, 2, calls.Load())
	assert.EqualValues(t, 1, most.Load(), "the key was taken over while its handler still ran")
}

// TestTheKitPassesExecutorSettings: StackOptions.Executor reaches every
// executor of the stack (here a 1 KiB MaxOutputBytes turns a 4 KiB output
// into an artifact).
func TestTheKitPassesExecutorSettings(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Executor: executor.Config{MaxOutputBytes: 1 << 10}, Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "test.four"},
			func(context.Context, struct{}, executor.Call) (executor.Result[blobOut], error) {
				return executor.Result[blobOut]{Output: blobOut{Blob: strings.Repeat("x", 4<<10)}}, nil
			})
	}})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Action: &client.ActionCall{Name: "test.four"}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	_, isRef := res.Output.(map[string]any)["artifact"]
	assert.True(t, isRef, "the output went to the artifact store: %v", res.Output)
}

// TestIdempotencyKeysAreScopedToTheTenant: two tenants using the same
// idempotency key on the same action with the same input each run the
// handler once, and each replays only its own first result.
func TestIdempotencyKeysAreScopedToTheTenant(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	var runs atomic.Int32
	st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "test.charge"},
			func(_ context.Context, in map[string]any, call executor.Call) (executor.Result[map[string]any], error) {
				return executor.Result[map[string]any]{Output: map[string]any{"charge": runs.Add(1)}}, nil
			})
	}})
	ctx := ctxT(t)
	acme, err := client.New(srv.Connect(t), client.Options{Tenant: "acme"})
	require.NoError(t, err)
	call := &client.ActionCall{Name: "test.charge", Args: map[string]any{}, IdempotencyKey: "order-42"}
	first, err := st.Client.Run(ctx, client.RunRequest{Action: call, UserID: "u1"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, first.Status, "%+v", first.Error)
	other, err := acme.Run(ctx, client.RunRequest{Action: call, UserID: "u1"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, other.Status, "%+v", other.Error)
	assert.Equal(t, map[string]any{"charge": 2.0}, other.Output, "acme's call ran: the default tenant's result is not acme's")
	again, err := acme.Run(ctx, client.RunRequest{Action: call, UserID: "u1"}, nil)
	require.NoError(t, err)
	assert.Equal(t, other.Output, again.Output, "acme replays its own first result")
	assert.Equal(t, int32(2), runs.Load())
}

// TestABusyExecutorLeavesQueuedWorkToAFreeOne: a slot asks the server for
// a message only when it is free, so a busy executor holds no queued work
// back in a buffer: with one executor's only slot held, every other call
// runs on the other executor while the hold lasts.
func TestABusyExecutorLeavesQueuedWorkToAFreeOne(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	hold := newHold(t)
	st := srv.StartStack(t, actionbustest.StackOptions{Executors: 2, Slots: 1, Register: func(ex *executor.Executor) error {
		return errors.Join(
			hold.register(ex),
			executor.Register(ex, executor.Action{Name: "test.quick"},
				func(context.Context, struct{}, executor.Call) (executor.Result[blobOut], error) {
					return executor.Result[blobOut]{Output: blobOut{Blob: "done"}}, nil
				}))
	}})
	ctx := ctxT(t)
	holder, err := st.Client.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.hold"}})
	require.NoError(t, err)
	hold.started(ctx, t)
	// Every quick run must finish while the hold lasts: one waiting in
	// the busy executor's buffer would wait for the release, which only
	// comes after them.
	for i := range 8 {
		runID, err := st.Client.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.quick"}})
		require.NoError(t, err)
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		res, err := st.Client.Wait(wctx, runID)
		cancel()
		require.NoError(t, err, "quick run %d did not finish while the other executor was busy", i)
		require.Equal(t, client.StatusCompleted, res.Status, "quick run %d", i)
	}
	hold.letGo()
	done, err := st.Client.Wait(ctx, holder)
	require.NoError(t, err)
	assert.Equal(t, client.StatusCompleted, done.Status)
}

// holdAction is the action test.hold: its handler takes its slot until
// letGo (or its context ends).
type holdAction struct {
	holding, release chan struct{}
	once             sync.Once
}

// newHold returns a holdAction let go when the test ends.
func newHold(t *testing.T) *holdAction {
	h := &holdAction{holding: make(chan struct{}, 1), release: make(chan struct{})}
	t.Cleanup(h.letGo)
	return h
}

func (h *holdAction) letGo() { h.once.Do(func() { close(h.release) }) }

func (h *holdAction) register(ex *executor.Executor) error {
	return executor.Register(ex, executor.Action{Name: "test.hold"},
		func(ctx context.Context, _ struct{}, _ executor.Call) (executor.Result[blobOut], error) {
			select {
			case h.holding <- struct{}{}:
			default:
			}
			select {
			case <-h.release:
			case <-ctx.Done():
			}
			return executor.Result[blobOut]{Output: blobOut{Blob: "held"}}, nil
		})
}

// started waits for a handler of test.hold to run.
func (h *holdAction) started(ctx context.Context, t *testing.T) {
	t.Helper()
	select {
	case <-h.holding:
	case <-ctx.Done():
		t.Fatal("the holder's handler never ran")
	}
}
