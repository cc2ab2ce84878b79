package run

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/policy"
)

var allModes = []string{"read", "draft", "dryRun", "mutate"}

func TestStartArmsTheRunDeadlineAndAsksThePlanner(t *testing.T) {
	h := newHarness(t, events.RunLimits{})
	h.start(events.RunRequested{Prompt: "help", DeadlineMs: 5000})
	assert.Equal(t, KindAgent, h.st.Kind)
	assert.Equal(t, StatusRunning, h.st.Status)
	assert.Equal(t, PhaseDeciding, h.st.Phase)
	assert.Equal(t, []EffectKind{EffectEvent, EffectTimer, EffectStep, EffectDecide, EffectTimer}, kinds(h.last))
	assert.Equal(t, events.TypeRunStarted, h.last[0].Type)
	deadline := h.timer(events.TimerRunDeadline)
	require.NotNil(t, deadline)
	assert.Equal(t, h.env.Now().Add(5*time.Second), deadline.At)
	require.NotNil(t, h.timer(events.TimerDecision), "the decision has its own deadline")
}

// TestDecisions: every decision type and plan rule, applied to a run in
// cycle 1.
func TestDecisions(t *testing.T) {
	many := make([]events.Decision, 11)
	for i := range many {
		many[i] = action("t.read", nil)
	}
	type check func(t *testing.T, h *harness, out []Effect)
	acting := func(n int) check {
		return func(t *testing.T, h *harness, out []Effect) {
			assert.Equal(t, PhaseActing, h.st.Phase)
			assert.Len(t, h.dispatched(), n)
			assert.NotNil(t, h.timer(events.TimerAction), "every dispatched call has a deadline")
		}
	}
	failed := func(code actionbus.Code) check {
		return func(t *testing.T, h *harness, out []Effect) {
			assert.Equal(t, StatusFailed, h.st.Status)
			assert.Equal(t, code, h.code())
			assert.True(t, has(out, EffectEnd))
		}
	}
	// fedBack: the decision goes back to the planner with the reason, in
	// a new cycle; nothing ran.
	fedBack := func(code actionbus.Code) check {
		return func(t *testing.T, h *harness, out []Effect) {
			require.NotNil(t, h.st.Agent.Feedback)
			assert.Equal(t, code, h.st.Agent.Feedback.Code)
			assert.Equal(t, 2, h.st.Cycle)
			assert.Equal(t, PhaseDeciding, h.st.Phase)
			assert.True(t, has(out, EffectDecide))
			assert.False(t, has(out, EffectAct))
		}
	}
	for _, tc := range []struct {
		name     string
		modes    []string
		decision events.Decision
		check    check
	}{
		{"final ends the run", nil, events.Decision{Type: events.DecisionFinal, Answer: "done"}, func(t *testing.T, h *harness, out []Effect) {
			assert.Equal(t, StatusCompleted, h.st.Status)
			assert.Equal(t, "done", h.st.Terminal.Answer)
			assert.Contains(t, stepNames(out), string(StepFinal))
			assert.True(t, has(out, EffectEnd))
		}},
		{"an action is dispatched", nil, action("t.read", nil), acting(1)},
		{"a plan dispatches every action", nil, plan(action("t.read", nil), action("t.other", nil)), acting(2)},
		{"an unknown action fails the run", nil, action("t.nope", nil), failed(actionbus.CodeActionNotFound)},
		{"an unknown action in a plan fails the run", nil, plan(action("t.read", nil), action("t.nope", nil)), failed(actionbus.CodeActionNotFound)},
		{"a mode the run does not allow fails it", nil, action("t.mutate", nil), failed(actionbus.CodeModeNotAllowed)},
		{"a denied action fails the run", nil, action("t.denied", nil), failed(actionbus.CodePolicyRejected)},
		{"an action that needs approval waits for it", allModes, action("t.mutate", map[string]any{"id": "a"}), func(t *testing.T, h *harness, out []Effect) {
			assert.Equal(t, StatusAwaitingApproval, h.st.Status)
			assert.Len(t, h.approvals(), 1)
			assert.False(t, has(out, EffectAct), "nothing runs before the approval")
			assert.NotNil(t, h.timer(events.TimerApproval), "the approval has a deadline")
		}},
		{"an action without a name", nil, events.Decision{Type: events.DecisionAction}, fedBack(actionbus.CodeInvalidDecision)},
		{"an unknown decision type", nil, events.Decision{Type: "shrug"}, fedBack(actionbus.CodeInvalidDecision)},
		{"a clarify without a question", nil, events.Decision{Type: events.DecisionClarify, Question: " "}, fedBack(actionbus.CodeInvalidDecision)},
		{"an empty plan", nil, plan(), fedBack(actionbus.CodePlanRejected)},
		{"a plan over MaxPlanActions", nil, plan(many...), fedBack(actionbus.CodePlanRejected)},
		{"a nested plan", nil, plan(action("t.read", nil), plan(action("t.read", nil))), fedBack(actionbus.CodePlanRejected)},
		{"a planner state mutator in a plan", nil, plan(action("t.read", nil), action("read_agent_skill", nil)), fedBack(actionbus.CodePlanRejected)},
		{"an action that needs approval in a plan", allModes, plan(action("t.read", nil), action("t.mutate", nil)), fedBack(actionbus.CodeApprovalRequired)},
		{"a denied action in a plan", nil, plan(action("t.read", nil), action("t.denied", nil)), fedBack(actionbus.CodePolicyRejected)},
		{"invalid arguments go back to the planner", nil, action("t.query", map[string]any{}), func(t *testing.T, h *harness, out []Effect) {
			fedBack(actionbus.CodeActionArgsInvalid)(t, h, out)
			require.Len(t, h.st.Agent.Observations, 1)
			assert.False(t, h.st.Agent.Observations[0].OK)
		}},
		{"a plan with invalid arguments runs nothing", nil, plan(action("t.read", nil), action("t.query", map[string]any{"q": 1})), func(t *testing.T, h *harness, out []Effect) {
			fedBack(actionbus.CodeActionArgsInvalid)(t, h, out)
			assert.Contains(t, stepNames(out), string(StepPlanValidationFailed))
		}},
		{"clarify waits for input", nil, events.Decision{Type: events.DecisionClarify, Question: "which one?"}, func(t *testing.T, h *harness, out []Effect) {
			assert.Equal(t, StatusAwaitingInput, h.st.Status)
			assert.Equal(t, "which one?", h.st.Agent.Question)
			assert.NotNil(t, h.timer(events.TimerInput), "the question has a deadline")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, events.RunLimits{}).start(events.RunRequested{Prompt: "help", AllowedModes: tc.modes})
			tc.check(t, h, h.decide(tc.decision))
		})
	}
}

