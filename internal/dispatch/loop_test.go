package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/dispatch"
)

type anyIn = map[string]any

// loopActions are the actions of the loop tests.
type loopActions struct {
	mu       sync.Mutex
	inFlight int
	maxSeen  int
	release  chan struct{}
	canceled chan error
	started  chan struct{}
}

func newLoopActions() *loopActions {
	return &loopActions{release: make(chan struct{}), canceled: make(chan error, 1), started: make(chan struct{}, 1)}
}

func (a *loopActions) register(ex *executor.Executor) error {
	r := func(name string, h executor.HandlerFunc[anyIn, anyIn]) error {
		return executor.Register(ex, executor.Action{Name: name, Description: name}, h)
	}
	return errors.Join(
		r("t.echo", func(_ context.Context, in anyIn, _ executor.Call) (executor.Result[anyIn], error) {
			return executor.Result[anyIn]{Output: in, Summary: fmt.Sprint(in["v"])}, nil
		}),
		r("t.fail", func(_ context.Context, in anyIn, _ executor.Call) (executor.Result[anyIn], error) {
			return executor.Result[anyIn]{}, actionbus.Errorf("upstream_down", "upstream %v is down", in["v"])
		}),
		r("t.final", func(_ context.Context, in anyIn, _ executor.Call) (executor.Result[anyIn], error) {
			return executor.Result[anyIn]{Output: anyIn{"resultKind": "final", "markdown": in["md"]}}, nil
		}),
		r("t.big", func(_ context.Context, _ anyIn, _ executor.Call) (executor.Result[anyIn], error) {
			return executor.Result[anyIn]{Output: anyIn{"rows": strings.Repeat("x", 150<<10)}, Summary: "150 KiB"}, nil
		}),
		// t.slow counts how many run at once and waits for release.
		r("t.slow", func(ctx context.Context, _ anyIn, _ executor.Call) (executor.Result[anyIn], error) {
			a.mu.Lock()
			a.inFlight++
			if a.inFlight > a.maxSeen {
				a.maxSeen = a.inFlight
			}
			a.mu.Unlock()
			defer func() {
				a.mu.Lock()
				a.inFlight--
				a.mu.Unlock()
			}()
			select {
			case <-a.release:
			case <-ctx.Done():
				return executor.Result[anyIn]{}, ctx.Err()
			}
			return executor.Result[anyIn]{Output: anyIn{}}, nil
		}),
		// t.block blocks until its context ends and reports why.
		r("t.block", func(ctx context.Context, _ anyIn, _ executor.Call) (executor.Result[anyIn], error) {
			a.started <- struct{}{}
			<-ctx.Done()
			a.canceled <- context.Cause(ctx)
			return executor.Result[anyIn]{}, ctx.Err()
		}),
	)
}

const loopScenarios = `
scenarios:
  clarify:
    decisions:
      - {type: clarify, question: 'Which region?'}
      - {type: final, answer: 'region {{ (index .Last 0).Output.answer }}', citations: [doc-1]}
  too-many:
    decisions:
      - type: plan
        actions: [{type: action, name: t.echo}, {type: action, name: t.echo}, {type: action, name: t.echo}, {type: action, name: t.echo},
                  {type: action, name: t.echo}, {type: action, name: t.echo}, {type: action, name: t.echo}, {type: action, name: t.echo},
                  {type: action, name: t.echo}, {type: action, name: t.echo}, {type: action, name: t.echo}]
      - {type: final, answer: 'refused'}
  section-missing:
    decisions:
      - type: plan
        synthesize_per_action: true
        actions: [{type: action, name: t.echo, args: {v: 1}, section: {prompt: "one"}}, {type: action, name: t.echo, args: {v: 2}}]
      - {type: final, answer: 'refused'}
  per-action:
    decisions:
      - type: plan
        synthesize_per_action: true
        partial_ok: true
        actions:
          - {type: action, name: t.echo, args: {v: first}, section: {title: "## One", prompt: "one"}}
          - {type: action, name: t.fail, args: {v: db}, section: {prompt: "two"}}
        stitch: {outro_prompt: "Wrap up."}
  mutator-in-plan:
    decisions:
      - type: plan
        actions: [{type: action, name: read_agent_skill, args: {skillName: x}}]
      - {type: final, answer: 'refused'}
  parallel:
    decisions:
      - type: plan
        actions: [{type: action, name: t.slow}, {type: action, name: t.slow}, {type: action, name: t.slow}, {type: action, name: t.slow},
                  {type: action, name: t.slow}, {type: action, name: t.slow}, {type: action, name: t.slow}, {type: action, name: t.slow},
                  {type: action, name: t.slow}, {type: action, name: t.slow}]
      - {type: final, answer: done}
  partial-strict:
    decisions:
      - type: plan
        actions: [{type: action, name: t.echo, args: {v: a}}, {type: action, name: t.fail, args: {v: b}}, {type: action, name: t.fail, args: {v: c}}]
      - {type: final, answer: '{{ len .Last }}'}
  partial-ok:
    decisions:
      - type: plan
        partial_ok: true
        actions: [{type: action, name: t.echo, args: {v: a}}, {type: action, name: t.fail, args: {v: b}}, {type: action, name: t.echo, args: {v: c}}]
      - {type: final, answer: '{{ len .Last }}'}
  direct-final:
    decisions:
      - type: plan
        actions: [{type: action, name: t.echo, args: {v: a}}, {type: action, name: t.final, args: {md: first}}, {type: action, name: t.final, args: {md: second}}]
      - {type: final, answer: 'not reached'}
  keeps-failing:
    decisions:
      - {type: action, name: t.fail, args: {v: 1}}
      - {type: action, name: t.fail, args: {v: 2}}
      - {type: action, name: t.fail, args: {v: 3}}
      - {type: final, answer: 'not reached'}
  big:
    decisions:
      - type: plan
        actions: [{type: action, name: t.big}, {type: action, name: t.big}, {type: action, name: t.big}, {type: action, name: t.big},
                  {type: action, name: t.big}, {type: action, name: t.big}, {type: action, name: t.big}, {type: action, name: t.big}]
      - {type: final, answer: '{{ (index .Last 0).Output.bytes }}'}
  block:
    decisions:
      - {type: action, name: t.block}
      - {type: final, answer: 'not reached'}
`

