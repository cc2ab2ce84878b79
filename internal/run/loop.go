package run

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/skills"
)

// The loop of a run: observe (results come back), orient (they are
// recorded in declaration order, guards applied), decide (the planner is
// asked), act (calls are validated and dispatched), evaluate (a cycle's
// results decide whether the run ends). Every phase is recorded as a
// run.step with the seed's telemetry names.

// The seed's skill actions that change planner state (skills.Mutator)
// must run alone, never inside a plan. Actions can declare the same with
// PlannerMeta.StateMutator.

// clarifyAction is the action name a clarify decision maps to in the
// run's observations.
const clarifyAction = "ask_clarification"

func (m *Machine) askPlanner(st *State) []Effect {
	var out []Effect
	if st.Cycle > 0 {
		out = append(out, step(st, StepOrient, nil, "", fmt.Sprintf("%d observations", len(st.Agent.Observations)), ""))
	}
	st.Cycle++
	st.Phase = PhaseDeciding
	st.Calls = nil
	st.Agent.Plan = nil
	if st.Cycle > m.lim.MaxCycles {
		st.Cycle--
		return append(out, m.terminate(st, &Terminal{Type: events.TypeRunFailed, Error: actionbus.Errorf(actionbus.CodeMaxCycles,
			"run used its %d planner cycles without a final answer", m.lim.MaxCycles)})...)
	}
	return append(out, step(st, StepDecide, nil, "", fmt.Sprintf("asking the planner (cycle %d)", st.Cycle), ""),
		decideEffect(st), m.timer(st, events.TimerFired{Kind: events.TimerDecision, Stage: "planner"}, "decide", m.lim.DecisionTimeout))
}

// terminate ends the run: it stores its terminal event and returns it.
func (m *Machine) terminate(st *State, t *Terminal) []Effect {
	st.Terminal = t
	st.Phase = ""
	switch t.Type {
	case events.TypeRunCompleted:
		st.Status = StatusCompleted
	case events.TypeRunCanceled:
		st.Status = StatusCanceled
	default:
		st.Status = StatusFailed
	}
	return append(releaseEffects(st), endEffect(st))
}

// StoredEnd is the [Terminal] of a run's stored terminal event (data is
// the decoded data of a run.completed, run.failed or run.canceled); ok is
// false for any other event.
func StoredEnd(data any) (t *Terminal, ok bool) {
	switch d := data.(type) {
	case *events.RunCompleted:
		return &Terminal{Type: events.TypeRunCompleted, Answer: d.Answer, Output: d.Output, Citations: d.Citations}, true
	case *events.RunCanceled:
		return &Terminal{Type: events.TypeRunCanceled, Reason: d.Reason}, true
	case *events.RunFailed:
		cause := d.Error
		return &Terminal{Type: events.TypeRunFailed, Error: &cause}, true
	}
	return nil, false
}

// Adopt ends st with t, the terminal event its run already has in the
// stream, whatever st would decide: the end was published before the
// state that decided it was written, and the writer did not write it (it
// crashed, or lost its partition). It returns what the end implies
// besides its event, which is stored: the run's slots released.
func (m *Machine) Adopt(st *State, t *Terminal) []Effect { return Adopt(st, t) }

// Adopt is [Machine.Adopt], for a reader without a machine (a listing of
// runs): it needs none.
func Adopt(st *State, t *Terminal) []Effect {
	st.Terminal = nil
	var m Machine
	out := m.terminate(st, t)
	return slices.DeleteFunc(out, func(e Effect) bool { return e.Kind == EffectEnd })
}

func (m *Machine) fail(st *State, err error) []Effect {
	var abErr *actionbus.Error
	if !errors.As(err, &abErr) {
		abErr = &actionbus.Error{Code: actionbus.CodeInternal, Message: err.Error()}
	}
	return m.terminate(st, &Terminal{Type: events.TypeRunFailed, Error: abErr})
}

// reject gives a decision back to the planner with the reason, without
// running anything: the planner corrects itself on the next cycle.
func (m *Machine) reject(st *State, stepName StepName, err *actionbus.Error) []Effect {
	st.Agent.Feedback = err
	return append([]Effect{step(st, stepName, nil, "", err.Error(), "failed")}, m.askPlanner(st)...)
}