func TestStaleAndDuplicateDecisionsChangeNothing(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).agent()
	h.decide(action("t.read", nil))
	before, _ := json.Marshal(h.st)
	assert.Nil(t, h.apply(&events.DecisionMade{RunID: testRunID, Cycle: 1, Decision: action("t.read", nil)}), "a duplicate decision")
	assert.Nil(t, h.apply(&events.DecisionMade{RunID: testRunID, Cycle: 0, Decision: events.Decision{Type: events.DecisionFinal}}), "a decision of an earlier cycle")
	after, _ := json.Marshal(h.st)
	assert.JSONEq(t, string(before), string(after))
	_, err := h.m.Apply(context.Background(), h.st, Event{ID: "later", Data: &events.DecisionMade{RunID: testRunID, Cycle: 7, Decision: events.Decision{Type: events.DecisionFinal}}})
	assert.ErrorIs(t, err, ErrAhead, "a decision of a later cycle is handed back")
	after, _ = json.Marshal(h.st)
	assert.JSONEq(t, string(before), string(after))
}

func TestAPlannerErrorFailsTheRun(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).agent()
	h.apply(&events.DecisionMade{RunID: testRunID, Cycle: 1, Error: actionbus.Errorf(actionbus.CodeProviderError, "down")})
	assert.Equal(t, actionbus.CodeProviderError, h.code())
}

func TestPlanResultsAreObservedInDeclarationOrder(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).agent()
	h.decide(plan(action("t.read", map[string]any{"n": 0}), action("t.other", nil), action("t.read", map[string]any{"n": 2})))
	calls := h.dispatched()
	require.Len(t, calls, 3)
	for i := len(calls) - 1; i >= 0; i-- { // results arrive in reverse
		h.succeed(calls[i].CallID, map[string]any{"i": i})
	}
	require.Len(t, h.st.Agent.Observations, 3)
	for i, o := range h.st.Agent.Observations {
		require.NotNil(t, o.PlanIndex)
		assert.Equal(t, i, *o.PlanIndex)
		assert.Equal(t, map[string]any{"i": float64(i)}, o.Output)
	}
	assert.Equal(t, 2, h.st.Cycle, "the planner is asked again")
}

func TestAPlanKeepsEachDistinctPolicyVerdictOnceAndEveryWorkItemItsOwn(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).agent()
	h.decide(plan(action("t.read", map[string]any{"n": 0}), action("t.other", nil), action("t.read", map[string]any{"n": 2})))
	calls := h.dispatched()
	require.Len(t, calls, 3)
	require.Len(t, h.st.PolicySnapshots, 2, "two actions, two verdicts: the second t.read shares the first's")
	assert.Equal(t, calls[0].Policy, calls[2].Policy)
	assert.NotEqual(t, calls[0].Policy, calls[1].Policy)
	for _, c := range calls {
		var req *events.ActionRequested
		for _, e := range h.all {
			if e.Kind == EffectAct && e.CallID == c.CallID {
				em, ok := Render(h.st, e)
				require.True(t, ok)
				req = em.Data.(*events.ActionRequested)
			}
		}
		require.NotNil(t, req, "call %s was dispatched", c.CallID)
		snap, ok := req.Policy.(policy.Snapshot)
		require.True(t, ok, "the work item of %s carries a verdict", c.CallID)
		assert.Equal(t, c.Action, snap.ActionName, "the work item of %s carries its own verdict", c.CallID)
		assert.Equal(t, policy.Allow, snap.Action)
	}
}

func TestPlanParallelismIsBounded(t *testing.T) {
	h := newHarness(t, events.RunLimits{MaxPlanParallel: 2}).agent()
	var acts []events.Decision
	for i := range 5 {
		acts = append(acts, action("t.read", map[string]any{"i": i}))
	}
	h.decide(plan(acts...))
	first := h.dispatched()
	require.Len(t, first, 2)
	assert.Equal(t, 2, h.st.inFlight())
	h.succeed(first[0].CallID, nil)
	next := h.dispatched()
	require.Len(t, next, 1, "one result frees one slot")
	assert.Equal(t, 2, next[0].PlanIndex, "in declaration order")
	assert.Equal(t, 2, h.st.inFlight())
}

func TestPartialOK(t *testing.T) {
	for _, partial := range []bool{false, true} {
		t.Run(fmt.Sprint("partial_ok=", partial), func(t *testing.T) {
			h := newHarness(t, events.RunLimits{}).agent()
			p := plan(action("t.read", nil), action("t.query", map[string]any{}))
			p.PartialOK = partial
			h.decide(p)
			if !partial {
				assert.Empty(t, h.dispatched(), "one invalid action holds the plan back")
				return
			}
			calls := h.dispatched()
			require.Len(t, calls, 1, "the valid action runs")
			h.succeed(calls[0].CallID, map[string]any{"ok": true})
			require.Len(t, h.st.Agent.Observations, 2, "the invalid one is a failed result")
			assert.True(t, h.st.Agent.Observations[0].OK)
			assert.False(t, h.st.Agent.Observations[1].OK)
			// Seed 000: a failed entry of a partial_ok plan is a structured
			// error result.
			failed := h.st.Agent.Observations[1].Output.(map[string]any)
			assert.Equal(t, "planned_action_error", failed["kind"])
			assert.Equal(t, false, failed["ok"], "the contract's ok: false")
			assert.Equal(t, "t.query", failed["actionName"])
			assert.EqualValues(t, 1, failed["planIndex"])
			assert.Equal(t, string(actionbus.CodeActionArgsInvalid), failed["error"].(map[string]any)["code"])
		})
	}
}