func startLoop(t *testing.T, opts actionbustest.StackOptions) (*actionbustest.Server, *actionbustest.Recorder, *actionbustest.Stack, *loopActions) {
	t.Helper()
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "")
	acts := newLoopActions()
	opts.Scenarios = loopScenarios
	opts.Register = acts.register
	return srv, rec, srv.StartStack(t, opts), acts
}

func decisionRequest(t *testing.T, rec *actionbustest.Recorder, runID string, cycle int) events.DecisionRequested {
	t.Helper()
	r := rec.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
		var d events.DecisionRequested
		return r.Type() == events.TypeDecisionRequested && events.DataAs(r.Event, &d) == nil && d.RunID == runID && d.Cycle == cycle
	})
	var d events.DecisionRequested
	require.NoError(t, events.DataAs(r.Event, &d))
	return d
}

// waitStep waits until the run has published a step of that name.
func waitStep(t *testing.T, rec *actionbustest.Recorder, runID, name string) {
	t.Helper()
	rec.WaitForStep(t, 0, func(s events.RunStep) bool { return s.RunID == runID && s.Name == name })
}

func TestClarifyWaitsForInputThenResumes(t *testing.T) {
	_, rec, st, _ := startLoop(t, actionbustest.StackOptions{})
	ctx := ctxT(t)
	runID, err := st.Client.Start(ctx, client.RunRequest{Scenario: "clarify"})
	require.NoError(t, err)
	rec.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
		var s events.RunStep
		return events.IsRunStep(r.Type()) && events.DataAs(r.Event, &s) == nil && s.RunID == runID && s.Name == "awaiting-input" && s.Message == "Which region?"
	})
	require.NoError(t, st.Client.Input(ctx, runID, "eu-west"))
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, "region eu-west", res.Answer)
	assert.Equal(t, []string{"doc-1"}, res.Citations)
	d := decisionRequest(t, rec, runID, 2)
	require.Len(t, d.Observations, 1)
	assert.Equal(t, "ask_clarification", d.Observations[0].Action)
	assert.Equal(t, map[string]any{"question": "Which region?", "answer": "eu-west"}, d.Observations[0].Output)
	waitStep(t, rec, runID, "input-received")
	waitStep(t, rec, runID, "orient")
}

func TestPlanRulesRefuseBadPlansWithAClearMessage(t *testing.T) {
	_, rec, st, _ := startLoop(t, actionbustest.StackOptions{})
	ctx := ctxT(t)
	for _, tc := range []struct{ scenario, want string }{
		{"too-many", "plan has 11 actions; at most 10 are allowed"},
		{"mutator-in-plan", "read_agent_skill changes planner state"},
		{"section-missing", "plan entry 1 has no section.prompt"},
	} {
		t.Run(tc.scenario, func(t *testing.T) {
			res, err := st.Client.Run(ctx, client.RunRequest{Scenario: tc.scenario}, nil)
			require.NoError(t, err)
			require.Equal(t, client.StatusCompleted, res.Status, "the planner got the refusal back and answered")
			d := decisionRequest(t, rec, res.RunID, 2)
			require.NotNil(t, d.Feedback)
			assert.Equal(t, actionbus.CodePlanRejected, d.Feedback.Code)
			assert.Contains(t, d.Feedback.Message, tc.want)
			waitStep(t, rec, res.RunID, "plan-validation-failed")
			assert.Zero(t, rec.Count(func(r actionbustest.Recorded) bool {
				return r.Type() == events.TypeActionRequested && r.Event.Extensions()[events.ExtRunID] == res.RunID
			}), "nothing of a refused plan runs")
		})
	}
}

