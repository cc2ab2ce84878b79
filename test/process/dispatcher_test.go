package process

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
)

// dispatcherProcess starts the dispatcher binary; kill stops it with
// SIGKILL.
func dispatcherProcess(t *testing.T, bin, url, id string) (kill func()) {
	t.Helper()
	cmd := exec.Command(filepath.Join(bin, "dispatcher"))
	cmd.Env = append(cmd.Environ(), "NATS_URL="+url, "ACTIONBUS_INSTANCE="+id)
	out := &actionbustest.LogBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	var once sync.Once
	kill = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-exited
		})
	}
	t.Cleanup(func() {
		kill()
		if t.Failed() {
			t.Logf("dispatcher %s output:\n%s", id, out.String())
		}
	})
	return kill
}

// terminalsStored returns how many terminal events of a default-tenant
// run the runs stream holds (see terminalsStoredOf).
func terminalsStored(t *testing.T, ctx context.Context, js jetstream.JetStream, runID string) uint64 {
	t.Helper()
	return terminalsStoredOf(t, ctx, js, events.DefaultTenant, runID)
}

// terminalsStoredOf returns how many terminal events of a run the runs
// stream holds. A follower can learn of the terminal event (on core NATS)
// before the stream has stored it, so it waits, up to 10 s, for one to be
// stored; a second one would already be stored by then.
func terminalsStoredOf(t *testing.T, ctx context.Context, js jetstream.JetStream, tenant, runID string) uint64 {
	t.Helper()
	stream, err := js.Stream(ctx, "AB_RUNS")
	require.NoError(t, err)
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter("ab.run."+tenant+"."+runID+".>"))
		require.NoError(t, err)
		var n uint64
		for subject, count := range info.State.Subjects {
			for _, verb := range []string{"completed", "failed", "canceled"} {
				if events.MustSubjects("ab").Canonical(subject) == "ab.run."+tenant+"."+runID+"."+verb {
					n += count
				}
			}
		}
		if n > 0 || time.Now().After(deadline) {
			return n
		}
		select {
		case <-ctx.Done():
			return n
		case <-time.After(20 * time.Millisecond):
		}
	}
}

const crashScenarios = `
scenarios:
  plan6:
    decisions:
      - type: plan
        actions: [{type: action, name: crash.held, args: {i: 0}}, {type: action, name: crash.held, args: {i: 1}}, {type: action, name: crash.held, args: {i: 2}},
                  {type: action, name: crash.held, args: {i: 3}}, {type: action, name: crash.held, args: {i: 4}}, {type: action, name: crash.held, args: {i: 5}}]
      - {type: final, answer: '{{ len .Last }} results'}
  pair:
    decisions:
      - type: plan
        actions: [{type: action, name: crash.echo, args: {i: 0}}, {type: action, name: crash.echo, args: {i: 1}}]
      - {type: final, answer: done}
`

func TestADispatcherKilledMidPlanIsRestartedAndFinishesTheRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts dispatcher processes")
	}
	bin := buildServices(t)
	srv := actionbustest.NewServer(t, actionbustest.Options{AckWait: time.Second})
	rec := srv.Record(t, "ab.run.*.*.result")
	release := make(chan struct{})
	var mu sync.Mutex
	runs := map[string]int{}
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, Scenarios: crashScenarios, Slots: 8, Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "crash.held"},
			func(ctx context.Context, in map[string]any, call executor.Call) (executor.Result[map[string]any], error) {
				mu.Lock()
				runs[call.CallID]++
				mu.Unlock()
				select {
				case <-release:
				case <-ctx.Done():
					return executor.Result[map[string]any]{}, ctx.Err()
				}
				return executor.Result[map[string]any]{Output: in}, nil
			})
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	kill := dispatcherProcess(t, bin, srv.URL, "d1")
	runID, err := st.Client.Start(ctx, client.RunRequest{Scenario: "plan6"})
	require.NoError(t, err)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(runs) == 6 }, 30*time.Second, 10*time.Millisecond)

	// Hold results back: k = 3 of the n = 6 actions complete, then the
	// dispatcher dies (whatever it had or had not stored of them).
	for i := 0; i < 3; i++ {
		release <- struct{}{}
	}
	rec.WaitForN(t, 30*time.Second, 3, func(r actionbustest.Recorded) bool { return r.Type() == events.TypeActionCompleted })
	kill()
	close(release) // the rest complete while no dispatcher runs

	dispatcherProcess(t, bin, srv.URL, "d2")
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, "6 results", res.Answer)
	mu.Lock()
	assert.Len(t, runs, 6)
	for id, n := range runs {
		assert.Equal(t, 1, n, "handler of call %s ran %d times", id, n)
	}
	mu.Unlock()
	assert.Equal(t, uint64(1), terminalsStored(t, ctx, srv.JS, runID), "exactly one terminal event in the stream")
}