func TestAFailedPlanWithoutPartialOKAppliesNoOutput(t *testing.T) {
	h := newHarness(t, events.RunLimits{MaxFailedRounds: 3}).agent()
	h.decide(plan(action("t.read", nil), action("t.other", nil)))
	calls := h.dispatched()
	h.succeed(calls[0].CallID, map[string]any{"secret": 1})
	out := h.failCall(calls[1].CallID, "upstream_down")
	assert.Contains(t, stepNames(out), string(StepPlanFailed))
	require.Len(t, h.st.Agent.Observations, 1, "one observation names the first failure")
	assert.Contains(t, h.st.Agent.Observations[0].Summary, "first failure at planIndex 1")
}

func TestDirectFinalDeclarationOrderWins(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).agent()
	h.decide(plan(action("t.read", nil), action("t.other", nil)))
	calls := h.dispatched()
	h.succeed(calls[1].CallID, map[string]any{"resultKind": "final", "markdown": "second"})
	out := h.succeed(calls[0].CallID, map[string]any{"resultKind": "final", "markdown": "first"})
	assert.Equal(t, StatusCompleted, h.st.Status)
	assert.Equal(t, "first", h.st.Terminal.Answer)
	assert.Contains(t, stepNames(out), string(StepDirectFinalEmitted))
}

func TestACompleteResultEndsTheRun(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).agent()
	h.decide(action("t.read", nil))
	h.apply(&events.ActionCompleted{RunID: testRunID, CallID: h.dispatched()[0].CallID, Output: map[string]any{"n": 1}, Summary: "one", Complete: true})
	assert.Equal(t, StatusCompleted, h.st.Status)
	assert.Equal(t, "one", h.st.Terminal.Answer)
}

// TestMaxFailedRounds: MaxFailedRounds = 1 stops at the first failed
// round; 2 at the second.
func TestMaxFailedRounds(t *testing.T) {
	for _, rounds := range []int{1, 2, 3} {
		t.Run(fmt.Sprint(rounds), func(t *testing.T) {
			h := newHarness(t, events.RunLimits{MaxFailedRounds: rounds}).agent()
			for r := 1; r <= rounds; r++ {
				require.False(t, h.st.IsTerminal(), "still running before round %d", r)
				h.decide(action("t.read", nil))
				h.failCall(h.dispatched()[0].CallID, "upstream_down")
			}
			assert.Equal(t, actionbus.CodeRepeatedFailure, h.code())
			assert.EqualValues(t, rounds, h.st.Terminal.Error.Details["rounds"])
		})
	}
}

func TestASuccessResetsTheFailureStreak(t *testing.T) {
	h := newHarness(t, events.RunLimits{MaxFailedRounds: 2}).agent()
	h.decide(action("t.read", nil))
	h.failCall(h.dispatched()[0].CallID, "upstream_down")
	h.decide(action("t.read", nil))
	h.succeed(h.dispatched()[0].CallID, nil)
	h.decide(action("t.read", nil))
	h.failCall(h.dispatched()[0].CallID, "upstream_down")
	assert.False(t, h.st.IsTerminal())
}

func TestMaxCyclesEndsTheRun(t *testing.T) {
	h := newHarness(t, events.RunLimits{MaxCycles: 2}).agent()
	for range 2 {
		h.decide(action("t.read", nil))
		h.succeed(h.dispatched()[0].CallID, nil)
	}
	assert.Equal(t, actionbus.CodeMaxCycles, h.code())
}

func TestSynthesizeInstructionGoesToTheNextDecision(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).agent()
	p := plan(action("t.read", nil))
	p.SynthesizeInstruction = "summarize"
	h.decide(p)
	out := h.succeed(h.dispatched()[0].CallID, nil)
	assert.Equal(t, "summarize", h.st.Agent.Synthesize)
	for _, e := range out {
		if e.Kind == EffectDecide {
			em, ok := Render(h.st, e)
			require.True(t, ok)
			assert.Equal(t, "summarize", em.Data.(*events.DecisionRequested).Synthesize)
		}
	}
}

func TestPerActionSynthesis(t *testing.T) {
	h := newHarness(t, events.RunLimits{MaxSectionParallel: 2}).agent()
	var acts []events.Decision
	for i := range 3 {
		a := action("t.read", map[string]any{"i": i})
		a.Section = &events.Section{Title: fmt.Sprintf("## S%d", i), Prompt: "write it"}
		acts = append(acts, a)
	}
	p := plan(acts...)
	p.SynthesizePerAction = true
	p.Stitch = &events.Stitch{IntroPrompt: "intro"}
	h.decide(p)
	for _, c := range h.dispatched() {
		h.succeed(c.CallID, map[string]any{"i": c.PlanIndex})
	}
	assert.Equal(t, PhaseSynthesizing, h.st.Phase)
	require.NotNil(t, h.timer(events.TimerSynthesis), "the synthesis has a deadline")
	answered := 0
	var asked []Effect
	collect := func(out []Effect) {
		for _, e := range out {
			if e.Kind == EffectSynthesize {
				asked = append(asked, e)
			}
		}
		require.LessOrEqual(t, len(asked), 2, "at most MaxSectionParallel in flight")
	}
	collect(h.last)
	for !h.st.IsTerminal() {
		require.NotEmpty(t, asked)
		e := asked[0]
		asked = asked[1:]
		answered++
		collect(h.apply(&events.SynthesisCompleted{RunID: testRunID, Cycle: e.Cycle, Part: e.Part, Index: e.Index, Markdown: fmt.Sprintf("%s %d", e.Part, e.Index)}))
	}
	assert.Equal(t, 4, answered, "three sections and the intro")
	assert.Equal(t, "intro 0\n\n## S0\n\nsection 0\n\n## S1\n\nsection 1\n\n## S2\n\nsection 2", h.st.Terminal.Answer)
}