func TestPlanLimitConfiguration(t *testing.T) {
	for _, bad := range []string{"21", "0", "1.5", "-3", "ten", ""} {
		_, err := dispatch.ParsePlanLimit(bad)
		assert.Error(t, err, "%q", bad)
	}
	for _, good := range []string{"1", "10", "20", " 7 "} {
		_, err := dispatch.ParsePlanLimit(good)
		assert.NoError(t, err, "%q", good)
	}
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	_, err := dispatch.New(srv.Conn, dispatch.Config{RunLimits: events.RunLimits{MaxPlanActions: 21}})
	assert.ErrorContains(t, err, "MaxPlanActions must be 1 to 20")
}

func TestMaxPlanParallelIsTheMeasuredMaximumInFlight(t *testing.T) {
	_, _, st, acts := startLoop(t, actionbustest.StackOptions{Limits: events.RunLimits{MaxPlanParallel: 3}, Slots: 16})
	ctx := ctxT(t)
	runID, err := st.Client.Start(ctx, client.RunRequest{Scenario: "parallel"})
	require.NoError(t, err)
	// Release one action at a time once three are running, ten times.
	for released := 0; released < 10; released++ {
		require.Eventually(t, func() bool {
			acts.mu.Lock()
			defer acts.mu.Unlock()
			return acts.inFlight == min(3, 10-released)
		}, 10*time.Second, time.Millisecond)
		acts.release <- struct{}{}
	}
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	acts.mu.Lock()
	assert.Equal(t, 3, acts.maxSeen)
	acts.mu.Unlock()
}

func TestPartialOK(t *testing.T) {
	_, rec, st, _ := startLoop(t, actionbustest.StackOptions{})
	ctx := ctxT(t)

	t.Run("false: no output applied, the first failure named", func(t *testing.T) {
		res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "partial-strict"}, nil)
		require.NoError(t, err)
		require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
		assert.Equal(t, "1", res.Answer)
		d := decisionRequest(t, rec, res.RunID, 2)
		require.Len(t, d.Observations, 1)
		o := d.Observations[0]
		assert.Equal(t, "t.fail", o.Action)
		assert.False(t, o.OK)
		assert.Equal(t, 1, *o.PlanIndex, "the first failure in declaration order")
		assert.Equal(t, actionbus.Code("upstream_down"), o.Error.Code)
		assert.Equal(t, "upstream b is down", o.Error.Message)
		assert.Nil(t, o.Output)
		assert.Contains(t, o.Summary, "2 of 3 actions failed")
	})
	t.Run("true: each failure a structured entry", func(t *testing.T) {
		res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "partial-ok"}, nil)
		require.NoError(t, err)
		require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
		assert.Equal(t, "3", res.Answer)
		d := decisionRequest(t, rec, res.RunID, 2)
		require.Len(t, d.Observations, 3)
		for i, o := range d.Observations {
			assert.Equal(t, i, *o.PlanIndex)
		}
		assert.True(t, d.Observations[0].OK)
		assert.Equal(t, map[string]any{"v": "a"}, d.Observations[0].Output)
		assert.False(t, d.Observations[1].OK)
		assert.Equal(t, actionbus.Code("upstream_down"), d.Observations[1].Error.Code)
		assert.True(t, d.Observations[2].OK)
	})
}

func TestDirectFinalDeclarationOrderWins(t *testing.T) {
	_, rec, st, _ := startLoop(t, actionbustest.StackOptions{})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Scenario: "direct-final"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, "first", res.Answer)
	assert.Equal(t, 1, res.Cycles, "no further planner cycle")
	waitStep(t, rec, res.RunID, "direct-final-emitted")
}

func TestRepeatedFailuresStopTheLoopAfterTwoRounds(t *testing.T) {
	_, rec, st, _ := startLoop(t, actionbustest.StackOptions{})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Scenario: "keeps-failing"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	assert.ErrorIs(t, res.Error, actionbus.ErrRepeatedFailure)
	assert.Equal(t, 2, res.Cycles, "stopped after the second failed round")
	assert.Equal(t, "t.fail", res.Error.Details["action"])
	evidence, _ := res.Error.Details["evidence"].([]any)
	require.Len(t, evidence, 2)
	assert.Equal(t, "upstream 1 is down", evidence[0].(map[string]any)["message"])
	waitStep(t, rec, res.RunID, "action-repeated-failure")
	assert.Equal(t, 2, rec.Count(func(r actionbustest.Recorded) bool {
		return r.Type() == events.TypeActionRequested && r.Event.Extensions()[events.ExtRunID] == res.RunID
	}))
}