func (m *Machine) onDecision(ctx context.Context, st *State, dm *events.DecisionMade) ([]Effect, error) {
	if st.Agent != nil && !st.IsTerminal() && dm.Cycle > st.Cycle {
		return nil, ErrAhead // the result that asks for it is not applied yet
	}
	if st.Agent == nil || st.IsTerminal() || st.Phase != PhaseDeciding || dm.Cycle != st.Cycle {
		return nil, nil // stale or duplicate decision
	}
	var diag []Effect
	if len(dm.Diagnostics) > 0 {
		// Planning evidence, not executed work: one step names them all.
		codes := make([]string, len(dm.Diagnostics))
		for i, e := range dm.Diagnostics {
			codes[i] = string(e.Code)
		}
		diag = append(diag, stepWith(st, StepPlannerDiagnostics, nil, "", strings.Join(codes, ", "), "",
			map[string]any{"diagnostics": dm.Diagnostics}))
	}
	if over := m.spend(st, dm.Usage); over != nil && dm.Error == nil {
		return append(diag, m.fail(st, over)...), nil
	}
	if dm.Error != nil {
		if dm.Error.Code == actionbus.CodeBudgetExceeded && st.Usage != nil {
			// The planner refused a call: the evidence is the run's usage.
			return append(diag, m.fail(st, dm.Error.WithDetail("usage", *st.Usage))...), nil
		}
		return append(diag, m.fail(st, dm.Error)...), nil
	}
	out, err := m.applyDecision(ctx, st, dm)
	return append(diag, out...), err
}

func (m *Machine) applyDecision(ctx context.Context, st *State, dm *events.DecisionMade) ([]Effect, error) {
	st.Agent.Feedback = nil
	st.Agent.Synthesize = ""
	hidden := st.Agent.Withhold // withheld from this decision only
	st.Agent.Withhold = nil
	dec := dm.Decision
	switch dec.Type {
	case events.DecisionFinal:
		out := []Effect{step(st, StepFinal, nil, "", dec.Answer, "ok")}
		return append(out, m.terminate(st, &Terminal{Type: events.TypeRunCompleted, Answer: dec.Answer, Citations: dec.Citations})...), nil
	case events.DecisionAction:
		if dec.Name == "" {
			return m.reject(st, StepDecisionInvalid, actionbus.Errorf(actionbus.CodeInvalidDecision, "an action decision needs a name")), nil
		}
		if skills.Mutator(dec.Name) {
			return m.onSkillAction(ctx, st, dec)
		}
		if isWorkspaceAction(dec.Name) {
			return m.onWorkspaceAction(ctx, st, dec, hidden)
		}
		return m.startCalls(ctx, st, []events.Decision{dec}, events.OriginModel, nil)
	case events.DecisionPlan:
		if err := m.checkPlanShape(dec); err != nil {
			return m.reject(st, StepPlanValidationFailed, err), nil
		}
		if err := checkPerAction(dec); err != nil {
			return m.reject(st, StepPlanValidationFailed, err), nil
		}
		ps := &PlanState{PartialOK: dec.PartialOK, SynthesizeInstruction: dec.SynthesizeInstruction, PerAction: dec.SynthesizePerAction, Stitch: dec.Stitch}
		if dec.SynthesizePerAction {
			for _, a := range dec.Actions {
				ps.Sections = append(ps.Sections, *a.Section)
			}
		}
		return m.startCalls(ctx, st, dec.Actions, events.OriginModel, ps)
	case events.DecisionClarify:
		if strings.TrimSpace(dec.Question) == "" {
			return m.reject(st, StepDecisionInvalid, actionbus.Errorf(actionbus.CodeInvalidDecision, "a clarify decision needs a question")), nil
		}
		st.Phase = PhaseAwaitingInput
		st.Status = StatusAwaitingInput
		st.Agent.Question = dec.Question
		return []Effect{
			step(st, StepAwaitingInput, nil, clarifyAction, dec.Question, ""),
			m.timer(st, events.TimerFired{Kind: events.TimerInput, Stage: "input"}, "input", m.lim.InputTimeout),
		}, nil
	}
	return m.reject(st, StepDecisionInvalid, actionbus.Errorf(actionbus.CodeInvalidDecision, "unknown decision type %q (want action, plan, clarify or final)", dec.Type)), nil
}

