package dispatch_test

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/cli"
	"github.com/actionbus/actionbus/internal/dispatch"
)

// countedSteps is a stack whose action wf.count counts its calls per step
// and fails step s3 the first time, with a failed run of the four-step
// chain s1 → s2 → s3 → s4 (s1 and s2 completed, s3 failed).
type countedSteps struct {
	srv   *actionbustest.Server
	st    *actionbustest.Stack
	mu    sync.Mutex
	ran   map[string]int
	first *client.Result
}

func newCountedSteps(t *testing.T) *countedSteps {
	c := &countedSteps{ran: map[string]int{}}
	c.srv = actionbustest.NewServer(t, actionbustest.Options{})
	c.st = c.srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "wf.count"}, func(_ context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
			step, _ := in["step"].(string)
			c.mu.Lock()
			c.ran[step]++
			n := c.ran[step]
			c.mu.Unlock()
			if step == "s3" && n == 1 {
				return executor.Result[map[string]any]{}, actionbus.Errorf("flaky", "s3 fails the first time")
			}
			return executor.Result[map[string]any]{Output: map[string]any{"step": step}}, nil
		})
	}})
	wf := client.NewWorkflow("four").Step("s1", "wf.count", map[string]any{"step": "s1"})
	for i, s := range []string{"s2", "s3", "s4"} {
		wf = wf.Step(s, "wf.count", map[string]any{"step": s, "after": client.FromStep(fmt.Sprintf("s%d", i+1), "/step")})
	}
	var err error
	c.first, err = c.st.Client.Run(ctxT(t), client.RunRequest{Workflow: wf.Build(), UserID: "u1"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, c.first.Status)
	return c
}

func (c *countedSteps) counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return map[string]int{"s1": c.ran["s1"], "s2": c.ran["s2"], "s3": c.ran["s3"], "s4": c.ran["s4"]}
}

// TestASecondRetryOfARetriedRunIsRefusedNamingTheRetry: the failed run's
// retry completes (s3 and s4 run once more); retrying the failed run again
// — through the client and through `actionbus retry` — is refused with
// retry_refused naming the first retry, as is a retry of the refused
// retry, and no step runs again.
func TestASecondRetryOfARetriedRunIsRefusedNamingTheRetry(t *testing.T) {
	c := newCountedSteps(t)
	ctx := ctxT(t)
	id, err := c.st.Client.Retry(ctx, c.first.RunID)
	require.NoError(t, err)
	res, err := c.st.Client.Wait(ctx, id)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	want := map[string]int{"s1": 1, "s2": 1, "s3": 2, "s4": 1}
	require.Equal(t, want, c.counts())

	again, err := c.st.Client.Retry(ctx, c.first.RunID)
	require.NoError(t, err)
	res, err = c.st.Client.Wait(ctx, again)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	assert.Equal(t, actionbus.CodeRetryRefused, res.Error.Code)
	assert.Equal(t, id, res.Error.Details["retriedBy"])
	assert.Contains(t, res.Error.Message, "already retried by run "+id)

	// Nor is the refused retry retried (from the start, it would run
	// every step again).
	third, err := c.st.Client.Retry(ctx, again)
	require.NoError(t, err)
	res, err = c.st.Client.Wait(ctx, third)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	assert.Equal(t, actionbus.CodeRetryRefused, res.Error.Code)
	assert.Equal(t, id, res.Error.Details["retriedBy"])

	var out, errOut bytes.Buffer
	code := cli.Execute(ctx, []string{"--nats", c.srv.URL, "retry", c.first.RunID}, nil, &out, &errOut)
	assert.Equal(t, 2, code, "a failed run's exit code; stderr: %s", errOut.String())
	assert.Contains(t, out.String(), "retry_refused")
	assert.Contains(t, out.String(), "already retried by run "+id)
	assert.Equal(t, want, c.counts(), "no step ran a second copy")
}

// TestConcurrentRetriesOfOneRunRunItsRemainingStepsOnce: two dispatchers,
// six retries of one failed run requested at once. One claims the run
// (a revision-checked write on its stored state) and completes; every
// other is refused naming it; s3 and s4 run once more in all.
func TestConcurrentRetriesOfOneRunRunItsRemainingStepsOnce(t *testing.T) {
	c := newCountedSteps(t)
	startDispatcher(t, c.srv, dispatch.Config{})
	ctx := ctxT(t)
	const n = 6
	ids := make([]string, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i], errs[i] = c.st.Client.Retry(ctx, c.first.RunID)
		}()
	}
	wg.Wait()
	var completed []string
	refusedBy := map[any]int{}
	for i, id := range ids {
		require.NoError(t, errs[i])
		res, err := c.st.Client.Wait(ctx, id)
		require.NoError(t, err)
		if res.Status == client.StatusCompleted {
			completed = append(completed, id)
			continue
		}
		require.Equal(t, actionbus.CodeRetryRefused, res.Error.Code, "%+v", res.Error)
		refusedBy[res.Error.Details["retriedBy"]]++
	}
	require.Len(t, completed, 1, "one retry runs")
	assert.Equal(t, map[any]int{completed[0]: n - 1}, refusedBy, "every other names it")
	assert.Equal(t, map[string]int{"s1": 1, "s2": 1, "s3": 2, "s4": 1}, c.counts())
}

// TestConcurrentClaimsOfARetryAgreeOnOne: eight retries claim one failed
// run at once, each a read and a revision-checked write of its stored
// state; every claim answers the same run, one of the eight, and the
// stored state names it.
func TestConcurrentClaimsOfARetryAgreeOnOne(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true})
	var d *dispatch.Dispatcher
	startDispatcher(t, srv, dispatch.Config{}, func(x *dispatch.Dispatcher) { d = x })
	ctx := ctxT(t)
	failed, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "no.such.action"}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, failed.Status)

	const n = 8
	claimers, holders, errs := make([]string, n), make([]string, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		claimers[i] = events.NewID()
		wg.Add(1)
		go func() {
			defer wg.Done()
			holders[i], errs[i] = dispatch.ClaimRetry(ctx, d, failed.RunID, claimers[i])
		}()
	}
	wg.Wait()
	for i := range n {
		require.NoError(t, errs[i])
		assert.Equal(t, holders[0], holders[i], "every claim answers the same run")
	}
	assert.Contains(t, claimers, holders[0])
	again, err := dispatch.ClaimRetry(ctx, d, failed.RunID, events.NewID())
	require.NoError(t, err)
	assert.Equal(t, holders[0], again, "the stored state names it")
}