func TestAnswerToAClarifyAsksThePlannerAgain(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).agent()
	h.decide(events.Decision{Type: events.DecisionClarify, Question: "which?"})
	out := h.apply(&events.InputProvided{RunID: testRunID, Answer: "that one"})
	assert.Equal(t, StatusRunning, h.st.Status)
	assert.Equal(t, 2, h.st.Cycle)
	assert.True(t, has(out, EffectDecide))
	assert.Equal(t, "ask_clarification", h.st.Agent.Observations[0].Action)
	observations := len(h.st.Agent.Observations)
	out = h.apply(&events.InputProvided{RunID: testRunID, Answer: "again"})
	require.Len(t, out, 1, "an answer nobody asked for is said ignored, and changes nothing else")
	require.Equal(t, EffectStep, out[0].Kind)
	assert.Equal(t, string(StepInputIgnored), out[0].Step.Name)
	assert.Contains(t, out[0].Step.Message, "not waiting for an answer (deciding)")
	assert.Len(t, h.st.Agent.Observations, observations)
	assert.False(t, has(out, EffectDecide))
}

func TestTimers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(h *harness)
		kind  string
		code  actionbus.Code // "" when the timer must change nothing
	}{
		{"a decision not made in time", func(h *harness) {}, events.TimerDecision, actionbus.CodeStageStalled},
		{"a decision timer of a past cycle", func(h *harness) {
			h.decide(action("t.read", nil))
			h.succeed(h.dispatched()[0].CallID, nil)
			h.apply(&events.TimerFired{RunID: testRunID, Kind: events.TimerDecision, Cycle: 1, Stage: "planner"})
		}, "", ""},
		{"an action not answered in time", func(h *harness) { h.decide(action("t.read", nil)) }, events.TimerAction, actionbus.CodeStageStalled},
		{"an action timer after its result", func(h *harness) {
			h.decide(plan(action("t.read", nil), action("t.other", nil)))
			calls := h.dispatched()
			h.succeed(calls[0].CallID, nil)
			h.apply(&events.TimerFired{RunID: testRunID, Kind: events.TimerAction, Cycle: 1, CallID: calls[0].CallID})
		}, "", ""},
		{"a question not answered in time", func(h *harness) {
			h.decide(events.Decision{Type: events.DecisionClarify, Question: "which?"})
		}, events.TimerInput, actionbus.CodeStageStalled},
		{"the run's deadline", func(h *harness) { h.decide(action("t.read", nil)) }, events.TimerRunDeadline, actionbus.CodeRunDeadline},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, events.RunLimits{}).agent()
			tc.setup(h)
			if tc.kind == "" {
				assert.Nil(t, h.last, "a stale timer changes nothing")
				assert.False(t, h.st.IsTerminal())
				return
			}
			out := h.fire(tc.kind)
			if tc.kind == events.TimerAction {
				// The first silence sends the request once more.
				require.Len(t, h.dispatched(), 1)
				assert.Contains(t, stepNames(out), string(StepActionRedispatched))
				assert.False(t, h.st.IsTerminal())
				out = h.fire(tc.kind)
			}
			assert.Equal(t, tc.code, h.code())
			assert.True(t, has(out, EffectEnd))
		})
	}
}

func TestCancel(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).agent()
	h.decide(action("t.read", nil))
	out := h.apply(&events.CancelRequested{RunID: testRunID, Reason: "enough"})
	assert.Equal(t, StatusCanceled, h.st.Status)
	assert.Equal(t, "enough", h.st.Terminal.Reason)
	assert.True(t, has(out, EffectEnd))
	assert.False(t, has(out, EffectAct), "no work goes out for a canceled run")
	assert.Nil(t, h.apply(&events.CancelRequested{RunID: testRunID}), "a second cancel")
	assert.Nil(t, h.succeed(h.st.Calls[0].CallID, nil), "a late result")
	assert.Nil(t, h.fire(events.TimerRunDeadline), "the deadline of an ended run")
}

