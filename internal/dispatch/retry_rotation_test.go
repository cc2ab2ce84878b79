package dispatch_test

import (
	"context"
	"errors"
	"strings"
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
	"github.com/actionbus/actionbus/internal/run"
)

// TestHeldResultsOfADeniedRunSurviveAKeyRotationAcrossItsRetry: a
// workflow's two read steps finish while its mutation waits for approval
// (their results are held); the approval is denied, and the end names the
// two results and the denial. The approval keys are then rotated (k1
// retired), so the denial no longer verifies: a rebuild of the ended
// state from the end alone would not end the run and would fall back to
// the state as stored, without the two results. A retry of the failed run
// must still reuse the two completed steps (their effects ran once): a
// run that may be retried has its ended state written after its end.
// (Found by an attacker-minded review of the end as the commit.)
func TestHeldResultsOfADeniedRunSurviveAKeyRotationAcrossItsRetry(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "")
	var mu sync.Mutex
	ran := map[string]int{}
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: func(ex *executor.Executor) error {
		h := func(_ context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
			mu.Lock()
			ran[in["id"].(string)]++
			mu.Unlock()
			return executor.Result[map[string]any]{Output: in}, nil
		}
		return errors.Join(
			executor.Register(ex, executor.Action{Name: "t.hit"}, h),
			executor.Register(ex, executor.Action{Name: "t.mut", Mode: executor.ModeMutate}, h),
		)
	}})
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)
	ctx := ctxT(t)
	keys1 := policy.Keys{"k1": {Secret: approvalKey, Holder: "alice"}}
	stop := startDispatcher(t, srv, dispatch.Config{ApprovalKeys: keys1, ResultLinger: time.Minute, InstanceID: "first",
		RunLimits: events.RunLimits{MaxPlanParallel: 5}})

	wf := client.NewWorkflow("w").
		Step("s1", "t.mut", map[string]any{"id": "s1"}).
		Step("s2", "t.hit", map[string]any{"id": "s2"}).
		Step("s3", "t.hit", map[string]any{"id": "s3"}).Build()
	runID, err := st.Client.Start(ctx, client.RunRequest{UserID: "u1", AllowedModes: []string{"read", "mutate"}, Workflow: wf})
	require.NoError(t, err)
	id := awaitingApproval(t, rec, runID)
	completedSteps(t, rec, runID, 2) // s2 and s3 done, held
	require.NoError(t, st.Client.Deny(ctx, id, "k1", approvalKey, "not now"))
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, actionbus.CodeApprovalDenied, res.Error.Code)
	settled(t, js)
	end := storedEnd(t, js, runID, "failed")
	require.Equal(t, 2, strings.Count(end.Header.Get("Ab-Ended-By"), events.TypeActionCompleted))

	// Key rotation: k1 is retired, k2 takes over.
	stop()
	keys2 := policy.Keys{"k2": {Secret: []byte("fedcba9876543210fedcba9876543210"), Holder: "bob"}}
	var d2 *dispatch.Dispatcher
	startDispatcher(t, srv, dispatch.Config{ApprovalKeys: keys2, InstanceID: "second"}, func(x *dispatch.Dispatcher) { d2 = x })

	prior, err := dispatch.PriorRun(ctx, d2, "", runID)
	require.NoError(t, err)
	assert.Equal(t, run.StatusFailed, prior.Status)
	assert.Equal(t, run.StepStatusDone, prior.Workflow.Steps[1].Status, "s2 completed in the failed run")
	assert.Equal(t, run.StepStatusDone, prior.Workflow.Steps[2].Status, "s3 completed in the failed run")

	work, err := js.Stream(ctx, "AB_WORK")
	require.NoError(t, err)
	before, err := work.Info(ctx)
	require.NoError(t, err)
	retry, err := st.Client.Retry(ctx, runID)
	require.NoError(t, err)
	// The retry's admission stores its work before it asks for approval:
	// once it asks, whatever it handed out is in the stream.
	awaitingApproval(t, rec, retry)
	after, err := work.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, before.State.LastSeq, after.State.LastSeq, "the retry handed out work for s2 or s3, which completed in the failed run")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, map[string]int{"s2": 1, "s3": 1}, ran)
}