// checkPlanShape applies the plan envelope rules that need no catalog.
func (m *Machine) checkPlanShape(dec events.Decision) *actionbus.Error {
	switch {
	case len(dec.Actions) == 0:
		return actionbus.Errorf(actionbus.CodePlanRejected, "a plan needs at least one action")
	case len(dec.Actions) > m.lim.MaxPlanActions:
		return actionbus.Errorf(actionbus.CodePlanRejected, "plan has %d actions; at most %d are allowed per plan (split it or run some first)",
			len(dec.Actions), m.lim.MaxPlanActions).WithDetail("actions", len(dec.Actions)).WithDetail("maxPlanActions", m.lim.MaxPlanActions)
	}
	for i, a := range dec.Actions {
		if a.Type != events.DecisionAction {
			return actionbus.Errorf(actionbus.CodePlanRejected, "plan entry %d has type %q; a plan may contain only action envelopes (no nested plans, clarify or final)", i, a.Type).
				WithDetail("planIndex", i)
		}
		if skills.Mutator(a.Name) || isWorkspaceAction(a.Name) {
			return actionbus.Errorf(actionbus.CodePlanRejected, "%s changes planner state and must run as a standalone action before planning", a.Name).
				WithDetail("planIndex", i).WithDetail("action", a.Name)
		}
	}
	return nil
}

func (m *Machine) onInput(st *State, in *events.InputProvided) []Effect {
	if st.IsTerminal() {
		return nil
	}
	if st.Agent == nil || st.Phase != PhaseAwaitingInput {
		// Said, not dropped in silence: an answer sent before the run
		// asks (a client that answered the planner's clarify decision
		// before the dispatcher applied it) is sent again once the run's
		// awaiting-input step says it waits.
		phase := string(st.Phase)
		if phase == "" {
			phase = string(st.Status)
		}
		return []Effect{step(st, StepInputIgnored, nil, clarifyAction, fmt.Sprintf("the run is not waiting for an answer (%s)", phase), "failed")}
	}
	st.Status = StatusRunning
	st.Agent.Observations = append(st.Agent.Observations, events.Observation{Cycle: st.Cycle, Action: clarifyAction, OK: true,
		Output: map[string]any{"question": st.Agent.Question, "answer": in.Answer}, Summary: "answered: " + in.Answer})
	st.Agent.Question = ""
	out := []Effect{step(st, StepInputReceived, nil, clarifyAction, in.Answer, "ok")}
	return append(out, m.askPlanner(st)...)
}

func (m *Machine) onTimer(ctx context.Context, st *State, t *events.TimerFired) ([]Effect, error) {
	if st.IsTerminal() {
		return nil, nil
	}
	if t.Kind == events.TimerRetry {
		return m.onRetryTimer(ctx, st, t.StepID)
	}
	if t.Kind == events.TimerCapacity {
		return m.onCapacity(st, true), nil
	}
	if t.Kind == events.TimerAlarm {
		return m.onAlarm(ctx, st)
	}
	return m.onStageTimer(st, t), nil
}

func (m *Machine) onStageTimer(st *State, t *events.TimerFired) []Effect {
	stalled := func(stage string, details ...any) []Effect {
		err := actionbus.Errorf(actionbus.CodeStageStalled, "stage %s did not answer by %s", stage, t.DueAt.Format(time.RFC3339)).
			WithDetail("stage", stage).WithDetail("cycle", t.Cycle)
		for i := 0; i+1 < len(details); i += 2 {
			err = err.WithDetail(details[i].(string), details[i+1])
		}
		return append([]Effect{step(st, StepStageStalled, nil, "", err.Message, "failed")}, m.fail(st, err)...)
	}
	switch t.Kind {
	case events.TimerRunDeadline:
		if m.env.Now().Before(st.Deadline.Add(-time.Second)) {
			return nil // a stale schedule from before a deadline change
		}
		err := actionbus.Errorf(actionbus.CodeRunDeadline, "run passed its deadline %s", st.Deadline.Format(time.RFC3339)).
			WithDetail("phase", st.Phase).WithDetail("cycle", st.Cycle)
		return m.fail(st, err)
	case events.TimerDecision:
		if st.Phase == PhaseDeciding && st.Cycle == t.Cycle {
			return stalled("planner")
		}
	case events.TimerInput:
		if st.Phase == PhaseAwaitingInput && st.Cycle == t.Cycle {
			return stalled("input")
		}
	case events.TimerSynthesis:
		if st.Phase == PhaseSynthesizing && st.Cycle == t.Cycle {
			return stalled("synthesis")
		}
	case events.TimerApproval:
		if p, ok := st.Approvals[t.ApprovalID]; ok {
			delete(st.Approvals, t.ApprovalID)
			st.ApprovalsExpired = append(st.ApprovalsExpired, t.ApprovalID)
			err := actionbus.Errorf(actionbus.CodeApprovalExpired, "approval %s was not given before %s", t.ApprovalID, p.Context.ExpiresAt.Format(time.RFC3339)).
				WithDetail("approvalId", t.ApprovalID).WithDetail("action", p.Context.Action)
			return append([]Effect{step(st, StepApprovalExpired, nil, p.Context.Action, err.Message, "failed")}, m.fail(st, err)...)
		}
	case events.TimerAction:
		if t.CallID == "" {
			// The run's calls timer covers the calls in flight, whatever
			// the cycle that armed it.
			return m.onCallsDue(st, stalled)
		}
		if st.Phase != PhaseActing || st.Cycle != t.Cycle {
			return nil
		}
		// A schedule of one call (armed before calls shared one timer).
		if i := st.callIndex(t.CallID); i >= 0 && !st.Calls[i].Done {
			out := m.callSilent(st, &st.Calls[i], stalled)
			if st.IsTerminal() {
				return out
			}
			return append(out, m.armCalls(st)...)
		}
	}
	return nil
}