// TestApprovals: grants, refusals, replays, denials and expiry.
func TestApprovals(t *testing.T) {
	start := func(t *testing.T) (*harness, PendingApproval) {
		h := newHarness(t, events.RunLimits{}).start(events.RunRequested{Prompt: "p", AllowedModes: allModes, UserID: "u1"})
		h.decide(action("t.mutate", map[string]any{"id": "a"}))
		ids := h.approvals()
		require.Len(t, ids, 1)
		return h, *h.st.Approvals[ids[0]]
	}
	resolution := func(out []Effect) *events.ApprovalResolved {
		for _, e := range out {
			if e.Type == events.TypeApprovalResolved {
				return e.Data.(*events.ApprovalResolved)
			}
		}
		return nil
	}
	t.Run("a valid grant dispatches the call with its approval", func(t *testing.T) {
		h, p := start(t)
		out := h.apply(&events.ApprovalGranted{RunID: testRunID, ApprovalID: p.Context.ApprovalID, Token: sign(t, p.Context), Approver: "ann"})
		assert.Equal(t, events.ApprovalOutcomeGranted, resolution(out).Outcome)
		calls := h.dispatched()
		require.Len(t, calls, 1)
		require.NotNil(t, calls[0].Approval)
		assert.Equal(t, "ann", calls[0].Approval.Approver)
		assert.Equal(t, StatusRunning, h.st.Status)
		replay := h.apply(&events.ApprovalGranted{RunID: testRunID, ApprovalID: p.Context.ApprovalID, Token: sign(t, p.Context), Approver: "ann"})
		assert.Equal(t, actionbus.CodeApprovalReplayed, resolution(replay).Error.Code)
		assert.False(t, has(replay, EffectAct))
	})
	t.Run("a token for other input is refused and the run waits on", func(t *testing.T) {
		h, p := start(t)
		other := p.Context
		other.InputHash = "sha256:0000"
		out := h.apply(&events.ApprovalGranted{RunID: testRunID, ApprovalID: p.Context.ApprovalID, Token: sign(t, other)})
		assert.Equal(t, events.ApprovalOutcomeRefused, resolution(out).Outcome)
		assert.False(t, has(out, EffectAct))
		assert.Equal(t, StatusAwaitingApproval, h.st.Status)
	})
	t.Run("a token signed with a wrong secret over the stored context is a bad signature", func(t *testing.T) {
		h, p := start(t)
		bad, err := policy.Sign("k1", []byte("not-the-secret-of-key-k1"), policy.ApprovalContext(p.Context))
		require.NoError(t, err)
		out := h.apply(&events.ApprovalGranted{RunID: testRunID, ApprovalID: p.Context.ApprovalID, Token: bad, Context: &p.Context})
		refusal := resolution(out).Error
		require.NotNil(t, refusal)
		assert.Equal(t, actionbus.CodeApprovalInvalid, refusal.Code)
		assert.Contains(t, refusal.Message, "bad signature")
		assert.NotContains(t, refusal.Message, "does not match the approval context")
		assert.Equal(t, policy.MismatchBadSignature, refusal.Details[policy.MismatchDetail])
		assert.Equal(t, StatusAwaitingApproval, h.st.Status)
	})
	t.Run("a valid token over another context is a context mismatch naming the fields", func(t *testing.T) {
		h, p := start(t)
		other := p.Context
		other.InputHash = "sha256:0000"
		out := h.apply(&events.ApprovalGranted{RunID: testRunID, ApprovalID: p.Context.ApprovalID, Token: sign(t, other), Context: &other})
		refusal := resolution(out).Error
		require.NotNil(t, refusal)
		assert.Equal(t, actionbus.CodeApprovalInvalid, refusal.Code)
		assert.Contains(t, refusal.Message, "does not match the approval context")
		assert.Contains(t, refusal.Message, "inputHash")
		assert.NotContains(t, refusal.Message, "bad signature")
		assert.Equal(t, policy.MismatchContext, refusal.Details[policy.MismatchDetail])
		assert.Equal(t, StatusAwaitingApproval, h.st.Status)
	})
	t.Run("a wrong secret over another context is a bad signature", func(t *testing.T) {
		h, p := start(t)
		other := p.Context
		other.InputHash = "sha256:0000"
		bad, err := policy.Sign("k1", []byte("not-the-secret-of-key-k1"), policy.ApprovalContext(other))
		require.NoError(t, err)
		out := h.apply(&events.ApprovalGranted{RunID: testRunID, ApprovalID: p.Context.ApprovalID, Token: bad, Context: &other})
		refusal := resolution(out).Error
		require.NotNil(t, refusal)
		assert.Contains(t, refusal.Message, "bad signature")
		assert.Equal(t, policy.MismatchBadSignature, refusal.Details[policy.MismatchDetail])
	})
	t.Run("a denial fails the run, naming the key's holder", func(t *testing.T) {
		h, p := start(t)
		out := h.apply(&events.ApprovalDenied{RunID: testRunID, ApprovalID: p.Context.ApprovalID, Token: signDenial(t, p.Context.ApprovalID, "no"), Reason: "no"})
		assert.Equal(t, events.ApprovalOutcomeDenied, resolution(out).Outcome)
		assert.Equal(t, "ann", resolution(out).Approver)
		assert.Equal(t, actionbus.CodeApprovalDenied, h.code())
	})
	t.Run("a denial without a valid token is refused and the run waits on", func(t *testing.T) {
		h, p := start(t)
		for _, dn := range []*events.ApprovalDenied{
			{RunID: testRunID, ApprovalID: p.Context.ApprovalID, Approver: "the-cfo", Reason: "no"},
			{RunID: testRunID, ApprovalID: p.Context.ApprovalID, Token: signDenial(t, p.Context.ApprovalID, "other reason"), Reason: "no"},
			{RunID: testRunID, ApprovalID: p.Context.ApprovalID, Token: signDenial(t, p.Context.ApprovalID, "no"), Approver: "the-cfo", Reason: "no"},
		} {
			out := h.apply(dn)
			assert.Equal(t, events.ApprovalOutcomeRefused, resolution(out).Outcome)
			assert.Equal(t, actionbus.CodeApprovalInvalid, resolution(out).Error.Code)
			assert.Equal(t, StatusAwaitingApproval, h.st.Status)
		}
	})
	t.Run("an approval that expires fails the run; a late grant is refused as expired", func(t *testing.T) {
		h, p := start(t)
		h.fire(events.TimerApproval)
		assert.Equal(t, actionbus.CodeApprovalExpired, h.code())
		out := h.apply(&events.ApprovalGranted{RunID: testRunID, ApprovalID: p.Context.ApprovalID, Token: sign(t, p.Context)})
		assert.Equal(t, actionbus.CodeApprovalExpired, resolution(out).Error.Code)
	})
	t.Run("a result for the call before its approval is ignored", func(t *testing.T) {
		h, p := start(t)
		callID := h.st.Calls[p.CallIndex].CallID
		assert.Nil(t, h.succeed(callID, map[string]any{"done": true}), "an executor cannot complete what was never dispatched")
		assert.Nil(t, h.failCall(callID, "upstream_down"))
		assert.Equal(t, StatusAwaitingApproval, h.st.Status)
	})
	t.Run("a grant for an approval that does not exist", func(t *testing.T) {
		h, p := start(t)
		ctx := p.Context
		ctx.ApprovalID = "nope"
		out := h.apply(&events.ApprovalGranted{RunID: testRunID, ApprovalID: "nope", Token: sign(t, ctx)})
		assert.Equal(t, actionbus.CodeApprovalInvalid, resolution(out).Error.Code)
	})
}

const retriedMutateWorkflow = `{"workflowName": "w", "steps": [
	{"id": "m", "action": "t.mutate", "input": {"id": "a"}, "allowedModes": ["mutate"], "retry": {"maxAttempts": 2, "delayMs": 1000}}]}`

