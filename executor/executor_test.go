package executor_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/actions/actionstore"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/registrar"
)

type greetIn struct {
	Name string `json:"name" jsonschema:"minLength=1"`
}

type greetOut struct {
	Greeting string `json:"greeting"`
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRegisteringANameTwiceFails(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	ex, err := executor.New(srv.Conn, executor.Config{})
	require.NoError(t, err)
	h := func(context.Context, greetIn, executor.Call) (executor.Result[greetOut], error) {
		return executor.Result[greetOut]{}, nil
	}
	require.NoError(t, executor.Register(ex, executor.Action{Name: "greet"}, h))
	err = executor.Register(ex, executor.Action{Name: "greet"}, h)
	assert.ErrorIs(t, err, actionbus.ErrActionExists)
	assert.Equal(t, actionbus.CodeActionAlreadyExists, actionbus.CodeOf(err))

	for _, bad := range []executor.Action{
		{Name: "has space"},
		{Name: "x", Mode: "destroy"},
		{Name: "y", Tier: 4},
		{Name: "z", InputSchema: json.RawMessage(`{"type": 12}`)},
	} {
		assert.Error(t, executor.Register(ex, bad, h), "%+v", bad)
	}
}

// failing registers actions that fail in every way a handler can.
func failing(ex *executor.Executor) error {
	type empty struct{}
	regs := []error{
		executor.Register(ex, executor.Action{Name: "test.greet"},
			func(_ context.Context, in greetIn, _ executor.Call) (executor.Result[greetOut], error) {
				return executor.Result[greetOut]{Output: greetOut{Greeting: "hello " + in.Name}}, nil
			}),
		executor.Register(ex, executor.Action{Name: "test.coded"},
			func(context.Context, empty, executor.Call) (executor.Result[empty], error) {
				return executor.Result[empty]{}, actionbus.Errorf("quota_exceeded", "tenant is over quota")
			}),
		executor.Register(ex, executor.Action{Name: "test.plain"},
			func(context.Context, empty, executor.Call) (executor.Result[empty], error) {
				return executor.Result[empty]{}, errors.New("database is down")
			}),
		executor.Register(ex, executor.Action{Name: "test.panic"},
			func(context.Context, empty, executor.Call) (executor.Result[empty], error) {
				panic("boom")
			}),
		executor.Register(ex, executor.Action{Name: "test.slow", Timeout: 50 * time.Millisecond},
			func(ctx context.Context, _ empty, _ executor.Call) (executor.Result[empty], error) {
				<-ctx.Done()
				return executor.Result[empty]{}, ctx.Err()
			}),
		executor.Register(ex, executor.Action{Name: "test.badOutput", OutputSchema: json.RawMessage(`{"type":"object","required":["id"]}`)},
			func(context.Context, empty, executor.Call) (executor.Result[map[string]any], error) {
				return executor.Result[map[string]any]{Output: map[string]any{"name": "no id"}}, nil
			}),
	}
	return errors.Join(regs...)
}

func TestHandlerFailuresBecomeCodedResults(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Register: failing})
	ctx := ctxT(t)
	cases := []struct {
		action string
		args   map[string]any
		code   actionbus.Code
	}{
		{"test.greet", map[string]any{"name": ""}, actionbus.CodeActionArgsInvalid},
		{"test.greet", map[string]any{"name": "ann", "extra": true}, actionbus.CodeActionArgsInvalid},
		{"test.coded", nil, "quota_exceeded"},
		{"test.plain", nil, actionbus.CodeHandlerFailed},
		{"test.panic", nil, actionbus.CodeHandlerFailed},
		{"test.slow", nil, actionbus.CodeTimeout},
		{"test.badOutput", nil, actionbus.CodeSchemaValidation},
	}
	for _, c := range cases {
		t.Run(c.action+"/"+string(c.code), func(t *testing.T) {
			res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: c.action, Args: c.args}}, nil)
			require.NoError(t, err)
			require.Equal(t, client.StatusFailed, res.Status)
			assert.Equal(t, c.code, res.Error.Code, res.Error.Message)
			assert.NotEmpty(t, res.Error.Message)
		})
	}
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "test.greet", Args: map[string]any{"name": "ann"}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status)
	assert.Equal(t, map[string]any{"greeting": "hello ann"}, res.Output)
}

func TestCatalogListsRegisteredActionsWithDerivedSchemas(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Register: failing})
	list, err := st.Client.Actions(ctxT(t))
	require.NoError(t, err)
	names := []string{}
	for _, a := range list {
		names = append(names, a.Name)
		assert.Equal(t, "default", a.Pool)
		assert.Len(t, a.Hash, 64)
	}
	assert.Equal(t, []string{"test.badOutput", "test.coded", "test.greet", "test.panic", "test.plain", "test.slow"}, names)
	var schema map[string]any
	require.NoError(t, json.Unmarshal(list[2].InputSchema, &schema))
	assert.Equal(t, []any{"name"}, schema["required"])
	assert.Equal(t, false, schema["additionalProperties"])
}

// startRegistrar serves the registrar (which the dispatcher hosts) on srv
// until the test ends.
func startRegistrar(t *testing.T, srv *actionbustest.Server) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	eb, err := bus.Open(srv.Conn, bus.BusConfig{Source: "/actionbus/dispatcher/test"})
	require.NoError(t, err)
	topo := bus.Topology{}
	cat, err := srv.JS.KeyValue(ctx, topo.BucketCatalog())
	require.NoError(t, err)
	owners, err := srv.JS.KeyValue(ctx, topo.BucketCatalogOwners())
	require.NoError(t, err)
	require.NoError(t, registrar.New(eb, cat, owners, nil).Serve(ctx, srv.Conn))
}

