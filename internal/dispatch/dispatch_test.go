package dispatch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/audit"
	"github.com/actionbus/actionbus/internal/bus"
)

type indexIn struct {
	Index int `json:"index"`
}

type indexOut struct {
	Index    int    `json:"index"`
	Executor string `json:"executor"`
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

const reverseScenario = `
scenarios:
  reverse:
    decisions:
      - type: plan
        actions:
          - {type: action, name: test.ordered, args: {index: 0}}
          - {type: action, name: test.ordered, args: {index: 1}}
          - {type: action, name: test.ordered, args: {index: 2}}
      - type: final
        answer: '{{ range .Last }}{{ .Output.index }}{{ end }}'
`

func TestPlanResultsKeepDeclarationOrder(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	var mu sync.Mutex
	finished := []int{}
	// Handler i waits for handler i+1 to finish, so they finish 2, 1, 0.
	done := [3]chan struct{}{make(chan struct{}), make(chan struct{}), make(chan struct{})}
	st := srv.StartStack(t, actionbustest.StackOptions{
		Scenarios: reverseScenario,
		Register: func(ex *executor.Executor) error {
			return executor.Register(ex, executor.Action{Name: "test.ordered", Description: "finishes in reverse order"},
				func(ctx context.Context, in indexIn, _ executor.Call) (executor.Result[indexOut], error) {
					if in.Index < 2 {
						select {
						case <-done[in.Index+1]:
						case <-ctx.Done():
							return executor.Result[indexOut]{}, ctx.Err()
						}
					}
					mu.Lock()
					finished = append(finished, in.Index)
					mu.Unlock()
					close(done[in.Index])
					return executor.Result[indexOut]{Output: indexOut{Index: in.Index}, Summary: fmt.Sprint(in.Index)}, nil
				})
		},
	})
	ctx := ctxT(t)
	var steps []client.Step
	res, err := st.Client.Run(ctx, client.RunRequest{Prompt: "order", Scenario: "reverse"}, func(e client.Event) {
		if s, ok := e.Step(); ok {
			steps = append(steps, s)
		}
	})
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, []int{2, 1, 0}, finished, "handlers finished in reverse order")
	assert.Equal(t, "012", res.Answer, "observations are in declaration order")

	var names []string
	for _, s := range steps {
		names = append(names, s.Name)
	}
	assert.Contains(t, names, "plan-executing")
	assert.Contains(t, names, "plan-executed")
}

func TestTwoExecutorsShareOnePool(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	var mu sync.Mutex
	started := 0
	bothStarted := make(chan struct{})
	runs := map[string]int{}
	st := srv.StartStack(t, actionbustest.StackOptions{
		Scenarios: `
scenarios:
  pair:
    decisions:
      - type: plan
        actions:
          - {type: action, name: test.rendezvous, args: {index: 0}}
          - {type: action, name: test.rendezvous, args: {index: 1}}
      - {type: final, answer: '{{ range .Last }}{{ .Output.executor }} {{ end }}'}
`,
		Executors: 2,
		Slots:     1,
		Register: func(ex *executor.Executor) error {
			id := ex.ID()
			return executor.Register(ex, executor.Action{Name: "test.rendezvous", Description: "waits until two calls run at once"},
				func(ctx context.Context, in indexIn, call executor.Call) (executor.Result[indexOut], error) {
					mu.Lock()
					runs[call.CallID]++
					started++
					if started == 2 {
						close(bothStarted)
					}
					mu.Unlock()
					// With one slot per executor, both calls can only be
					// running together if each executor took one.
					select {
					case <-bothStarted:
					case <-ctx.Done():
						return executor.Result[indexOut]{}, ctx.Err()
					}
					return executor.Result[indexOut]{Output: indexOut{Index: in.Index, Executor: id}}, nil
				})
		},
	})
	ctx := ctxT(t)
	res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "pair"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.ElementsMatch(t, []string{"executor-1 ", "executor-2 "}, []string{res.Answer[:11], res.Answer[11:]}, res.Answer)
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, runs, 2)
	for id, n := range runs {
		assert.Equal(t, 1, n, "call %s ran %d times", id, n)
	}
}

func echoExecutor(ex *executor.Executor) error {
	return executor.Register(ex, executor.Action{Name: "test.echo", Description: "echoes its input"},
		func(_ context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
			return executor.Result[map[string]any]{Output: in, Summary: "echoed"}, nil
		})
}