// TestARetriedMutateStepIsApprovedAgainUnderAFreshID: the second attempt
// of a mutate step needs an approval of its own, under its own id, and
// gets it.
func TestARetriedMutateStepIsApprovedAgainUnderAFreshID(t *testing.T) {
	h := newHarness(t, events.RunLimits{})
	var wf map[string]any
	require.NoError(t, json.Unmarshal([]byte(retriedMutateWorkflow), &wf))
	h.start(events.RunRequested{Workflow: wf, AllowedModes: allModes})
	grant := func() string {
		ids := h.approvals()
		require.Len(t, ids, 1)
		p := h.st.Approvals[ids[0]]
		h.apply(&events.ApprovalGranted{RunID: testRunID, ApprovalID: ids[0], Token: sign(t, p.Context)})
		return ids[0]
	}
	first := grant()
	calls := h.dispatched()
	require.Len(t, calls, 1)
	h.failCall(calls[0].CallID, "upstream_down")
	assert.Equal(t, StepStatusWaitingRetry, h.st.Workflow.Steps[0].Status)
	h.fire(events.TimerRetry)
	second := grant()
	assert.NotEqual(t, first, second)
	calls = h.dispatched()
	require.Len(t, calls, 1, "the second attempt runs once approved")
	assert.Equal(t, 2, calls[0].Attempt)
	h.succeed(calls[0].CallID, map[string]any{"done": true})
	assert.Equal(t, StatusCompleted, h.st.Status)
}

func TestACancelDuringARetryDelayAbortsTheWorkflow(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).workflow(`{"workflowName": "w", "steps": [
		{"id": "a", "action": "t.read", "input": {}, "retry": {"maxAttempts": 3, "delayMs": 1000}}]}`)
	h.failCall(h.dispatched()[0].CallID, "upstream_down")
	require.True(t, h.st.waitingRetry())
	h.apply(&events.CancelRequested{RunID: testRunID, Reason: "stop"})
	assert.Equal(t, actionbus.CodeWorkflowAborted, h.code())
	assert.Nil(t, h.fire(events.TimerRetry), "the retry of an aborted workflow")
}

func TestWorkflowStepsRunWhenTheirReferencesAreSatisfied(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).workflow(`{"workflowName": "w", "steps": [
		{"id": "a", "action": "t.read", "input": {}},
		{"id": "b", "action": "t.query", "input": {"q": {"$fromStep": "a", "path": "/name"}}},
		{"id": "c", "action": "t.other", "input": {}}]}`)
	first := h.dispatched()
	require.Len(t, first, 2, "a and c have no references")
	assert.Equal(t, []string{"a", "c"}, []string{first[0].StepID, first[1].StepID})
	h.succeed(first[1].CallID, map[string]any{"c": 1})
	h.succeed(first[0].CallID, map[string]any{"name": "ann"})
	b := h.dispatched()
	require.Len(t, b, 1)
	assert.Equal(t, map[string]any{"q": "ann"}, b[0].Args)
	h.succeed(b[0].CallID, map[string]any{"b": true})
	require.Equal(t, StatusCompleted, h.st.Status)
	byStep := h.st.Terminal.Output.(map[string]any)["outputByStep"].(map[string]any)
	assert.Equal(t, map[string]any{"name": "ann"}, byStep["a"])
}

func TestWorkflowContinueOnError(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).workflow(`{"workflowName": "w", "steps": [
		{"id": "a", "action": "t.read", "input": {}, "continueOnError": true},
		{"id": "b", "action": "t.other", "input": {}}]}`)
	calls := h.dispatched()
	h.failCall(calls[0].CallID, "upstream_down")
	h.succeed(calls[1].CallID, nil)
	assert.Equal(t, StatusCompleted, h.st.Status)
}

func TestAnInvalidWorkflowFailsBeforeAnyStep(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).workflow(`{"workflowName": "w", "steps": [{"id": "a", "action": "t.nope", "input": {}}]}`)
	assert.Equal(t, actionbus.CodeWorkflowValidation, h.code())
	assert.False(t, has(h.all, EffectAct))
}

// TestWorkflowStateIsBounded: 20 steps of 250 KB outputs keep the state
// small: large outputs go to the artifact store; the last step reads a
// large output of the first whole.
func TestWorkflowStateIsBounded(t *testing.T) {
	var steps []string
	for i := range 19 {
		steps = append(steps, fmt.Sprintf(`{"id": "s%d", "action": "t.read", "input": {}}`, i))
	}
	steps = append(steps, `{"id": "last", "action": "t.query", "input": {"q": {"$fromStep": "s0", "path": "/blob"}}}`)
	h := newHarness(t, events.RunLimits{MaxPlanParallel: 4}).workflow(`{"workflowName": "big", "steps": [` + strings.Join(steps, ",") + `]}`)
	blob := strings.Repeat("b", 250<<10)
	largest := 0
	pending := h.dispatched()
	for !h.st.IsTerminal() {
		require.NotEmpty(t, pending)
		c := pending[0]
		pending = pending[1:]
		if c.StepID == "last" {
			assert.Len(t, c.Args["q"], len(blob), "the reference resolves to the whole output")
		}
		h.succeed(c.CallID, map[string]any{"blob": blob})
		pending = append(pending, h.dispatched()...)
		b, _ := json.Marshal(h.st)
		largest = max(largest, len(b))
	}
	assert.Equal(t, StatusCompleted, h.st.Status)
	b, _ := json.Marshal(h.st)
	assert.Less(t, len(b), 64<<10, "the final state")
	assert.Less(t, largest, 2*(250<<10)+(64<<10), "at most the calls in flight carry large arguments")
	assert.Len(t, h.env.artifacts, 20)
}

func TestExecRunFailsOnInvalidArguments(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).start(events.RunRequested{Action: &events.ActionCall{Name: "t.query", Args: map[string]any{}}})
	assert.Equal(t, KindExec, h.st.Kind)
	assert.Equal(t, actionbus.CodeActionArgsInvalid, h.code())
}