// MaxFailedRounds 1 stops at the first failed round (it once behaved as 2).
func TestMaxFailedRoundsOneStopsAfterOneRound(t *testing.T) {
	_, _, st, _ := startLoop(t, actionbustest.StackOptions{Limits: events.RunLimits{MaxFailedRounds: 1}})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Scenario: "keeps-failing"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	assert.ErrorIs(t, res.Error, actionbus.ErrRepeatedFailure)
	assert.Equal(t, 1, res.Cycles, "stopped after the first failed round")
}

func TestPerActionSynthesisWithTheScriptProvider(t *testing.T) {
	_, _, st, _ := startLoop(t, actionbustest.StackOptions{})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Scenario: "per-action"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, "## One\n\nfirst\n\n## Section 2\n\n<!-- section failed: action failed: upstream_down: upstream db is down -->\n\n"+
		"Wrap up.\n- t.echo: first\n- t.fail: failed: upstream db is down", res.Answer)
	assert.Equal(t, 1, res.Cycles)
}

func TestAPlannerThatNeverAnswersStallsTheRun(t *testing.T) {
	_, _, st, _ := startLoop(t, actionbustest.StackOptions{NoPlanner: true, Limits: events.RunLimits{DecisionTimeout: time.Second}})
	ctx := ctxT(t)
	res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "block"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	assert.ErrorIs(t, res.Error, actionbus.ErrStageStalled)
	assert.Equal(t, "planner", res.Error.Details["stage"])
}

func TestRunDeadlineFailsTheRun(t *testing.T) {
	_, _, st, _ := startLoop(t, actionbustest.StackOptions{})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Scenario: "block", Deadline: time.Second}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	assert.Equal(t, actionbus.CodeRunDeadline, res.Error.Code)
	assert.Equal(t, "acting", res.Error.Details["phase"])
}

func TestCancelReachesARunningHandler(t *testing.T) {
	_, rec, st, acts := startLoop(t, actionbustest.StackOptions{})
	ctx := ctxT(t)
	runID, err := st.Client.Start(ctx, client.RunRequest{Scenario: "block"})
	require.NoError(t, err)
	select {
	case <-acts.started:
	case <-ctx.Done():
		t.Fatal("the handler never started")
	}
	require.NoError(t, st.Client.Cancel(ctx, runID, "operator said stop"))
	select {
	case cause := <-acts.canceled:
		assert.ErrorIs(t, cause, executor.ErrRunEnded)
	case <-ctx.Done():
		t.Fatal("the handler's context was not canceled")
	}
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	assert.Equal(t, client.StatusCanceled, res.Status)
	assert.Equal(t, "operator said stop", res.Reason)
	// A second cancel changes nothing: still exactly one terminal event.
	require.NoError(t, st.Client.Cancel(ctx, runID, "again"))
	rec.WaitForN(t, 0, 2, func(r actionbustest.Recorded) bool {
		return r.Type() == events.TypeCancelRequested && strings.Contains(r.Subject, runID)
	})
	// The dispatcher handles the second cancel before the auditor records
	// it; wait for its audit record so the count below is final.
	rec.WaitForAudit(t, 0, 2, func(a client.AuditRecord) bool {
		return a.EventType == events.TypeCancelRequested && a.RunID == runID
	})
	assert.Equal(t, 1, terminalCount(rec, runID))
}

func TestLargeOutputsReachThePlannerAsBoundedDigests(t *testing.T) {
	srv, rec, st, _ := startLoop(t, actionbustest.StackOptions{})
	ctx := ctxT(t)
	res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "big"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, "153611", res.Answer, `the digest gives the full size of {"rows":"x…"}`)
	d := decisionRequest(t, rec, res.RunID, 2)
	require.Len(t, d.Observations, 8)
	for _, o := range d.Observations {
		dig := o.Output.(map[string]any)
		assert.Equal(t, true, dig["truncated"])
		assert.Len(t, dig["sha256"], 64)
		assert.LessOrEqual(t, len(dig["preview"].(string)), 2048)
	}
	kv, err := srv.JS.KeyValue(ctx, "ab_runs")
	require.NoError(t, err)
	entry, err := kv.Get(ctx, res.RunID)
	require.NoError(t, err)
	assert.Less(t, len(entry.Value()), 64<<10, "run state stays small although the plan produced 1.2 MiB")
}
