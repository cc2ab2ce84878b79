package dispatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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
	"github.com/actionbus/actionbus/internal/dispatch"
)

// wfActions are the actions of the workflow tests.
type wfActions struct {
	flakyCalls atomic.Int32
	mu         sync.Mutex
	inFlight   int
	maxSeen    int
	gate       chan struct{}
}

func (w *wfActions) register(ex *executor.Executor) error {
	type jobs struct {
		Status []string `json:"status,omitempty"`
		JobIDs []string `json:"jobIds,omitempty"`
	}
	return errors.Join(
		executor.Register(ex, executor.Action{Name: "wf.search"}, func(_ context.Context, in jobs, _ executor.Call) (executor.Result[jobs], error) {
			return executor.Result[jobs]{Output: jobs{JobIDs: []string{"job_1", "job_2"}}}, nil
		}),
		executor.Register(ex, executor.Action{Name: "wf.count", Mode: executor.ModeDryRun}, func(_ context.Context, in jobs, _ executor.Call) (executor.Result[map[string]any], error) {
			return executor.Result[map[string]any]{Output: map[string]any{"count": len(in.JobIDs)}}, nil
		}),
		executor.Register(ex, executor.Action{Name: "wf.flaky"}, func(_ context.Context, _ map[string]any, call executor.Call) (executor.Result[map[string]any], error) {
			if w.flakyCalls.Add(1) == 1 {
				return executor.Result[map[string]any]{}, actionbus.Errorf("flaky", "first attempt fails")
			}
			return executor.Result[map[string]any]{Output: map[string]any{"attempt": call.Attempt}}, nil
		}),
		executor.Register(ex, executor.Action{Name: "wf.broken"}, func(context.Context, map[string]any, executor.Call) (executor.Result[map[string]any], error) {
			return executor.Result[map[string]any]{}, actionbus.Errorf("broken", "always fails")
		}),
		executor.Register(ex, executor.Action{Name: "wf.sleepy"}, func(ctx context.Context, _ map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
			<-ctx.Done()
			return executor.Result[map[string]any]{}, ctx.Err()
		}),
		executor.Register(ex, executor.Action{Name: "wf.gated"}, func(ctx context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
			w.mu.Lock()
			w.inFlight++
			w.maxSeen = max(w.maxSeen, w.inFlight)
			w.mu.Unlock()
			defer func() { w.mu.Lock(); w.inFlight--; w.mu.Unlock() }()
			select {
			case <-w.gate:
			case <-ctx.Done():
				return executor.Result[map[string]any]{}, ctx.Err()
			}
			return executor.Result[map[string]any]{Output: in}, nil
		}),
		executor.Register(ex, executor.Action{Name: "wf.mutate", Mode: executor.ModeMutate}, func(_ context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
			return executor.Result[map[string]any]{Output: in}, nil
		}),
		executor.Register(ex, executor.Action{Name: "wf.mutateFlaky", Mode: executor.ModeMutate}, func(_ context.Context, in map[string]any, call executor.Call) (executor.Result[map[string]any], error) {
			if call.Attempt == 1 {
				return executor.Result[map[string]any]{}, actionbus.Errorf("flaky", "first attempt fails")
			}
			return executor.Result[map[string]any]{Output: map[string]any{"attempt": call.Attempt}}, nil
		}),
	)
}

func startWF(t *testing.T, opts actionbustest.StackOptions) (*actionbustest.Recorder, *actionbustest.Stack, *wfActions) {
	t.Helper()
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "")
	w := &wfActions{gate: make(chan struct{})}
	opts.Register = w.register
	if opts.ApprovalKeys == "" {
		opts.ApprovalKeys = approvalKeys()
	}
	return rec, srv.StartStack(t, opts), w
}

func output(res *client.Result) (map[string]any, []any) {
	o := res.Output.(map[string]any)
	return o["outputByStep"].(map[string]any), o["steps"].([]any)
}