func TestExecRunCarriesTheHostsIdempotencyKey(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).start(events.RunRequested{Action: &events.ActionCall{Name: "t.read", IdempotencyKey: "k-1"}})
	calls := h.dispatched()
	require.Len(t, calls, 1)
	assert.Equal(t, "k-1", calls[0].IdempotencyKey)
	h.succeed(calls[0].CallID, map[string]any{"n": 1})
	assert.Equal(t, map[string]any{"n": float64(1)}, h.st.Terminal.Output)
}

// TestACatalogThatCannotBeReadEndsTheCallTyped: a lookup the catalog
// cannot answer is a typed failure (catalog_unavailable), never an event
// left unanswered and redelivered until the run's deadline (issue 36).
func TestACatalogThatCannotBeReadEndsTheCallTyped(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).agent()
	h.env.catalogDown = true
	out, err := h.m.Apply(context.Background(), h.st, Event{ID: "x", Data: &events.DecisionMade{RunID: testRunID, Cycle: 1, Decision: action("t.read", nil)}})
	require.NoError(t, err)
	h.record(h.settle(out))
	assert.Equal(t, actionbus.CodeCatalogUnavailable, h.code())
}

// TestIdsAreDeterministic: the same transition from the same stored state
// gives the same effect ids (a republished outbox is deduplicated), and
// another run key gives other ids.
func TestIdsAreDeterministic(t *testing.T) {
	run := func(key string) []string {
		env := newMemEnv(t)
		m := New(env, Config{})
		st, out, err := m.Start(context.Background(), &events.RunRequested{RunID: testRunID, Prompt: "p"}, key)
		require.NoError(t, err)
		more, err := m.Apply(context.Background(), st, Event{ID: "e", Data: &events.DecisionMade{RunID: testRunID, Cycle: 1,
			Decision: plan(action("t.read", nil), action("t.other", nil))}})
		require.NoError(t, err)
		more, err = m.Settle(context.Background(), env, st, more)
		require.NoError(t, err)
		var ids []string
		for _, e := range append(out, more...) {
			ids = append(ids, e.ID)
		}
		return ids
	}
	a, b, c := run("k1"), run("k1"), run("k2")
	assert.Equal(t, a, b)
	for i := range a {
		assert.NotEqual(t, a[i], c[i])
	}
}

func TestStepNamesAreUnique(t *testing.T) {
	seen := map[StepName]bool{}
	for _, n := range StepNames {
		assert.False(t, seen[n], "%s listed twice", n)
		seen[n] = true
	}
}

// Seed 000: partial_ok records failed actions as structured error results
// and goes on.
func TestPartialOKRecordsAFailedActionAsAPlannedActionErrorWithOKFalse(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).agent()
	p := plan(action("t.read", nil), action("t.other", nil))
	p.PartialOK = true
	h.decide(p)
	calls := h.dispatched()
	h.failCall(calls[1].CallID, "upstream_down")
	h.succeed(calls[0].CallID, map[string]any{"rows": 2})
	require.Len(t, h.st.Agent.Observations, 2)
	assert.Equal(t, map[string]any{"rows": float64(2)}, h.st.Agent.Observations[0].Output)
	assert.Equal(t, map[string]any{"ok": false, "kind": "planned_action_error", "actionName": "t.other", "planIndex": float64(1),
		"error": map[string]any{"code": "upstream_down", "message": "it failed"}}, h.st.Agent.Observations[1].Output)
	assert.Equal(t, 2, h.st.Cycle, "the run goes on")
}

// TestRunStartedNamesTheRunsKind: run.started says agent, exec or
// workflow (a workflow run was announced as an agent run).
func TestRunStartedNamesTheRunsKind(t *testing.T) {
	var wf map[string]any
	require.NoError(t, json.Unmarshal([]byte(`{"workflowName": "w", "steps": [{"id": "a", "action": "t.read", "input": {}}]}`), &wf))
	for _, tc := range []struct {
		req  events.RunRequested
		kind Kind
	}{
		{events.RunRequested{Prompt: "p"}, KindAgent},
		{events.RunRequested{Action: &events.ActionCall{Name: "t.read"}}, KindExec},
		{events.RunRequested{Workflow: wf}, KindWorkflow},
	} {
		h := newHarness(t, events.RunLimits{}).start(tc.req)
		assert.Equal(t, string(tc.kind), h.all[0].Data.(*events.RunStarted).Kind)
	}
}

// TestAStepWhoseInputWasTamperedWithFails: a large output kept as an
// artifact and overwritten before a later step reads it fails that step
// with artifact_mismatch; nothing runs with the changed input.
func TestAStepWhoseInputWasTamperedWithFails(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).workflow(`{"workflowName": "w", "steps": [
		{"id": "a", "action": "t.read", "input": {}},
		{"id": "c", "action": "t.other", "input": {}},
		{"id": "b", "action": "t.query", "input": {"q": {"$fromStep": "a", "path": "/blob"}, "n": {"$fromStep": "c", "path": "/n"}}}]}`)
	big := strings.Repeat("x", 20<<10)
	calls := h.dispatched()
	require.Len(t, calls, 2)
	// The output is stored when the result is applied (the shell stores
	// the artifact the transition asks for); it is overwritten right
	// after, before step b, readied by c's result, reads it.
	h.env.mu.Lock()
	h.env.tamper = true
	h.env.mu.Unlock()
	h.succeed(calls[0].CallID, map[string]any{"blob": big})
	require.False(t, h.st.IsTerminal())
	out := h.succeed(calls[1].CallID, map[string]any{"n": 1})
	assert.False(t, has(out, EffectAct), "step b did not run")
	assert.Equal(t, actionbus.CodeWorkflowExecution, h.code())
	cause, _ := h.st.Terminal.Error.Details["cause"].(map[string]any)
	assert.Equal(t, string(actionbus.CodeArtifactMismatch), cause["code"], "%+v", h.st.Terminal.Error)
}