// onCallsDue handles the run's calls timer: every call in flight past its
// deadline is sent once more, or, when it already was, stalls the run;
// then the timer is armed again for the next deadline.
func (m *Machine) onCallsDue(st *State, stalled func(string, ...any) []Effect) []Effect {
	now := m.env.Now()
	var out []Effect
	for i := range st.Calls {
		c := &st.Calls[i]
		// A call without DueAt was dispatched with its own schedule
		// (before calls shared one), which still covers it.
		if !c.Dispatched || c.Done || c.DueAt.IsZero() || c.DueAt.After(now) {
			continue
		}
		out = append(out, m.callSilent(st, c, stalled)...)
		if st.IsTerminal() {
			return out
		}
	}
	return append(out, m.armCalls(st)...)
}

// callSilent answers a call's silence past its deadline; the caller arms
// the calls timer again. The first time, its request is sent once more:
// it may have been lost with a node (a consumer's leader moving can lose a
// delivery). It goes under its own event id, but the call id stays, so an
// executor that did run it replays its result (mutations are always keyed
// by their call id). The second time, the run stalls.
func (m *Machine) callSilent(st *State, c *CallState, stalled func(string, ...any) []Effect) []Effect {
	if c.Redispatched {
		return stalled("action "+c.Action, "action", c.Action, "planIndex", c.PlanIndex, "callId", c.CallID)
	}
	c.Redispatched = true
	c.DueAt = m.env.Now().Add(time.Duration(c.TimeoutMs)*time.Millisecond + m.lim.ActionGrace)
	pi := c.PlanIndex
	return []Effect{step(st, StepActionRedispatched, &pi, c.Action, "no answer by the deadline; the request is sent once more", ""),
		{Kind: EffectAct, ID: st.derive("redispatch", c.CallID), CallID: c.CallID}}
}

// armCalls keeps one durable timer for every call in flight: armed at the
// earliest deadline among them unless the armed one comes no later (a
// call dispatched later with the same timeout needs no new schedule; the
// armed one, when it fires, arms the next).
func (m *Machine) armCalls(st *State) []Effect {
	var next time.Time
	for _, c := range st.Calls {
		if c.Dispatched && !c.Done && !c.DueAt.IsZero() && (next.IsZero() || c.DueAt.Before(next)) {
			next = c.DueAt
		}
	}
	// An armed time already reached has fired, or fires within the
	// second: a new schedule replaces it.
	armed := st.CallsDueAt.After(m.env.Now())
	if next.IsZero() || (armed && !st.CallsDueAt.After(next)) {
		return nil
	}
	st.CallsDueAt = next
	f := events.TimerFired{Kind: events.TimerAction, Stage: "actions", RunID: st.RunID, Cycle: st.Cycle}
	// The id names the time: a later schedule of the same name replaces
	// the earlier one instead of being dropped as its duplicate.
	id := st.derive("timer", "calls", st.Cycle, next.UnixMilli())
	return []Effect{{Kind: EffectTimer, ID: id, Timer: &Timer{Name: "calls", At: next, Fired: f}}}
}