func TestSameVersionWithAnotherDefinitionConflicts(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	startRegistrar(t, srv)
	ctx := ctxT(t)
	start := func(desc, version string) error {
		ex, err := executor.New(srv.Conn, executor.Config{})
		require.NoError(t, err)
		require.NoError(t, executor.Register(ex, executor.Action{Name: "test.v", Description: desc, Version: version},
			func(context.Context, greetIn, executor.Call) (executor.Result[greetOut], error) {
				return executor.Result[greetOut]{}, nil
			}))
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- ex.Run(runCtx) }()
		select {
		case <-ex.Ready():
			cancel()
			return <-done
		case err := <-done:
			cancel()
			return err
		}
	}
	require.NoError(t, start("first", "1"))
	require.NoError(t, start("first", "1"), "the same definition again is fine")
	err := start("changed", "1")
	assert.Equal(t, actionbus.CodeCatalogConflict, actionbus.CodeOf(err), "%v", err)
	require.NoError(t, start("changed", "2"), "a new version replaces the old")
}

func TestHiddenActionsStayOutOfThePlannerListing(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		type in struct{}
		h := func(context.Context, in, executor.Call) (executor.Result[in], error) {
			return executor.Result[in]{}, nil
		}
		return errors.Join(
			executor.Register(ex, executor.Action{Name: "visible", Permission: &executor.Permission{Effect: "external_network"}}, h),
			executor.Register(ex, executor.Action{Name: "hidden", Planner: &executor.PlannerMeta{Hidden: true}}, h),
		)
	}})
	list, err := st.Client.Actions(ctxT(t))
	require.NoError(t, err)
	require.Len(t, list, 2)
	assert.Equal(t, "hidden", list[0].Name)
	assert.False(t, list[0].PlannerVisible)
	assert.True(t, list[1].PlannerVisible)
	assert.Equal(t, "external_network", list[1].Permission.Effect)
	assert.Equal(t, "fallback", list[1].Permission.Source)
	assert.True(t, list[1].Permission.ReadOnly, "a read action without metadata is read-only")
}

// runUntilReady runs ex until it is ready (nil) or Run returns (its
// error); the executor is stopped at the end of the test.
func runUntilReady(t *testing.T, ex *executor.Executor) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ex.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-ex.Ready():
		return nil
	case err := <-done:
		done <- err
		return err
	case <-time.After(20 * time.Second):
		return errors.New("neither ready nor failed")
	}
}

// An executor announcing an action another pool owns does not start: the
// registrar refuses with catalog_conflict naming both pools, and the
// owner's entry is unchanged.
func TestAnExecutorAnnouncingAnotherPoolsActionDoesNotStart(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{Pools: []string{"default", "payments"}})
	startRegistrar(t, srv)
	h := func(context.Context, greetIn, executor.Call) (executor.Result[greetOut], error) {
		return executor.Result[greetOut]{}, nil
	}
	owner, err := executor.New(srv.Conn, executor.Config{Pool: "payments"})
	require.NoError(t, err)
	require.NoError(t, executor.Register(owner, executor.Action{Name: "billing.refund", Mode: executor.ModeMutate, Tier: 2}, h))
	require.NoError(t, runUntilReady(t, owner))

	intruder, err := executor.New(srv.Conn, executor.Config{Pool: "default"})
	require.NoError(t, err)
	require.NoError(t, executor.Register(intruder, executor.Action{Name: "billing.refund", Mode: executor.ModeRead}, h))
	err = runUntilReady(t, intruder)
	require.ErrorIs(t, err, actionbus.ErrCatalogConflict)
	assert.Contains(t, err.Error(), "payments")
	assert.Contains(t, err.Error(), "default")

	// The catalog as the registrar wrote it (no dispatcher, so no read
	// service, runs here).
	kv, err := srv.JS.KeyValue(ctxT(t), bus.Topology{}.BucketCatalog())
	require.NoError(t, err)
	list, err := actionstore.NewCatalog(kv).List(ctxT(t))
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, "payments", list[0].Pool)
	assert.Equal(t, "mutate", string(list[0].Mode))
}

// With no registrar answering, an executor retries its announcement until
// AnnounceTimeout, then fails with registrar_unavailable; one that starts
// while it retries is answered.
func TestAnExecutorWaitsForARegistrarWithinItsDeadline(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	h := func(context.Context, greetIn, executor.Call) (executor.Result[greetOut], error) {
		return executor.Result[greetOut]{}, nil
	}
	ex, err := executor.New(srv.Conn, executor.Config{AnnounceTimeout: 500 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, executor.Register(ex, executor.Action{Name: "test.greet"}, h))
	start := time.Now()
	err = runUntilReady(t, ex)
	assert.Equal(t, actionbus.CodeRegistrarUnavailable, actionbus.CodeOf(err), "%v", err)
	assert.Less(t, time.Since(start), 10*time.Second)

	late, err := executor.New(srv.Conn, executor.Config{})
	require.NoError(t, err)
	require.NoError(t, executor.Register(late, executor.Action{Name: "test.greet"}, h))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- late.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	// The registrar starts while the executor waits for one.
	startRegistrar(t, srv)
	select {
	case <-late.Ready():
	case err := <-done:
		t.Fatalf("the executor gave up: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the executor did not start once a registrar answered")
	}
}