// A step readied by the result that makes its input an artifact reads
// the output as it came: the artifact is stored by the shell after the
// transition (EffectArtifact), and the step runs with the whole value.
func TestAStepReadsAnOutputKeptAsAnArtifactInTheSameTransition(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).workflow(`{"workflowName": "w", "steps": [
		{"id": "a", "action": "t.read", "input": {}},
		{"id": "b", "action": "t.query", "input": {"q": {"$fromStep": "a", "path": "/blob"}}}]}`)
	big := strings.Repeat("x", 20<<10)
	a := h.dispatched()[0]
	out, err := h.m.Apply(context.Background(), h.st, Event{ID: "r", Data: &events.ActionCompleted{RunID: testRunID, CallID: a.CallID,
		Cycle: h.st.Cycle, PlanIndex: a.PlanIndex, Attempt: a.Attempt, Output: map[string]any{"blob": big}, Executor: "x1"}})
	require.NoError(t, err)
	i := slices.IndexFunc(out, func(e Effect) bool { return e.Kind == EffectArtifact })
	require.GreaterOrEqual(t, i, 0, "the transition asks the shell to store the artifact")
	put := out[i].Artifact
	assert.Equal(t, map[string]any{"artifact": jsonValue(put.Ref)}, jsonValue(h.st.Workflow.Steps[0].Output), "the state keeps the reference")
	var stored map[string]any
	require.NoError(t, json.Unmarshal(put.Data, &stored))
	assert.Equal(t, big, stored["blob"])
	h.env.mu.Lock()
	assert.Empty(t, h.env.artifacts, "the machine stores nothing itself")
	h.env.mu.Unlock()
	h.record(h.settle(out))
	h.env.mu.Lock()
	assert.Len(t, h.env.artifacts, 1, "the shell stored it")
	h.env.mu.Unlock()
	b := h.dispatched()
	require.Equal(t, 1, len(b), "step b is handed out")
	assert.True(t, b[0].Args["q"] == big, "step b runs with the output as it came")
}

// One durable timer covers every call in flight (not one per call): a
// plan of three arms one; when it fires, every silent call is sent once
// more and the timer is armed again; a second silence stalls the run.
func TestOneTimerCoversEveryCallInFlight(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).agent()
	out := h.decide(plan(action("t.read", nil), action("t.other", nil), action("t.read", map[string]any{"q": "x"})))
	timers := func(out []Effect) int {
		n := 0
		for _, e := range out {
			if e.Kind == EffectTimer && e.Timer.Fired.Kind == events.TimerAction {
				n++
			}
		}
		return n
	}
	require.Len(t, h.dispatched(), 3)
	assert.Equal(t, 1, timers(out), "one schedule for three calls")
	calls := h.dispatched()
	assert.Empty(t, timers(h.succeed(calls[0].CallID, nil)), "a result arms nothing")

	out = h.fire(events.TimerAction)
	assert.Len(t, h.dispatched(), 2, "both silent calls are sent once more")
	assert.Equal(t, 1, timers(out), "and covered by one new schedule")
	assert.False(t, h.st.IsTerminal())

	out = h.fire(events.TimerAction)
	assert.Equal(t, actionbus.CodeStageStalled, h.code())
	assert.True(t, has(out, EffectEnd))
}

// A run stored before calls shared one timer keeps its calls' own
// schedules: the calls timer neither fires them early nor loses them.
func TestCallsFromBeforeTheSharedTimerKeepTheirOwnSchedules(t *testing.T) {
	h := newHarness(t, events.RunLimits{}).agent()
	h.decide(plan(action("t.read", nil), action("t.other", nil)))
	calls := h.dispatched()
	call := func(i int) *CallState { return &h.st.Calls[h.st.callIndex(calls[i].CallID)] }
	call(0).DueAt = time.Time{} // as stored by the earlier version
	h.fire(events.TimerAction)
	assert.False(t, call(0).Redispatched, "the shared timer leaves a call with its own schedule alone")
	assert.True(t, call(1).Redispatched)
	// Its own schedule still answers its silence.
	out := h.apply(&events.TimerFired{RunID: testRunID, Kind: events.TimerAction, Cycle: h.st.Cycle, CallID: calls[0].CallID})
	assert.Contains(t, stepNames(out), string(StepActionRedispatched))
	assert.False(t, call(0).DueAt.IsZero(), "and from then on the shared timer covers it")
}

// TestAGatewaysPrincipalHoldsUntilItExpires: a run acts for the user a
// gateway signed for it; the same statement replayed after it expired
// (a tenant's client can read the stored request, and a run's state is
// gone after its retention) fails the run unauthenticated, holding no role.
func TestAGatewaysPrincipalHoldsUntilItExpires(t *testing.T) {
	request := func(h *harness) events.RunRequested {
		claim := policy.PrincipalClaim{RunID: testRunID, Tenant: events.DefaultTenant, User: "alice", Roles: []string{"finance"},
			ExpiresAt: h.env.Now().Add(policy.PrincipalTTL)}
		token, err := policy.SignPrincipal("gw", testKey, claim)
		require.NoError(t, err)
		return events.RunRequested{Prompt: "help", UserID: "mallory", Principal: &events.Principal{User: "alice", Roles: claim.Roles,
			ExpiresAt: claim.ExpiresAt, Token: token}}
	}
	h := newHarness(t, events.RunLimits{})
	h.start(request(h))
	assert.Equal(t, "alice", h.st.UserID, "the run acts for the gateway's user, not the userId written beside it")
	assert.Equal(t, policy.Principal{Tenant: events.DefaultTenant, Gateway: "gw", User: "alice", Grants: policy.Grants{Roles: []string{"finance"}}}, h.st.Principal)
	assert.False(t, h.st.IsTerminal())

	replay := newHarness(t, events.RunLimits{})
	req := request(replay)
	replay.env.advance(7 * 24 * time.Hour)
	replay.start(req)
	require.True(t, replay.st.IsTerminal(), "an expired principal started a run")
	assert.Equal(t, actionbus.CodeUnauthenticated, replay.code())
	assert.Empty(t, replay.st.Principal.Roles, "the refused run holds no role")
}