// dispatchMore dispatches calls in declaration order while fewer than
// MaxPlanParallel are in flight, each with a durable action deadline. A
// call under a limit that holds no slot yet is asked for one first: the
// pass stops at it with an [EffectAcquire], and goes on where it stopped
// when the shell applies the answer ([Machine.onCapacityAnswer]). A call
// whose limit has no slot for it waits (a waiting-for-capacity step,
// once) and is asked for again at the time the limit names; calls behind
// it with other keys go on.
func (m *Machine) dispatchMore(st *State) []Effect {
	return m.dispatchFrom(st, CapacityAsk{})
}

// dispatchFrom is the dispatch pass of dispatchMore from the call at
// index pass.Call, with what the pass found before it (pass).
func (m *Machine) dispatchFrom(st *State, pass CapacityAsk) []Effect {
	var out []Effect
	for i := pass.Call; i < len(st.Calls); i++ {
		if st.inFlight() >= m.lim.MaxPlanParallel {
			break
		}
		c := &st.Calls[i]
		if c.Dispatched || c.NeedsApproval {
			continue
		}
		if !c.Holding {
			pass.Call, pass.CallID = i, c.CallID
			ask := pass
			return append(out, Effect{Kind: EffectAcquire, ID: c.CallID, CallID: c.CallID, Ask: &ask})
		}
		out = append(out, m.dispatch(st, c)...)
	}
	out = append(out, m.armCalls(st)...)
	if !pass.RetryAt.IsZero() {
		out = append(out, wakeEffect(st, pass.RetryAt))
		if pass.NewlyWaiting || pass.Durable {
			out = append(out, m.capacityTimer(st, pass.RetryAt))
		}
	}
	return out
}

// dispatch hands call c out, with its deadline.
func (m *Machine) dispatch(st *State, c *CallState) []Effect {
	pi := c.PlanIndex
	c.Dispatched = true
	c.DueAt = m.env.Now().Add(time.Duration(c.TimeoutMs)*time.Millisecond + m.lim.ActionGrace)
	return []Effect{step(st, StepActionDispatched, &pi, c.Action, "to pool "+c.Pool, ""), actEffect(*c)}
}

// asked returns the call ask asks a slot for, or nil when the run no
// longer waits to hand it out (it ended, or the call is not the one asked
// for, or is handed out, holds a slot or waits for an approval): such an
// ask is not put to a limit.
func (st *State) asked(ask CapacityAsk) *CallState {
	i := ask.Call
	if st.IsTerminal() || i < 0 || i >= len(st.Calls) {
		return nil
	}
	c := &st.Calls[i]
	if c.CallID != ask.CallID || c.Dispatched || c.Holding || c.NeedsApproval {
		return nil
	}
	return c
}

// onCapacityAnswer applies what a call's limit answered ([CapacityAsk])
// and goes on with the dispatch pass that asked. The pass stops at the
// ask, but the transition does not: a later timer of the same alarm may
// end the run, or hand the call out by a pass of its own, before the
// shell answers. Then the call is not put to its limit ([Machine.Settle]
// asks only for a call that still waits, [State.asked]); an ended run
// goes no further, and a pass whose call moved on goes on without it.
func (m *Machine) onCapacityAnswer(st *State, a *CapacityAnswer) []Effect {
	if st.IsTerminal() {
		return nil
	}
	pass, capacity := a.Ask, a.Capacity
	c := st.asked(a.Ask)
	if c == nil {
		// What the transition did after the pass stopped (a later timer
		// of the same alarm) moved the call on: the pass goes on without
		// it, so that what it found before still arms its wake-up.
		pass.Call++
		return m.dispatchFrom(st, pass)
	}
	if capacity.Err != "" {
		// The limit could not be read: wait and ask again.
		capacity = Capacity{Key: c.LimitKey, RetryAt: m.env.Now().Add(time.Second), Err: capacity.Err}
	}
	c.LimitKey = capacity.Key
	var out []Effect
	if capacity.OK {
		c.Holding, c.WaitingCapacity = capacity.Key != "", false
		out = m.dispatch(st, c)
	} else {
		if !c.WaitingCapacity {
			pi := c.PlanIndex
			c.WaitingCapacity, pass.NewlyWaiting = true, true
			out = append(out, stepWith(st, StepWaitingForCapacity, &pi, c.Action, capacity.describe(), "",
				map[string]any{"key": capacity.Key, "position": capacity.Position, "waiting": capacity.Waiting}))
		}
		if pass.RetryAt.IsZero() || capacity.RetryAt.Before(pass.RetryAt) {
			pass.RetryAt = capacity.RetryAt
		}
	}
	pass.Call++
	return append(out, m.dispatchFrom(st, pass)...)
}

