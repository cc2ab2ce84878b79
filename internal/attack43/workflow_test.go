package attack43_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
)

// wfActions are the actions of the workflow attacks: wf.slow answers
// {"v": "from-a"} once the test releases it; wf.record reports its input
// to the test and answers {}.
type wfActions struct {
	slowCalled chan struct{}
	release    chan struct{}
	recorded   chan map[string]any
}

func newWFActions() *wfActions {
	return &wfActions{slowCalled: make(chan struct{}, 8), release: make(chan struct{}), recorded: make(chan map[string]any, 8)}
}

func (w *wfActions) register(ex *executor.Executor) error {
	if err := executor.Register(ex, executor.Action{Name: "wf.slow", Description: "Answers once released."},
		func(ctx context.Context, _ struct{}, _ executor.Call) (executor.Result[map[string]string], error) {
			w.slowCalled <- struct{}{}
			select {
			case <-w.release:
			case <-ctx.Done():
				return executor.Result[map[string]string]{}, ctx.Err()
			}
			return executor.Result[map[string]string]{Output: map[string]string{"v": "from-a"}, Summary: "a"}, nil
		}); err != nil {
		return err
	}
	return executor.Register(ex, executor.Action{Name: "wf.record", Description: "Records its input.",
		InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(_ context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
			w.recorded <- in
			return executor.Result[map[string]any]{Output: map[string]any{}, Summary: "recorded"}, nil
		})
}

// wfStack is a server with the deployed users, the services, and tenant
// acme's client.
func wfStack(t *testing.T, w *wfActions) *client.Client {
	h := actionbustest.NewServer(t, actionbustest.Options{Users: true, Tenants: []string{"acme"}})
	h.ServeIngress(t)
	h.StartStack(t, actionbustest.StackOptions{Register: w.register, NoPlanner: true})
	acme, err := client.New(h.TenantConnect(t, "client-acme", "acme"), client.Options{Tenant: "acme"})
	require.NoError(t, err)
	return acme
}

// TestAStepReferringToAnEarlierStepWaitsForIt attacks the semantic pass
// of workflow.Validate and the dispatcher's ordering. The schema checks a
// {"$fromStep", "path"} reference strictly wherever a value is, but a
// step's input object itself is not a value: an input that has a
// "$fromStep" key that is no string ({"$fromStep": false, ...}) is taken
// whole for a reference by the semantic pass (which then checks nothing,
// its step id not being a string, and does not look inside) and by
// workflow.Dependencies (which records no dependency), while
// workflow.Resolve, seeing no string, resolves the references nested in
// it. So step b, whose input holds a well-formed reference to step a,
// passes validation without its reference being checked, is ready at
// once, runs while a still runs and gets null for a's output.
//
// Safe behaviour: the document is refused (workflow_validation), or b
// waits for a and receives a's output. It FAILS while the hole is open.
func TestAStepReferringToAnEarlierStepWaitsForIt(t *testing.T) {
	w := newWFActions()
	acme := wfStack(t, w)
	ctx := ctxFor(t, 60*time.Second)
	doc := `{"workflowName":"order","steps":[
		{"id":"a","action":"wf.slow","input":{}},
		{"id":"b","action":"wf.record","input":{"$fromStep":false,"got":{"$fromStep":"a","path":""}}}]}`
	runID, err := acme.Start(ctx, client.RunRequest{WorkflowJSON: json.RawMessage(doc)})
	require.NoError(t, err)
	ended := make(chan *client.Result, 1)
	go func() {
		res, err := acme.Wait(ctx, runID)
		if err != nil {
			res = &client.Result{Status: "wait failed: " + err.Error()}
		}
		ended <- res
	}()
	select {
	case res := <-ended:
		require.NotNil(t, res.Error, "the run ended before a step ran: %+v", res)
		assert.Equal(t, actionbus.CodeWorkflowValidation, res.Error.Code, "refused, but not as a validation: %v", res.Error)
		return
	case <-w.slowCalled:
	case <-ctx.Done():
		t.Fatal("step a never ran and the run never ended")
	}
	// a runs, and is held. b refers to a: it must not run now.
	select {
	case in := <-w.recorded:
		close(w.release)
		assert.Fail(t, "step b ran while step a was running", "b's input: %v", in)
		return
	case <-time.After(3 * time.Second):
	}
	close(w.release)
	select {
	case in := <-w.recorded:
		assert.Equal(t, map[string]any{"v": "from-a"}, in["got"], "b got a's output")
	case res := <-ended:
		t.Fatalf("the run ended without running b: %+v", res)
	}
}

// TestAStepInputThatIsAReferenceIsCheckedLikeOne attacks the same gap
// from the other side: a step's whole input may be a reference
// ({"$fromStep": "a", "path": ...}: the step's input is a value of a's
// output), but as the input object is no value of the schema, what the
// schema requires of every other reference is not required of it, and a
// reference hidden in an input whose "$fromStep" is no string is not
// checked at all. Each document below passes validation and runs; each
// must be refused with workflow_validation before any step runs:
//   - a path that is no JSON Pointer ("xv": Resolve drops its first
//     character and reads /v, a string, so b runs with {});
//   - a field beside the reference (silently dropped);
//   - no path;
//   - a reference to no step, or to a later step, inside an input whose
//     "$fromStep" is no string (the step runs at once with null).
//
// It FAILS while the hole is open.
func TestAStepInputThatIsAReferenceIsCheckedLikeOne(t *testing.T) {
	w := newWFActions()
	close(w.release)
	acme := wfStack(t, w)
	for _, tc := range []struct{ name, b string }{
		{"path no pointer", `{"id":"b","action":"wf.record","input":{"$fromStep":"a","path":"xv"}}`},
		{"field beside the reference", `{"id":"b","action":"wf.record","input":{"$fromStep":"a","path":"","note":"dropped"}}`},
		{"no path", `{"id":"b","action":"wf.record","input":{"$fromStep":"a"}}`},
		{"hidden reference to no step", `{"id":"b","action":"wf.record","input":{"$fromStep":false,"got":{"$fromStep":"nosuch","path":""}}}`},
		{"hidden reference to a later step", `{"id":"b","action":"wf.record","input":{"$fromStep":0,"got":{"$fromStep":"c","path":""}}},{"id":"c","action":"wf.slow","input":{}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxFor(t, 60*time.Second)
			doc := `{"workflowName":"refs","steps":[{"id":"a","action":"wf.slow","input":{}},` + tc.b + `]}`
			res, err := acme.Run(ctx, client.RunRequest{WorkflowJSON: json.RawMessage(doc)}, nil)
			require.NoError(t, err)
			var ran []map[string]any
			for len(w.recorded) > 0 {
				ran = append(ran, <-w.recorded)
			}
			for len(w.slowCalled) > 0 {
				<-w.slowCalled
			}
			if assert.NotNil(t, res.Error, "the document was accepted and run; b ran with %v", ran) {
				assert.Equal(t, actionbus.CodeWorkflowValidation, res.Error.Code, "%v", res.Error)
			}
		})
	}
}