func TestWorkflowReferencesRetriesAndContinueOnError(t *testing.T) {
	_, st, w := startWF(t, actionbustest.StackOptions{})
	ctx := ctxT(t)
	wf := client.NewWorkflow("triage").
		Step("jobs", "wf.search", map[string]any{"status": []any{"FAILED"}}).
		Step("count", "wf.count", map[string]any{"jobIds": client.FromStep("jobs", "/jobIds")}).
		Step("flaky", "wf.flaky", nil, client.Retry(2, 10, false)).
		Step("broken", "wf.broken", nil, client.ContinueOnError()).
		Step("after", "wf.count", map[string]any{"jobIds": client.FromStep("jobs", "/jobIds")}).
		Build()
	res, err := st.Client.Run(ctx, client.RunRequest{Workflow: wf}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	byStep, steps := output(res)
	assert.Equal(t, map[string]any{"count": 2.0}, byStep["count"], "the reference resolved")
	assert.Equal(t, map[string]any{"attempt": 2.0}, byStep["flaky"], "failed once with 2 attempts, then succeeded")
	assert.Equal(t, map[string]any{"ok": false, "error": map[string]any{"code": "broken", "message": "always fails"}}, byStep["broken"])
	assert.Equal(t, map[string]any{"count": 2.0}, byStep["after"], "later steps ran after a continued failure")
	ids := []string{}
	for _, s := range steps {
		ids = append(ids, s.(map[string]any)["id"].(string))
	}
	assert.Equal(t, []string{"jobs", "count", "flaky", "broken", "after"}, ids, "declaration order")
	assert.Equal(t, 2.0, steps[2].(map[string]any)["attempts"])
	assert.Equal(t, int32(2), w.flakyCalls.Load())
}

func TestWorkflowFailuresAndTimeouts(t *testing.T) {
	_, st, _ := startWF(t, actionbustest.StackOptions{})
	ctx := ctxT(t)
	res, err := st.Client.Run(ctx, client.RunRequest{Workflow: client.NewWorkflow("w").
		Step("a", "wf.broken", nil, client.Retry(2, 0, false)).Step("b", "wf.search", nil).Build()}, nil)
	require.NoError(t, err)
	assert.Equal(t, actionbus.CodeWorkflowExecution, res.Error.Code)
	assert.Equal(t, "a", res.Error.Details["step"])
	assert.Equal(t, 2.0, res.Error.Details["attempts"])

	res, err = st.Client.Run(ctx, client.RunRequest{Workflow: client.NewWorkflow("w").
		Step("slow", "wf.sleepy", nil, client.Timeout(100)).Build()}, nil)
	require.NoError(t, err)
	assert.Equal(t, actionbus.CodeWorkflowExecution, res.Error.Code)
	cause := res.Error.Details["cause"].(map[string]any)
	assert.Equal(t, "timeout", cause["code"])

	res, err = st.Client.Run(ctx, client.RunRequest{Workflow: &client.Workflow{WorkflowName: "w", Steps: []client.WorkflowStep{
		{ID: "a", Action: "wf.search", Input: map[string]any{}, Retry: &client.WorkflowRetry{MaxAttempts: 0}}}}}, nil)
	require.NoError(t, err)
	assert.ErrorIs(t, res.Error, actionbus.ErrWorkflowValidation)
	issues := res.Error.Details["issues"].([]any)
	assert.Equal(t, "/steps/0/retry/maxAttempts", issues[0].(map[string]any)["path"])

	// A document given as JSON travels as it is: a field no typed
	// workflow has is the dispatcher's to refuse, at its path.
	res, err = st.Client.Run(ctx, client.RunRequest{WorkflowJSON: []byte(`{"workflowName": "w", "owner": "ada",
		"steps": [{"id": "a", "action": "wf.search", "input": {}}]}`)}, nil)
	require.NoError(t, err)
	require.ErrorIs(t, res.Error, actionbus.ErrWorkflowValidation)
	issue := res.Error.Details["issues"].([]any)[0].(map[string]any)
	assert.Equal(t, []any{"unknown_field", "/owner"}, []any{issue["code"], issue["path"]})

	_, err = st.Client.Start(ctx, client.RunRequest{Workflow: client.NewWorkflow("w").Step("a", "wf.search", nil).Build(),
		WorkflowJSON: []byte(`{}`)})
	assert.ErrorIs(t, err, actionbus.ErrWorkflowValidation, "a request with a typed and a JSON workflow is refused before it is sent")
}

func TestIndependentStepsRunInParallelAndReportInDeclarationOrder(t *testing.T) {
	_, st, w := startWF(t, actionbustest.StackOptions{Limits: events.RunLimits{MaxPlanParallel: 3}, Slots: 8})
	ctx := ctxT(t)
	b := client.NewWorkflow("fan-out")
	for _, id := range []string{"s1", "s2", "s3", "s4", "s5"} {
		b.Step(id, "wf.gated", map[string]any{"id": id})
	}
	runID, err := st.Client.Start(ctx, client.RunRequest{Workflow: b.Build()})
	require.NoError(t, err)
	for released := 0; released < 5; released++ {
		require.Eventually(t, func() bool {
			w.mu.Lock()
			defer w.mu.Unlock()
			return w.inFlight == min(3, 5-released)
		}, 10*time.Second, time.Millisecond)
		w.gate <- struct{}{}
	}
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	w.mu.Lock()
	assert.Equal(t, 3, w.maxSeen, "independent steps ran in parallel, bounded")
	w.mu.Unlock()
	_, steps := output(res)
	for i, s := range steps {
		assert.Equal(t, []string{"s1", "s2", "s3", "s4", "s5"}[i], s.(map[string]any)["id"])
	}
}

func TestACancelDuringARetryDelayAbortsTheWorkflow(t *testing.T) {
	rec, st, _ := startWF(t, actionbustest.StackOptions{})
	ctx := ctxT(t)
	runID, err := st.Client.Start(ctx, client.RunRequest{Workflow: client.NewWorkflow("w").
		Step("a", "wf.broken", nil, client.Retry(3, 60000, false)).Build()})
	require.NoError(t, err)
	waitStep(t, rec, runID, "workflow-step-retry")
	require.NoError(t, st.Client.Cancel(ctx, runID, "stop"))
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	assert.Equal(t, actionbus.CodeWorkflowAborted, res.Error.Code)
	assert.Equal(t, 1, rec.Count(func(r actionbustest.Recorded) bool {
		return r.Type() == events.TypeActionRequested && r.Event.Extensions()[events.ExtRunID] == runID
	}), "the handler was not called again")
}

// TestARetriedMutateStepIsApprovedAgain: each attempt of a mutate step has
// its own approval (its own id), so the retry can be approved; the first
// attempt's id is refused as a replay.
func TestARetriedMutateStepIsApprovedAgain(t *testing.T) {
	rec, st, _ := startWF(t, actionbustest.StackOptions{})
	ctx := ctxT(t)
	runID, err := st.Client.Start(ctx, client.RunRequest{AllowedModes: []string{"read", "mutate"}, Workflow: client.NewWorkflow("w").
		Step("m", "wf.mutateFlaky", map[string]any{"n": 1}, client.Retry(2, 0, false)).Build()})
	require.NoError(t, err)
	awaiting := func(n int) string {
		rs := rec.WaitForN(t, 0, n, func(r actionbustest.Recorded) bool {
			var s events.RunStep
			return events.IsRunStep(r.Type()) && events.DataAs(r.Event, &s) == nil && s.RunID == runID && s.Name == "awaiting-approval"
		})
		var s events.RunStep
		require.NoError(t, events.DataAs(rs[n-1].Event, &s))
		return s.Details["approvalId"].(string)
	}
	first := awaiting(1)
	require.NoError(t, st.Client.Approve(ctx, first, "k1", approvalKey))
	second := awaiting(2)
	assert.NotEqual(t, first, second, "the retry has its own approval")
	assert.ErrorIs(t, st.Client.Approve(ctx, first, "k1", approvalKey), &actionbus.Error{Code: actionbus.CodeApprovalReplayed})
	require.NoError(t, st.Client.Approve(ctx, second, "k1", approvalKey))
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	byStep, _ := output(res)
	assert.Equal(t, map[string]any{"attempt": 2.0}, byStep["m"])
}

func TestTwoPendingApprovalsAnsweredInEitherOrder(t *testing.T) {
	for _, order := range [][2]int{{0, 1}, {1, 0}} {
		t.Run("", func(t *testing.T) {
			rec, st, _ := startWF(t, actionbustest.StackOptions{})
			ctx := ctxT(t)
			runID, err := st.Client.Start(ctx, client.RunRequest{AllowedModes: []string{"read", "mutate"}, Workflow: client.NewWorkflow("w").
				Step("m1", "wf.mutate", map[string]any{"n": 1}).Step("m2", "wf.mutate", map[string]any{"n": 2}).Build()})
			require.NoError(t, err)
			var ids []string
			for _, r := range rec.WaitForN(t, 0, 2, func(r actionbustest.Recorded) bool {
				var s events.RunStep
				return events.IsRunStep(r.Type()) && events.DataAs(r.Event, &s) == nil && s.RunID == runID && s.Name == "awaiting-approval"
			}) {
				var s events.RunStep
				require.NoError(t, events.DataAs(r.Event, &s))
				ids = append(ids, s.Details["approvalId"].(string))
			}
			require.Len(t, ids, 2)
			assert.NotEqual(t, ids[0], ids[1], "each approval has its own id")
			for _, i := range order {
				require.NoError(t, st.Client.Approve(ctx, ids[i], "k1", approvalKey))
			}
			res, err := st.Client.Wait(ctx, runID)
			require.NoError(t, err)
			require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
			byStep, _ := output(res)
			assert.Equal(t, map[string]any{"n": 1.0}, byStep["m1"])
			assert.Equal(t, map[string]any{"n": 2.0}, byStep["m2"])
		})
	}
}

// TestWorkflowStateStaysBoundedOver20StepsOf250KB: the documented bound.
// Twenty steps each return 250 KB (5 MB in all, five times the server's
// 1 MB max payload); the last one reads a field out of the first one's
// output. Run state keeps each large output as an artifact reference, so
// the run completes, its stored state stays small, and every output can be
// read back whole.
func TestWorkflowStateStaysBoundedOver20StepsOf250KB(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	const size = 250 << 10
	var d *dispatch.Dispatcher
	startDispatcher(t, srv, dispatch.Config{}, func(x *dispatch.Dispatcher) { d = x })
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, Register: func(ex *executor.Executor) error {
		return errors.Join(
			executor.Register(ex, executor.Action{Name: "wf.big"}, func(_ context.Context, _ map[string]any, call executor.Call) (executor.Result[map[string]any], error) {
				return executor.Result[map[string]any]{Output: map[string]any{"blob": strings.Repeat("b", size), "call": call.CallID}}, nil
			}),
			executor.Register(ex, executor.Action{Name: "wf.len"}, func(_ context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
				s, _ := in["blob"].(string)
				return executor.Result[map[string]any]{Output: map[string]any{"len": len(s)}}, nil
			}))
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wf := client.NewWorkflow("big")
	for i := range 19 {
		wf = wf.Step(fmt.Sprintf("s%d", i), "wf.big", nil)
	}
	wf = wf.Step("last", "wf.len", map[string]any{"blob": map[string]any{"$fromStep": "s0", "path": "/blob"}})
	res, err := st.Client.Run(ctx, client.RunRequest{Workflow: wf.Build()}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	byStep, _ := output(res)
	require.Len(t, byStep, 20)
	assert.Equal(t, float64(size), byStep["last"].(map[string]any)["len"], "a step reads a large output of an earlier one whole")
	ref, ok := byStep["s7"].(map[string]any)["artifact"].(map[string]any)
	require.True(t, ok, "a large output is kept by reference: %v", byStep["s7"])
	data, _, err := st.Client.Artifact(ctx, ref["id"].(string))
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(data, &out))
	assert.Len(t, out["blob"], size)
	assert.NotEmpty(t, out["call"])

	// The run's end is its last write: the state stored, if any (a run
	// admitted unstored that ends within the alarm's delay has none), is
	// the one before it, with the last step's call — its 250 KB input — in
	// flight.
	kv, err := srv.JS.KeyValue(ctx, "ab_runs")
	require.NoError(t, err)
	if entry, err := kv.Get(ctx, res.RunID); err == nil {
		assert.Less(t, len(entry.Value()), 64<<10+size, "the stored run state of 20 large steps holds references and one input in flight")
	} else {
		require.ErrorIs(t, err, jetstream.ErrKeyNotFound)
	}
	ended, err := dispatch.EndedState(ctx, d, "", res.RunID)
	require.NoError(t, err)
	b, err := ended.Encode()
	require.NoError(t, err)
	assert.Less(t, len(b), 64<<10, "the ended run state of 20 large steps stays small")
}

// TestARunWhoseStateOutgrowsTheMaxPayloadFailsAtOnce: five steps in
// flight at once, each given the same 250 KB string as input, need a run
// state over the server's 1 MB max payload (the calls' arguments travel
// with the state). The run fails promptly with payload_too_large, naming
// the limit, instead of retrying an impossible write until its deadline.
func TestARunWhoseStateOutgrowsTheMaxPayloadFailsAtOnce(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return errors.Join(
			executor.Register(ex, executor.Action{Name: "wf.big"}, func(context.Context, map[string]any, executor.Call) (executor.Result[map[string]any], error) {
				return executor.Result[map[string]any]{Output: map[string]any{"blob": strings.Repeat("b", 250<<10)}}, nil
			}),
			executor.Register(ex, executor.Action{Name: "wf.len"}, func(_ context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
				return executor.Result[map[string]any]{Output: map[string]any{}}, nil
			}))
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wf := client.NewWorkflow("big").Step("s0", "wf.big", nil)
	for i := range 5 {
		wf = wf.Step(fmt.Sprintf("use%d", i), "wf.len", map[string]any{"blob": map[string]any{"$fromStep": "s0", "path": "/blob"}})
	}
	res, err := st.Client.Run(ctx, client.RunRequest{Workflow: wf.Build()}, nil)
	require.NoError(t, err, "the run did not end long before its deadline")
	require.Equal(t, client.StatusFailed, res.Status)
	assert.Equal(t, actionbus.CodePayloadTooLarge, res.Error.Code, "%+v", res.Error)
	assert.NotZero(t, res.Error.Details["limit"])
}

// TestRetryResumesAFailedWorkflowAtItsFailedStep: a 4-step workflow whose
// step 3 fails once; the retry completes it with steps 1 and 2 not run
// again (handler counters), step 3 run once more and step 4 once.
func TestRetryResumesAFailedWorkflowAtItsFailedStep(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	var mu sync.Mutex
	ran := map[string]int{}
	st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "wf.count"}, func(_ context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
			step, _ := in["step"].(string)
			mu.Lock()
			ran[step]++
			n := ran[step]
			mu.Unlock()
			if step == "s3" && n == 1 {
				return executor.Result[map[string]any]{}, actionbus.Errorf("flaky", "s3 fails the first time")
			}
			return executor.Result[map[string]any]{Output: map[string]any{"step": step}}, nil
		})
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A chain: each step needs the one before, so s1 and s2 have
	// completed when s3 fails (steps still in flight when a run fails are
	// not completed, and a retry runs them again).
	wf := client.NewWorkflow("four").Step("s1", "wf.count", map[string]any{"step": "s1"})
	for i, s := range []string{"s2", "s3", "s4"} {
		wf = wf.Step(s, "wf.count", map[string]any{"step": s, "after": client.FromStep(fmt.Sprintf("s%d", i+1), "/step")})
	}
	doc := wf.Build()
	first, err := st.Client.Run(ctx, client.RunRequest{Workflow: doc, UserID: "u1"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, first.Status)

	id, err := st.Client.Retry(ctx, first.RunID)
	require.NoError(t, err)
	res, err := st.Client.Wait(ctx, id)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, map[string]int{"s1": 1, "s2": 1, "s3": 2, "s4": 1}, ran)
	byStep, _ := output(res)
	assert.Equal(t, map[string]any{"step": "s1"}, byStep["s1"], "the reused output is the run's too")

	// The link is visible both ways in the audit trail.
	require.Eventually(t, func() bool {
		recs, err := st.Client.AuditRecords(ctx, first.RunID)
		return err == nil && slices.ContainsFunc(recs, func(r client.AuditRecord) bool { return r.RetriedBy == id })
	}, 10*time.Second, 50*time.Millisecond, "the failed run's trail names its retry")
	require.Eventually(t, func() bool {
		recs, err := st.Client.AuditRecords(ctx, id)
		return err == nil && slices.ContainsFunc(recs, func(r client.AuditRecord) bool {
			return r.EventType == events.TypeRunRequested && r.RetryOf == first.RunID
		})
	}, 10*time.Second, 50*time.Millisecond, "the retry's trail names the failed run")
}