// capacityTimer arms the durable backstop of a run waiting for capacity:
// the dispatcher wakes the run at retryAt from memory, and this timer
// wakes it even if that dispatcher is gone.
func (m *Machine) capacityTimer(st *State, retryAt time.Time) Effect {
	return m.timer(st, events.TimerFired{Kind: events.TimerCapacity, Stage: "capacity"}, "capacity",
		retryAt.Sub(m.env.Now())+CapacityBackstop)
}

// CapacityBackstop is how long after a waiting call's retry time its
// durable timer fires, should no dispatcher have woken the run by then.
const CapacityBackstop = 2 * time.Second

// onCapacity asks the limits again for the calls of st waiting for
// capacity (a wake-up, or the backstop timer when durable is set).
func (m *Machine) onCapacity(st *State, durable bool) []Effect {
	if st.IsTerminal() || st.Phase != PhaseActing || !slices.ContainsFunc(st.Calls, func(c CallState) bool { return c.WaitingCapacity }) {
		return nil
	}
	out := m.dispatchFrom(st, CapacityAsk{Durable: durable})
	if st.Workflow == nil && st.allDone() {
		out = append(out, m.evaluate(st)...)
	}
	return out
}

// releaseEffects free the limit slots (and queue places) of st's calls
// that are not done: the run ended.
func releaseEffects(st *State) []Effect {
	var out []Effect
	for _, c := range st.Calls {
		if c.LimitKey != "" && (c.Holding || c.WaitingCapacity) && !c.Done {
			out = append(out, releaseEffect(st, c))
		}
	}
	return out
}

// result is an action's result, from action.completed or action.failed.
type result struct {
	// at is where the result says its call was made.
	at               callAt
	callID, executor string
	ok               bool
	output           any
	summary          string
	complete         bool
	err              *actionbus.Error
}

func (m *Machine) onResult(ctx context.Context, st *State, r result) ([]Effect, error) {
	if st.IsTerminal() {
		return nil, nil
	}
	if st.resultAhead(r) {
		return nil, ErrAhead
	}
	i := st.callIndex(r.callID)
	if i < 0 || st.Calls[i].Done || !st.Calls[i].Dispatched {
		// A duplicate (the first result wins), a result of an earlier
		// cycle, or a result for a call never dispatched (one still
		// waiting for its approval): nothing ran that this run asked for.
		return nil, nil
	}
	ok, summary, abErr, executor := r.ok, r.summary, r.err, r.executor
	if !ok && abErr == nil {
		abErr = actionbus.Errorf(actionbus.CodeHandlerFailed, "action failed without an error")
	}
	c := &st.Calls[i]
	if c.Tool != "" && ok {
		tool := activeTool(st, *c)
		env := toolEnvelope(*c, tool, r.output)
		// A preparatory result kind is never the run's final evidence.
		if kind, _ := env["resultKind"].(string); skills.NonTerminalKind(kind) {
			r.complete = false
		}
		r.output = env
	}
	c.Done, c.OK, c.Output, c.Summary, c.Complete, c.Error, c.Executor = true, ok, r.output, summary, r.complete, abErr, executor
	var release []Effect
	if c.Holding {
		release = []Effect{releaseEffect(st, *c)}
	}
	if ok && c.Mode == string(actions.ModeDryRun) {
		if h, err := policy.InputHash(c.Args); err == nil {
			st.DryRuns = recordDryRun(st.DryRuns, DryRun{Action: c.Action, InputHash: h})
		}
	}
	// Run state keeps full outputs only where they become the run's
	// output; everything else is kept as the bounded digest the planner
	// sees, so state stays far below the server's message size limit.
	if _, skipped := directFinal(*c); st.Kind == KindAgent && !r.complete && !isDirectFinal(*c) && !skipped {
		c.Output = digest(r.output, m.lim.ObservationBytes)
	}
	pi := c.PlanIndex
	status, msg := "ok", summary
	if !ok {
		status, msg = "failed", string(abErr.Code)+": "+abErr.Message
	}
	name := StepActionCompleted
	if !ok {
		name = StepActionFailed
	}
	out := append(release, step(st, name, &pi, c.Action, msg+" (executor "+executor+")", status))
	if st.Workflow != nil {
		more, err := m.onStepResult(ctx, st, i)
		return append(out, more...), err
	}
	out = append(out, m.dispatchMore(st)...)
	if !st.allDone() {
		return out, nil
	}
	return append(out, m.evaluate(st)...), nil
}