func TestTwoDispatcherProcessesShareTwoHundredRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts dispatcher processes")
	}
	bin := buildServices(t)
	srv := actionbustest.NewServer(t, actionbustest.Options{Partitions: 4})
	rec := srv.Record(t, "")
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoAuditor: true, Scenarios: crashScenarios, Executors: 2, Slots: 16,
		Register: func(ex *executor.Executor) error {
			return executor.Register(ex, executor.Action{Name: "crash.echo"},
				func(_ context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
					return executor.Result[map[string]any]{Output: in}, nil
				})
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	dispatcherProcess(t, bin, srv.URL, "d1")
	dispatcherProcess(t, bin, srv.URL, "d2")

	const n = 200
	ids := make([]string, n)
	for i := range ids {
		id, err := st.Client.Start(ctx, client.RunRequest{Scenario: "pair"})
		require.NoError(t, err)
		ids[i] = id
	}
	for _, id := range ids {
		res, err := st.Client.Wait(ctx, id)
		require.NoError(t, err)
		if res.Status != client.StatusCompleted {
			for _, r := range rec.All() {
				if strings.Contains(r.Subject, id) {
					t.Logf("%s %s %s %s", r.Subject, r.Type(), r.Event.Source(), string(r.Data))
				}
			}
		}
		require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	}
	rec.WaitForN(t, 30*time.Second, n, func(r actionbustest.Recorded) bool { return r.Type() == events.TypeRunCompleted })

	// The recorder sees the wire, not the stream: an outbox one dispatcher
	// loads while the other is still clearing it is published again under
	// the same event id, and JetStream drops the copy. What must never
	// happen is a second request (another id) for the same call, or a
	// second terminal event.
	requests := map[string]map[string]bool{}
	terminals := map[string]map[string]bool{}
	sources := map[string]int{}
	for _, r := range rec.All() {
		switch r.Type() {
		case events.TypeActionRequested:
			var req events.ActionRequested
			require.NoError(t, events.DataAs(r.Event, &req))
			key := fmt.Sprintf("%s/%d/%d", req.RunID, req.Cycle, req.PlanIndex)
			if requests[key] == nil {
				requests[key] = map[string]bool{}
			}
			requests[key][r.Event.ID()] = true
			sources[r.Event.Source()]++
		case events.TypeRunCompleted, events.TypeRunFailed, events.TypeRunCanceled:
			runID := r.Event.Extensions()[events.ExtRunID].(string)
			if terminals[runID] == nil {
				terminals[runID] = map[string]bool{}
			}
			terminals[runID][r.Type()+"/"+r.Event.ID()] = true
		}
	}
	assert.Len(t, requests, 2*n)
	for key, ids := range requests {
		assert.Len(t, ids, 1, "action request %s published under %d ids", key, len(ids))
	}
	assert.Len(t, terminals, n)
	for runID, ts := range terminals {
		assert.Len(t, ts, 1, "run %s has one terminal event", runID)
	}
	assert.Len(t, sources, 2, "both dispatchers did work: %v", sources)
	for src := range sources {
		assert.True(t, strings.HasPrefix(src, "/actionbus/dispatcher/d"), src)
	}
}
