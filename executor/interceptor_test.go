package executor_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
)

// trail records what interceptors and handlers saw, in order.
type trail struct {
	mu    sync.Mutex
	steps []string
}

func (tr *trail) add(s string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.steps = append(tr.steps, s)
}

func (tr *trail) get() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.steps...)
}

// recording is an interceptor that records its entry (with the call's
// action and input) and its exit.
func recording(tr *trail, name string) executor.Interceptor {
	return func(ctx context.Context, call executor.Call, next executor.Next) (executor.Output, error) {
		tr.add(name + "> " + call.Action + " " + string(call.Input))
		out, err := next(ctx, call)
		tr.add("<" + name)
		return out, err
	}
}

func greetHandler(tr *trail) func(ex *executor.Executor) error {
	return func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "test.greet"},
			func(_ context.Context, in greetIn, _ executor.Call) (executor.Result[greetOut], error) {
				tr.add("handler")
				return executor.Result[greetOut]{Output: greetOut{Greeting: "hello " + in.Name}}, nil
			})
	}
}

// Interceptors wrap the handler in order, the first outermost, see the
// call and its validated input, and may change the output (which is then
// validated like a handler's).
func TestInterceptorsWrapTheHandlerFirstOutermost(t *testing.T) {
	tr := &trail{}
	upper := func(ctx context.Context, call executor.Call, next executor.Next) (executor.Output, error) {
		out, err := next(ctx, call)
		if g, ok := out.Output.(greetOut); ok {
			out.Output = greetOut{Greeting: strings.ToUpper(g.Greeting)}
		}
		return out, err
	}
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Register: greetHandler(tr),
		Executor: executor.Config{Interceptors: []executor.Interceptor{recording(tr, "a"), upper, recording(tr, "b")}}})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Action: &client.ActionCall{Name: "test.greet", Args: map[string]any{"name": "ann"}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, map[string]any{"greeting": "HELLO ANN"}, res.Output)
	assert.Equal(t, []string{`a> test.greet {"name":"ann"}`, `b> test.greet {"name":"ann"}`, "handler", "<b", "<a"}, tr.get())
}

// An interceptor may fail a call without calling next (its error's code
// is the call's), a panic in one is handler_failed, and calls the
// protocol refuses before the handler (invalid input) never reach them.
func TestInterceptorsFailCallsAndNeverSeeRefusedOnes(t *testing.T) {
	tr := &trail{}
	guard := func(ctx context.Context, call executor.Call, next executor.Next) (executor.Output, error) {
		var in greetIn
		_ = json.Unmarshal(call.Input, &in)
		switch in.Name {
		case "mallory":
			return executor.Output{}, actionbus.Errorf("forbidden_name", "%s may not be greeted", in.Name)
		case "panic":
			panic("interceptor panicked")
		}
		return next(ctx, call)
	}
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Register: greetHandler(tr),
		Executor: executor.Config{Interceptors: []executor.Interceptor{recording(tr, "a"), guard}}})
	ctx := ctxT(t)
	for name, code := range map[string]actionbus.Code{"mallory": "forbidden_name", "panic": actionbus.CodeHandlerFailed, "": actionbus.CodeActionArgsInvalid} {
		res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.greet", Args: map[string]any{"name": name}}}, nil)
		require.NoError(t, err)
		require.Equal(t, client.StatusFailed, res.Status, name)
		assert.Equal(t, code, res.Error.Code, "%s: %s", name, res.Error.Message)
	}
	steps := tr.get()
	assert.NotContains(t, steps, "handler", "the guard stopped every call before the handler")
	assert.NotContains(t, steps, `a> test.greet {"name":""}`, "an invalid input never reaches the interceptors")
	assert.Contains(t, steps, `a> test.greet {"name":"mallory"}`)
}