const echoScenario = `
scenarios:
  echo:
    decisions:
      - {type: action, name: test.echo, args: {msg: hi}}
      - {type: final, answer: '{{ index .Results "test.echo" "msg" }}'}
  unknown:
    decisions:
      - {type: action, name: test.nope, args: {}}
`

func terminalCount(rec *actionbustest.Recorder, runID string) int {
	return rec.Count(func(r actionbustest.Recorded) bool {
		switch r.Type() {
		case events.TypeRunCompleted, events.TypeRunFailed, events.TypeRunCanceled:
			return r.Event.Extensions()[events.ExtRunID] == runID
		}
		return false
	})
}

func TestDuplicatesGiveExactlyOneTerminalEvent(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "")
	st := srv.StartStack(t, actionbustest.StackOptions{Scenarios: echoScenario, Register: echoExecutor})
	ctx := ctxT(t)
	runID := events.NewID()
	req := client.RunRequest{RunID: runID, Scenario: "echo"}
	_, err := st.Client.Start(ctx, req)
	require.NoError(t, err)
	// The same request republished under a new event id (a client retry).
	eb, err := bus.NewBus(srv.JS, bus.BusConfig{Source: "/test"})
	require.NoError(t, err)
	_, err = eb.Emit(ctx, events.TypeRunRequested, events.NewID(), events.DefaultTenant, runID, "", &events.RunRequested{RunID: runID, Scenario: "echo"})
	require.NoError(t, err)

	// Inject a duplicate of the first result under a new id.
	first := rec.WaitForType(t, 0, events.TypeActionCompleted, runID)
	var done events.ActionCompleted
	require.NoError(t, events.DataAs(first.Event, &done))
	_, err = eb.Emit(ctx, events.TypeActionCompleted, events.NewID(), events.DefaultTenant, runID, "", &done)
	require.NoError(t, err)

	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	assert.Equal(t, client.StatusCompleted, res.Status)
	assert.Equal(t, "hi", res.Answer)

	// Wait until the auditor has seen the run end (so every event has been
	// consumed), then count terminal events.
	rec.WaitForAudit(t, 0, 1, func(a client.AuditRecord) bool {
		return a.RunID == runID && a.EventType == events.TypeRunCompleted
	})
	assert.Equal(t, 1, terminalCount(rec, runID))
	assert.Equal(t, 1, rec.Count(func(r actionbustest.Recorded) bool {
		return r.Type() == events.TypeRunStarted && r.Event.Extensions()[events.ExtRunID] == runID
	}), "the run started once")
	assert.Equal(t, 1, rec.Count(func(r actionbustest.Recorded) bool {
		return r.Type() == events.TypeActionRequested && r.Event.Extensions()[events.ExtRunID] == runID
	}), "the action was requested once")
}

func TestUnknownActionFailsTheRun(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Scenarios: echoScenario, Register: echoExecutor})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Scenario: "unknown"}, nil)
	require.NoError(t, err)
	assert.Equal(t, client.StatusFailed, res.Status)
	require.NotNil(t, res.Error)
	assert.ErrorIs(t, res.Error, actionbus.ErrActionNotFound)
	assert.Equal(t, "test.nope", res.Error.Details["action"])
}

func TestExecRunIsHostOriginAndEndsWithTheOutput(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	var (
		mu     sync.Mutex
		origin string
	)
	st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "test.origin"},
			func(_ context.Context, in map[string]any, call executor.Call) (executor.Result[map[string]any], error) {
				mu.Lock()
				origin = call.Origin
				mu.Unlock()
				return executor.Result[map[string]any]{Output: in}, nil
			})
	}})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Action: &client.ActionCall{Name: "test.origin", Args: map[string]any{"a": 1.0}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, map[string]any{"a": 1.0}, res.Output)
	mu.Lock()
	assert.Equal(t, events.OriginHost, origin)
	mu.Unlock()
}

