package dispatch_test

import (
	"context"
	"math/rand/v2"
	"sync"
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
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/policy"
)

// startCrashingDispatcher runs a dispatcher that simulates a crash between
// a state write and its publishes whenever crash returns true.
func startCrashingDispatcher(t *testing.T, srv *actionbustest.Server, crash func(runID string) bool) {
	t.Helper()
	startDispatcher(t, srv, dispatch.Config{ApprovalKeys: policy.Keys{"k1": {Secret: approvalKey, Holder: "alice"}}, InstanceID: "crashing"},
		func(d *dispatch.Dispatcher) {
			dispatch.SetCrashAfterWrite(d, crash)
			// A run admitted unstored has no state write: its admission
			// crashes after handing its work out instead.
			dispatch.SetCrashHandingOut(d, crash)
		})
}

// onceEach crashes the first write of every run, and never again.
func onceEach() func(string) bool {
	var mu sync.Mutex
	seen := map[string]bool{}
	return func(runID string) bool {
		mu.Lock()
		defer mu.Unlock()
		first := !seen[runID]
		seen[runID] = true
		return first
	}
}

// TestACrashBetweenTheStateWriteAndItsPublishesLosesNoTimer: the
// dispatcher stores a new run waiting for an approval and crashes before
// publishing anything. The redelivered request finds the run stored and
// publishes its outbox — run.started, the approval request and both
// timers — so the run, never approved, ends at its 2 s deadline instead of
// waiting for ever.
func TestACrashBetweenTheStateWriteAndItsPublishesLosesNoTimer(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	ops := &opsActions{}
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: ops.register})
	startCrashingDispatcher(t, srv, onceEach())
	rec := srv.Record(t, "ab.run.>")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "ops.restart", Args: map[string]any{"service": "api"}},
		AllowedModes: []string{"read", "mutate"}, Deadline: 2 * time.Second}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	assert.Equal(t, actionbus.CodeRunDeadline, res.Error.Code, "%+v", res.Error)
	for _, typ := range []string{events.TypeRunStarted, events.TypeApprovalRequested} {
		rec.WaitFor(t, 0, func(r actionbustest.Recorded) bool { return r.Type() == typ })
	}
	assert.Empty(t, ops.ran(), "nothing ran without its approval")
}

const pairScenario = `
scenarios:
  pair:
    decisions:
      - type: plan
        actions: [{type: action, name: count.hit, args: {n: 1}}, {type: action, name: count.hit, args: {n: 2}}]
      - {type: final, answer: done}
`

// hitCounter counts the executions of each call.
type hitCounter struct {
	mu   sync.Mutex
	hits map[string]int
}

func (c *hitCounter) register(ex *executor.Executor) error {
	return executor.Register(ex, executor.Action{Name: "count.hit", Description: "Count a hit."},
		func(_ context.Context, in map[string]any, call executor.Call) (executor.Result[map[string]any], error) {
			c.mu.Lock()
			c.hits[call.CallID]++
			c.mu.Unlock()
			return executor.Result[map[string]any]{Output: map[string]any{"call": call.CallID}}, nil
		})
}

// TestRunsSurviveCrashesAtEveryStateWrite: a third of all state writes,
// and of admissions that store no state (after their work went out), at
// most two per run, crash before their publishes; every run still ends
// once, with its own answer, and no call ran twice.
func TestRunsSurviveCrashesAtEveryStateWrite(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	counted := &hitCounter{hits: map[string]int{}}
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, Scenarios: pairScenario, Slots: 8, Register: counted.register})
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(1, 2))
	crashes, perRun := 0, map[string]int{}
	startCrashingDispatcher(t, srv, func(runID string) bool {
		mu.Lock()
		defer mu.Unlock()
		// At most two crashes per run keep redelivery backoff short.
		if perRun[runID] < 2 && rng.IntN(3) == 0 {
			crashes++
			perRun[runID]++
			return true
		}
		return false
	})
	rec := srv.Record(t, "ab.run.>")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const n = 20
	ids := make([]string, n)
	for i := range ids {
		req := client.RunRequest{Scenario: "pair"}
		if i%2 == 1 {
			req = client.RunRequest{Workflow: client.NewWorkflow("two").Step("a", "count.hit", map[string]any{"n": i}).
				Step("b", "count.hit", map[string]any{"n": map[string]any{"$fromStep": "a", "path": "/call"}}).Build()}
		}
		id, err := st.Client.Start(ctx, req)
		require.NoError(t, err)
		ids[i] = id
	}
	for _, id := range ids {
		res, err := st.Client.Wait(ctx, id)
		require.NoError(t, err)
		require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
		// The recorder reads the stream on its own: it has the terminal
		// event Wait saw before the count below.
		rec.WaitForType(t, 10*time.Second, events.TypeRunCompleted, id)
	}
	terminals := map[string]map[string]bool{}
	for _, r := range rec.All() {
		switch r.Type() {
		case events.TypeRunCompleted, events.TypeRunFailed, events.TypeRunCanceled:
			id := r.Event.Extensions()[events.ExtRunID].(string)
			if terminals[id] == nil {
				terminals[id] = map[string]bool{}
			}
			terminals[id][r.Event.ID()] = true
		}
	}
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)
	for _, id := range ids {
		assert.Len(t, terminals[id], 1, "run %s ends once", id)
		// A second copy of an end would have the first's id: the stream
		// is what counts them.
		assert.Equal(t, map[string]uint64{"completed": 1}, storedEnds(t, js, id), "run %s has one end stored", id)
	}
	counted.mu.Lock()
	defer counted.mu.Unlock()
	assert.Len(t, counted.hits, 2*n, "every call ran")
	for key, c := range counted.hits {
		assert.Equal(t, 1, c, "call %s ran %d times", key, c)
	}
	mu.Lock()
	t.Logf("%d runs, %d simulated crashes", n, crashes)
	assert.NotZero(t, crashes)
	mu.Unlock()
}