// observe turns a call into the observation the planner sees: status,
// summary, and the output or, when it is larger than ObservationBytes, a
// bounded digest (execution recall: never a full large payload).
func (m *Machine) observe(st *State, c CallState, isPlan bool) events.Observation {
	return observe(st, c, isPlan, m.lim.ObservationBytes)
}

func observe(st *State, c CallState, isPlan bool, maxBytes int) events.Observation {
	obs := events.Observation{Cycle: st.Cycle, Action: c.Action, OK: c.OK, Output: digest(c.Output, maxBytes), Summary: c.Summary, Error: c.Error}
	if c.Tool != "" {
		obs.Action = skills.ExecuteTool // the planner called the tool so
	}
	if isPlan {
		pi := c.PlanIndex
		obs.PlanIndex = &pi
	}
	return obs
}

// plannedActionError is the structured error result a failed action of a
// partial_ok plan records (seed 000): ok false, its kind, action, plan
// index and error.
func plannedActionError(c CallState) map[string]any {
	out := map[string]any{"ok": false, "kind": "planned_action_error", "actionName": c.Action, "planIndex": c.PlanIndex}
	if c.Error != nil {
		out["error"] = map[string]any{"code": string(c.Error.Code), "message": c.Error.Message}
	}
	return out
}

// digest returns v, or a bounded digest of it when its JSON is larger than
// max bytes.
func digest(v any, max int) any {
	if v == nil {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil || len(b) <= max {
		return v
	}
	sum := sha256.Sum256(b)
	preview := string(b[:max/2])
	for len(preview) > 0 && !json.Valid([]byte(`"`+preview+`"`)) && preview[len(preview)-1] >= 0x80 {
		preview = preview[:len(preview)-1] // do not cut a UTF-8 sequence
	}
	return map[string]any{"truncated": true, "bytes": len(b), "sha256": hex.EncodeToString(sum[:]), "preview": preview}
}

// directFinal returns the markdown of a call whose output is a direct
// final answer ({resultKind: "final", markdown: "..."}); skipped reports a
// final result kind without markdown.
func directFinal(c CallState) (markdown string, skipped bool) {
	m, ok := c.Output.(map[string]any)
	if !ok || m["resultKind"] != "final" {
		return "", false
	}
	md, _ := m["markdown"].(string)
	if strings.TrimSpace(md) == "" {
		return "", true
	}
	return md, false
}

func isDirectFinal(c CallState) bool {
	md, _ := directFinal(c)
	return md != ""
}

// evaluate runs when every call of the cycle has a result: results are
// recorded in declaration order, whatever order they arrived in; then the
// run ends (a direct final, a Complete result), stops (repeated failures)
// or goes back to the planner.
func (m *Machine) evaluate(st *State) []Effect {
	out := []Effect{step(st, StepObserve, nil, "", fmt.Sprintf("%d result(s)", len(st.Calls)), "")}
	if st.Agent == nil { // an exec run: its one call is its result
		c := st.Calls[0]
		if !c.OK {
			return append(out, m.terminate(st, &Terminal{Type: events.TypeRunFailed, Error: c.Error})...)
		}
		return append(out, m.terminate(st, &Terminal{Type: events.TypeRunCompleted, Output: c.Output, Answer: c.Summary})...)
	}
	isPlan := st.Agent.Plan != nil
	if isPlan {
		out = append(out, step(st, StepPlanExecuted, nil, "", fmt.Sprintf("%d actions", len(st.Calls)), ""))
	}
	var failed, succeeded []CallState
	for _, c := range st.Calls {
		if c.OK {
			succeeded = append(succeeded, c)
		} else {
			failed = append(failed, c)
		}
	}
	if isPlan && !st.Agent.Plan.PartialOK && len(failed) > 0 {
		// No output is applied; the observation names the first failure in
		// declaration order.
		first := failed[0]
		obs := m.observe(st, first, true)
		obs.Summary = fmt.Sprintf("plan failed: %d of %d actions failed; first failure at planIndex %d; no output applied", len(failed), len(st.Calls), first.PlanIndex)
		st.Agent.Observations = append(st.Agent.Observations, obs)
		out = append(out, step(st, StepPlanFailed, nil, "", obs.Summary, "failed"))
	} else {
		for _, c := range st.Calls {
			obs := m.observe(st, c, isPlan)
			if isPlan && !c.OK {
				obs.Output = plannedActionError(c)
			}
			st.Agent.Observations = append(st.Agent.Observations, obs)
		}
	}
	facts, stopped := m.guard(st, failed, succeeded)
	out = append(out, facts...)
	if stopped {
		return out
	}
	out = append(out, step(st, StepEvaluate, nil, "", fmt.Sprintf("%d ok, %d failed", len(succeeded), len(failed)), ""))
	if isPlan && st.Agent.Plan.PerAction && (st.Agent.Plan.PartialOK || len(failed) == 0) {
		return append(out, m.startSynthesis(st)...)
	}
	if !isPlan || st.Agent.Plan.PartialOK || len(failed) == 0 {
		// A direct final result ends the run; declaration order wins.
		for _, c := range st.Calls {
			if !c.OK {
				continue
			}
			md, skipped := directFinal(c)
			pi := c.PlanIndex
			if skipped {
				out = append(out, stepWith(st, StepDirectFinalSkipped, &pi, c.Action, "resultKind final without markdown", "", nil))
				continue
			}
			if md != "" {
				out = append(out, stepWith(st, StepDirectFinalEmitted, &pi, c.Action, "direct-emit-final", "ok",
					map[string]any{"reason": "direct-emit-final", "finalAnswerSource": "direct_final"}))
				return append(out, m.terminate(st, &Terminal{Type: events.TypeRunCompleted, Answer: md, Output: c.Output})...)
			}
		}
		// A handler result with Complete ends the run; declaration order wins.
		for _, c := range st.Calls {
			if c.OK && c.Complete {
				return append(out, m.terminate(st, &Terminal{Type: events.TypeRunCompleted, Output: c.Output, Answer: c.Summary})...)
			}
		}
	}
	if isPlan && len(failed) == 0 {
		switch ins := st.Agent.Plan.SynthesizeInstruction; ins {
		case "", "direct":
		default:
			st.Agent.Synthesize = ins
			out = append(out, step(st, StepPlanSynthesizeRequested, nil, "", ins, ""))
		}
	}
	return append(out, m.askPlanner(st)...)
}

// guard records repeated failures (as action-repeated-failure steps) and
// stops the loop when the same action has failed MaxFailedRounds
// consecutive rounds, failing the run with the failure evidence. A round in
// which an action succeeds, or is not called, resets its count.
func (m *Machine) guard(st *State, failed, succeeded []CallState) (out []Effect, stopped bool) {
	if st.Agent.FailStreaks == nil {
		st.Agent.FailStreaks = map[string]int{}
		st.Agent.FailEvidence = map[string][]actionbus.Error{}
	}
	round := map[string]bool{}
	for _, c := range succeeded {
		round[c.Action] = round[c.Action] || false // called; failed only if a call failed
	}
	for _, c := range failed {
		round[c.Action] = true
	}
	for name := range st.Agent.FailStreaks {
		if _, called := round[name]; !called {
			delete(st.Agent.FailStreaks, name)
			delete(st.Agent.FailEvidence, name)
		}
	}
	var names []string
	for name := range round {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !round[name] {
			delete(st.Agent.FailStreaks, name)
			delete(st.Agent.FailEvidence, name)
			continue
		}
		st.Agent.FailStreaks[name]++
		for _, c := range failed {
			if c.Action == name && c.Error != nil {
				st.Agent.FailEvidence[name] = append(st.Agent.FailEvidence[name], *c.Error)
				break
			}
		}
		n := st.Agent.FailStreaks[name]
		if n < 2 && n < m.lim.MaxFailedRounds {
			continue // a single failed round is feedback, not yet a streak
		}
		out = append(out, stepWith(st, StepActionRepeatedFailure, nil, name, fmt.Sprintf("%s failed %d consecutive rounds", name, n), "failed",
			map[string]any{"rounds": n, "evidence": st.Agent.FailEvidence[name]}))
		if n >= m.lim.MaxFailedRounds {
			err := actionbus.Errorf(actionbus.CodeRepeatedFailure, "%s failed %d consecutive rounds; stopping the loop", name, n).
				WithDetail("action", name).WithDetail("rounds", n).WithDetail("evidence", st.Agent.FailEvidence[name])
			return append(out, m.fail(st, err)...), true
		}
	}
	return out, false
}