func TestInvalidRunRequestedGetsRunFailed(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Scenarios: echoScenario, Register: echoExecutor})
	ctx := ctxT(t)
	// A negative deadline, and one beyond a year (events.MaxRunDeadline).
	for _, deadline := range []string{"-5", "31536000001"} {
		runID := events.NewID()
		_, err := srv.JS.PublishMsg(ctx, &nats.Msg{
			Subject: "ab.run.default." + runID + ".requested",
			Header: nats.Header{"ce-specversion": {"1.0"}, "ce-id": {runID}, "ce-source": {"/client"},
				"ce-type": {events.TypeRunRequested}, "ce-datacontenttype": {"application/json"}},
			Data: []byte(`{"runId":"` + runID + `","deadlineMs":` + deadline + `}`),
		})
		require.NoError(t, err)
		res, err := st.Client.Wait(ctx, runID)
		require.NoError(t, err)
		assert.Equal(t, client.StatusFailed, res.Status, "deadlineMs %s", deadline)
		assert.ErrorIs(t, res.Error, actionbus.ErrSchemaValidation, "deadlineMs %s", deadline)
	}
}

func TestAuditCoversEveryStoredEventOfTheRun(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "")
	st := srv.StartStack(t, actionbustest.StackOptions{Scenarios: reverseScenario + `
  echo:
    decisions:
      - {type: action, name: test.echo, args: {msg: hi}}
      - {type: final, answer: done}
`, Register: echoExecutor})
	ctx := ctxT(t)
	runID, err := st.Client.Start(ctx, client.RunRequest{Scenario: "echo"})
	require.NoError(t, err)
	_, err = st.Client.Wait(ctx, runID)
	require.NoError(t, err)

	// Timer schedules (…sched.<name>) are instructions to the server, not
	// events of the run: when one fires, its copy on the timer subject is an
	// event and is audited. Live events (run.started, progress steps) are
	// never stored, never audited.
	live := func(typ string) bool { e, ok := events.Lookup(typ); return ok && e.Live }
	runEvent := func(r actionbustest.Recorded) bool {
		return r.Event != nil && r.AuditRecords() == nil && r.Event.Extensions()[events.ExtRunID] == runID &&
			!strings.Contains(r.Subject, ".sched.") && !live(r.Type())
	}
	// The recorder has every event of the run once it has the last one.
	rec.WaitForN(t, 0, 1, func(r actionbustest.Recorded) bool {
		return r.Type() == events.TypeRunCompleted && r.Event.Extensions()[events.ExtRunID] == runID
	})
	ids := map[string]bool{}
	progress := 0
	for _, r := range rec.All() {
		if runEvent(r) {
			ids[r.Event.ID()] = true
		}
		if r.Type() == events.TypeRunProgress && r.Event.Extensions()[events.ExtRunID] == runID {
			progress++
		}
	}
	require.NotEmpty(t, ids)
	require.NotZero(t, progress, "the run published progress steps")
	chain := rec.WaitForAudit(t, 0, len(ids), func(a client.AuditRecord) bool { return a.RunID == runID })
	audited := map[string]bool{}
	for _, a := range chain {
		audited[a.EventID] = true
	}
	assert.Equal(t, sorted(ids), sorted(audited))
	// An allowed call's policy evaluation is on its work item's record,
	// not a record of its own.
	for _, c := range chain {
		assert.NotEqual(t, "policy", c.Kind, "an allowed call has no separate policy record")
		if c.EventType == events.TypeActionRequested {
			pol, _ := c.Policy.(map[string]any)
			assert.Equal(t, "allow", pol["action"], "the action record carries the evaluation: %v", c.Policy)
		}
	}
	// No progress step was audited, then or later: the audit stream holds
	// exactly one record per stored event, in one chain.
	stored, err := st.Client.AuditRecords(ctx, runID)
	require.NoError(t, err)
	assert.Len(t, stored, len(ids))
	assert.Equal(t, -1, audit.Verify(stored), "the run's chain verifies")
	// The records link up: every prevHash but the first names another
	// record's hash.
	hashes := map[string]bool{}
	for _, c := range chain {
		hashes[c.Hash] = true
	}
	roots := 0
	for _, c := range chain {
		if c.PrevHash == "" {
			roots++
		} else {
			assert.True(t, hashes[c.PrevHash], "record %s names an unknown predecessor", c.EventID)
		}
	}
	assert.Equal(t, 1, roots)
	b, _ := json.Marshal(chain[0])
	assert.NotContains(t, string(b), `"hash":""`)
}

func sorted(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
