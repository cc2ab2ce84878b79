package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/events"
	"github.com/actionbus/actionbus/internal/policy"
)

// The loop of a run: observe (results come back), orient (they are
// recorded in declaration order, guards applied), decide (the planner is
// asked), act (calls are validated and dispatched), evaluate (a cycle's
// results decide whether the run ends). Every phase is recorded as a
// run.step with the seed's telemetry names.

// plannerStateMutators are the seed's actions that change planner state;
// they must run alone, never inside a plan. Actions can declare the same
// with PlannerMeta.StateMutator.
var plannerStateMutators = map[string]bool{
	"list_agent_skills": true, "read_agent_skill": true, "use_agent_skill": true, "handoff_to_skill": true,
}

// clarifyAction is the action name a clarify decision maps to in the
// run's observations.
const clarifyAction = "ask_clarification"

func (d *Dispatcher) askPlanner(st *RunState) []emission {
	var out []emission
	if st.Cycle > 0 {
		out = append(out, step(st, "orient", nil, "", fmt.Sprintf("%d observations", len(st.Observations)), ""))
	}
	st.Cycle++
	st.Phase = PhaseDeciding
	st.Calls = nil
	st.Plan = nil
	if st.Cycle > d.cfg.MaxCycles {
		st.Cycle--
		return append(out, d.terminate(st, &Terminal{Type: events.TypeRunFailed, Error: actionbus.Errorf(actionbus.CodeMaxCycles,
			"run used its %d planner cycles without a final answer", d.cfg.MaxCycles)})...)
	}
	return append(out, step(st, "decide", nil, "", fmt.Sprintf("asking the planner (cycle %d)", st.Cycle), ""),
		d.decisionRequest(st), d.timer(st, events.TimerDecision, "decide", "", "planner", d.cfg.DecisionTimeout))
}

func (d *Dispatcher) decisionRequest(st *RunState) emission {
	return emission{typ: events.TypeDecisionRequested, id: st.derive("decide", st.Cycle),
		data: &events.DecisionRequested{RunID: st.RunID, Cycle: st.Cycle, Prompt: st.Prompt, Scenario: st.Scenario,
			Observations: st.Observations, Feedback: st.Feedback, Synthesize: st.Synthesize, Replay: st.Replay},
		ext: []events.Extension{{Name: events.ExtCycle, Value: st.Cycle}}}
}

// timer schedules a durable timer for a stage of the run. Schedules with
// the same name replace each other, so a run has at most one pending
// timer per name.
func (d *Dispatcher) timer(st *RunState, kind, name, callID, stage string, after time.Duration) emission {
	at := time.Now().Add(after)
	if kind == events.TimerRunDeadline {
		at = st.Deadline
	}
	// The id names what the timer is for (the call id differs per attempt
	// and per approval), so a timer of a later attempt is not mistaken for
	// a duplicate of an earlier one.
	e := d.bus.TimerEmission(st.derive("timer", name, st.Cycle, callID), name, at,
		&events.TimerFired{RunID: st.RunID, Kind: kind, Cycle: st.Cycle, CallID: callID, Stage: stage})
	return emission{typ: e.Type, id: e.ID, data: e.Data, ext: e.Ext, subject: e.Subject, header: e.Header}
}

func (d *Dispatcher) actionRequest(st *RunState, c CallState) emission {
	return emission{typ: events.TypeActionRequested, id: c.CallID, pool: c.Pool,
		data: &events.ActionRequested{RunID: st.RunID, CallID: c.CallID, Cycle: st.Cycle, PlanIndex: c.PlanIndex, Attempt: max(c.Attempt, 1),
			Action: c.Action, Args: nonNilArgs(c.Args), Origin: c.Origin, UserID: st.UserID, TimeoutMs: c.TimeoutMs,
			IdempotencyKey: c.IdempotencyKey, Approval: c.Approval, StepID: c.StepID, MaxAttempts: c.MaxAttempts},
		ext: []events.Extension{{Name: events.ExtCycle, Value: st.Cycle}, {Name: events.ExtPlanIndex, Value: c.PlanIndex},
			{Name: events.ExtAttempt, Value: max(c.Attempt, 1)}, {Name: events.ExtPool, Value: c.Pool}}}
}

func nonNilArgs(a map[string]any) map[string]any {
	if a == nil {
		return map[string]any{}
	}
	return a
}

func terminalEmission(st *RunState) emission {
	t := st.Terminal
	e := emission{typ: t.Type, id: st.derive("terminal")}
	switch t.Type {
	case events.TypeRunCompleted:
		e.data = &events.RunCompleted{RunID: st.RunID, Answer: t.Answer, Output: t.Output, Citations: t.Citations, Cycles: st.Cycle}
	case events.TypeRunCanceled:
		e.data = &events.RunCanceled{RunID: st.RunID, Reason: t.Reason, Cycles: st.Cycle}
	default:
		e.data = &events.RunFailed{RunID: st.RunID, Error: *t.Error, Cycles: st.Cycle}
	}
	return e
}

// terminate ends the run: it stores its terminal event and returns it.
func (d *Dispatcher) terminate(st *RunState, t *Terminal) []emission {
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
	return []emission{terminalEmission(st)}
}

func (d *Dispatcher) fail(st *RunState, err error) []emission {
	var abErr *actionbus.Error
	if !errors.As(err, &abErr) {
		abErr = &actionbus.Error{Code: actionbus.CodeInternal, Message: err.Error()}
	}
	return d.terminate(st, &Terminal{Type: events.TypeRunFailed, Error: abErr})
}

// reject gives a decision back to the planner with the reason, without
// running anything: the planner corrects itself on the next cycle.
func (d *Dispatcher) reject(st *RunState, stepName string, err *actionbus.Error) []emission {
	st.Feedback = err
	return append([]emission{step(st, stepName, nil, "", err.Error(), "failed")}, d.askPlanner(st)...)
}

func (d *Dispatcher) onDecision(ctx context.Context, st *RunState, dm *events.DecisionMade) ([]emission, error) {
	if st.IsTerminal() || st.Phase != PhaseDeciding || dm.Cycle != st.Cycle {
		return nil, nil // stale or duplicate decision
	}
	var diag []emission
	if len(dm.Diagnostics) > 0 {
		// Planning evidence, not executed work: one step names them all.
		codes := make([]string, len(dm.Diagnostics))
		for i, e := range dm.Diagnostics {
			codes[i] = string(e.Code)
		}
		diag = append(diag, stepWith(st, "planner-diagnostics", nil, "", strings.Join(codes, ", "), "",
			map[string]any{"diagnostics": dm.Diagnostics}))
	}
	if dm.Error != nil {
		return append(diag, d.fail(st, dm.Error)...), nil
	}
	out, err := d.applyDecision(ctx, st, dm)
	return append(diag, out...), err
}

func (d *Dispatcher) applyDecision(ctx context.Context, st *RunState, dm *events.DecisionMade) ([]emission, error) {
	st.Feedback = nil
	st.Synthesize = ""
	dec := dm.Decision
	switch dec.Type {
	case events.DecisionFinal:
		out := []emission{step(st, "final", nil, "", dec.Answer, "ok")}
		return append(out, d.terminate(st, &Terminal{Type: events.TypeRunCompleted, Answer: dec.Answer, Citations: dec.Citations})...), nil
	case events.DecisionAction:
		if dec.Name == "" {
			return d.reject(st, "decision-invalid", actionbus.Errorf(actionbus.CodeInvalidDecision, "an action decision needs a name")), nil
		}
		return d.startCalls(ctx, st, []events.Decision{dec}, events.OriginModel, nil)
	case events.DecisionPlan:
		if err := d.checkPlanShape(dec); err != nil {
			return d.reject(st, "plan-validation-failed", err), nil
		}
		if err := checkPerAction(dec); err != nil {
			return d.reject(st, "plan-validation-failed", err), nil
		}
		ps := &PlanState{PartialOK: dec.PartialOK, SynthesizeInstruction: dec.SynthesizeInstruction, PerAction: dec.SynthesizePerAction, Stitch: dec.Stitch}
		if dec.SynthesizePerAction {
			for _, a := range dec.Actions {
				ps.Sections = append(ps.Sections, *a.Section)
			}
		}
		return d.startCalls(ctx, st, dec.Actions, events.OriginModel, ps)
	case events.DecisionClarify:
		if strings.TrimSpace(dec.Question) == "" {
			return d.reject(st, "decision-invalid", actionbus.Errorf(actionbus.CodeInvalidDecision, "a clarify decision needs a question")), nil
		}
		st.Phase = PhaseAwaitingInput
		st.Status = StatusAwaitingInput
		st.Question = dec.Question
		return []emission{
			step(st, "awaiting-input", nil, clarifyAction, dec.Question, ""),
			d.timer(st, events.TimerInput, "input", "", "input", d.cfg.InputTimeout),
		}, nil
	}
	return d.reject(st, "decision-invalid", actionbus.Errorf(actionbus.CodeInvalidDecision, "unknown decision type %q (want action, plan, clarify or final)", dec.Type)), nil
}

// checkPlanShape applies the plan envelope rules that need no catalog.
func (d *Dispatcher) checkPlanShape(dec events.Decision) *actionbus.Error {
	switch {
	case len(dec.Actions) == 0:
		return actionbus.Errorf(actionbus.CodePlanRejected, "a plan needs at least one action")
	case len(dec.Actions) > d.cfg.MaxPlanActions:
		return actionbus.Errorf(actionbus.CodePlanRejected, "plan has %d actions; at most %d are allowed per plan (split it or run some first)",
			len(dec.Actions), d.cfg.MaxPlanActions).WithDetail("actions", len(dec.Actions)).WithDetail("maxPlanActions", d.cfg.MaxPlanActions)
	}
	for i, a := range dec.Actions {
		if a.Type != events.DecisionAction {
			return actionbus.Errorf(actionbus.CodePlanRejected, "plan entry %d has type %q; a plan may contain only action envelopes (no nested plans, clarify or final)", i, a.Type).
				WithDetail("planIndex", i)
		}
		if plannerStateMutators[a.Name] {
			return actionbus.Errorf(actionbus.CodePlanRejected, "%s changes planner state and must run as a standalone action before planning", a.Name).
				WithDetail("planIndex", i).WithDetail("action", a.Name)
		}
	}
	return nil
}

func (d *Dispatcher) onInput(st *RunState, in *events.InputProvided) []emission {
	if st.IsTerminal() || st.Phase != PhaseAwaitingInput {
		return nil
	}
	st.Status = StatusRunning
	st.Observations = append(st.Observations, events.Observation{Cycle: st.Cycle, Action: clarifyAction, OK: true,
		Output: map[string]any{"question": st.Question, "answer": in.Answer}, Summary: "answered: " + in.Answer})
	st.Question = ""
	out := []emission{step(st, "input-received", nil, clarifyAction, in.Answer, "ok")}
	return append(out, d.askPlanner(st)...)
}

func (d *Dispatcher) onTimer(ctx context.Context, st *RunState, t *events.TimerFired) ([]emission, error) {
	if st.IsTerminal() {
		return nil, nil
	}
	if t.Kind == events.TimerRetry {
		return d.onRetryTimer(ctx, st, t.CallID)
	}
	return d.onStageTimer(st, t), nil
}

func (d *Dispatcher) onStageTimer(st *RunState, t *events.TimerFired) []emission {
	stalled := func(stage string, details ...any) []emission {
		err := actionbus.Errorf(actionbus.CodeStageStalled, "stage %s did not answer by %s", stage, t.DueAt.Format(time.RFC3339)).
			WithDetail("stage", stage).WithDetail("cycle", t.Cycle)
		for i := 0; i+1 < len(details); i += 2 {
			err = err.WithDetail(details[i].(string), details[i+1])
		}
		return append([]emission{step(st, "stage-stalled", nil, "", err.Message, "failed")}, d.fail(st, err)...)
	}
	switch t.Kind {
	case events.TimerRunDeadline:
		if time.Now().Before(st.Deadline.Add(-time.Second)) {
			return nil // a stale schedule from before a deadline change
		}
		err := actionbus.Errorf(actionbus.CodeRunDeadline, "run passed its deadline %s", st.Deadline.Format(time.RFC3339)).
			WithDetail("phase", st.Phase).WithDetail("cycle", st.Cycle)
		return d.fail(st, err)
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
		if p, ok := st.Approvals[t.CallID]; ok {
			delete(st.Approvals, t.CallID)
			st.ApprovalsExpired = append(st.ApprovalsExpired, t.CallID)
			err := actionbus.Errorf(actionbus.CodeApprovalExpired, "approval %s was not given before %s", t.CallID, p.Context.ExpiresAt.Format(time.RFC3339)).
				WithDetail("approvalId", t.CallID).WithDetail("action", p.Context.Action)
			return append([]emission{step(st, "approval-expired", nil, p.Context.Action, err.Message, "failed")}, d.fail(st, err)...)
		}
	case events.TimerAction:
		if st.Phase != PhaseActing || st.Cycle != t.Cycle {
			return nil
		}
		if i := st.callIndex(t.CallID); i >= 0 && !st.Calls[i].Done {
			c := st.Calls[i]
			return stalled("action "+c.Action, "action", c.Action, "planIndex", c.PlanIndex, "callId", c.CallID)
		}
	}
	return nil
}

// startCalls validates every action up front (catalog, plan rules, mode,
// arguments), then records the calls and dispatches the first
// MaxPlanParallel of them. Nothing runs unless every check that applies
// passed: an unknown action or a refused mode fails the run; invalid
// arguments go back to the planner as action_args_invalid observations to
// correct itself. In a plan without partial_ok one invalid action holds
// back the whole plan; with partial_ok the valid actions run and the
// invalid ones are recorded as failed results.
func (d *Dispatcher) startCalls(ctx context.Context, st *RunState, decs []events.Decision, origin string, plan *PlanState) ([]emission, error) {
	isPlan := plan != nil
	var out []emission
	if isPlan {
		out = append(out, step(st, "plan-validating", nil, "", fmt.Sprintf("%d actions", len(decs)), ""))
	}
	calls := make([]CallState, 0, len(decs))
	invalid := 0
	for i, dec := range decs {
		var pi *int
		if isPlan {
			pi = &i
		}
		entry, err := d.cat.Get(ctx, dec.Name)
		if err != nil {
			if errors.Is(err, actionbus.ErrActionNotFound) {
				abErr := actionbus.Errorf(actionbus.CodeActionNotFound, "action %q is not in the catalog", dec.Name).WithDetail("action", dec.Name)
				if isPlan {
					abErr = abErr.WithDetail("planIndex", i)
				}
				return append(out, d.fail(st, abErr)...), nil
			}
			return nil, err
		}
		if isPlan && entry.Planner != nil && entry.Planner.StateMutator {
			return append(out, d.reject(st, "plan-validation-failed", actionbus.Errorf(actionbus.CodePlanRejected,
				"%s changes planner state and must run as a standalone action before planning", dec.Name).WithDetail("planIndex", i))...), nil
		}
		if err := policy.CheckMode(st.AllowedModes, entry.Name, entry.Mode); err != nil {
			if isPlan {
				err = err.WithDetail("planIndex", i)
			}
			return append(out, d.fail(st, err)...), nil
		}
		checker, err := d.checkers.get(entry.Definition, entry.Hash)
		if err != nil {
			return nil, err
		}
		args, report, issues := checker.Prepare(dec.Args, origin)
		out = append(out, d.recordArgsReport(st, pi, dec.Name, report)...)
		timeout := entry.TimeoutMs
		if timeout <= 0 {
			timeout = actions.DefaultTimeout.Milliseconds()
		}
		call := CallState{PlanIndex: i, CallID: st.derive("call", st.Cycle, i, 1),
			Action: dec.Name, Pool: entry.Pool, Args: args, Origin: origin, TimeoutMs: timeout, Mode: string(entry.Mode)}
		if origin == events.OriginHost {
			call.IdempotencyKey = dec.IdempotencyKey
		}
		if issues != nil {
			for k := range issues {
				issues[k].PlanIndex = pi
			}
			abErr := actions.ArgsError(dec.Name, issues)
			out = append(out, stepWith(st, "action-args-invalid", pi, dec.Name, abErr.Message, "failed",
				map[string]any{"issues": issues}))
			call.Dispatched, call.Done, call.Error = true, true, abErr
			invalid++
			calls = append(calls, call)
			continue
		}
		// Policy: every call is judged and the snapshot recorded. Nothing
		// in the call's input takes part: model input cannot grant
		// approval.
		snap := d.policy.Load().Evaluate(ctx, policy.Request{Action: entry.Name, Mode: entry.Mode, Tier: entry.Tier,
			Permission: entry.Permission, Origin: origin, UserID: st.UserID, Metadata: st.Metadata})
		st.PolicySnapshots = append(st.PolicySnapshots, snap)
		out = append(out, stepWith(st, "policy-evaluated", pi, dec.Name, snap.Action+": "+snap.Reason, "",
			map[string]any{"snapshot": snap}))
		switch {
		case snap.Action == policy.Deny:
			err := actionbus.Errorf(actionbus.CodePolicyRejected, "policy denies %s: %s", dec.Name, snap.Reason).
				WithDetail("action", dec.Name).WithDetail("snapshot", snap)
			if isPlan {
				return append(out, d.reject(st, "plan-validation-failed", err.WithDetail("planIndex", i))...), nil
			}
			return append(out, d.fail(st, err)...), nil
		case snap.Action == policy.Ask && isPlan:
			// The seed's rule: a plan cannot pause for approval; any
			// non-allow action rejects the whole plan.
			err := actionbus.Errorf(actionbus.CodeApprovalRequired, "%s needs approval (%s); run it as a single action, not inside a plan", dec.Name, snap.Reason).
				WithDetail("action", dec.Name).WithDetail("planIndex", i)
			return append(out, d.reject(st, "plan-validation-failed", err)...), nil
		case snap.Action == policy.Ask:
			call.NeedsApproval = true
		}
		calls = append(calls, call)
	}
	if invalid > 0 && (!isPlan || !plan.PartialOK) {
		if isPlan {
			out = append(out, step(st, "plan-validation-failed", nil, "", fmt.Sprintf("%d of %d actions have invalid arguments; nothing ran", invalid, len(decs)), "failed"))
		}
		var first *actionbus.Error
		var failed []CallState
		for _, c := range calls {
			if c.Error == nil {
				continue
			}
			if first == nil {
				first = c.Error
			}
			failed = append(failed, c)
			st.Observations = append(st.Observations, d.observe(st, c, isPlan))
		}
		if st.Kind == "exec" {
			return append(out, d.fail(st, first)...), nil
		}
		facts, stopped := d.guard(st, failed, nil)
		out = append(out, facts...)
		if stopped {
			return out, nil
		}
		st.Feedback = first
		return append(out, d.askPlanner(st)...), nil
	}
	st.Phase = PhaseActing
	st.Calls = calls
	st.Plan = plan
	if !isPlan && len(calls) == 1 && calls[0].NeedsApproval && calls[0].Error == nil {
		more, err := d.requestApproval(st, 0, st.PolicySnapshots[len(st.PolicySnapshots)-1])
		if err != nil {
			return nil, err
		}
		return append(out, more...), nil
	}
	if isPlan {
		out = append(out, step(st, "plan-executing", nil, "", fmt.Sprintf("%d actions, at most %d at once", len(calls), d.cfg.MaxPlanParallel), ""))
	}
	out = append(out, step(st, "act", nil, "", fmt.Sprintf("%d call(s)", len(calls)), ""))
	out = append(out, d.dispatchMore(st)...)
	if st.allDone() {
		out = append(out, d.evaluate(st)...)
	}
	return out, nil
}

// recordArgsReport records alias rewrites, healed and stripped keys as
// steps and run diagnostics.
func (d *Dispatcher) recordArgsReport(st *RunState, pi *int, action string, rep actions.ArgsReport) []emission {
	var out []emission
	note := func(name string, details map[string]any, msg string) {
		st.Diagnostics = append(st.Diagnostics, Diagnostic{Name: name, Cycle: st.Cycle, PlanIndex: pi, Action: action, Details: details})
		out = append(out, stepWith(st, name, pi, action, msg, "", details))
	}
	if len(rep.Rewrites) > 0 {
		note("action-args-alias-rewrite", map[string]any{"rewrites": rep.Rewrites}, fmt.Sprintf("%d alias(es) rewritten", len(rep.Rewrites)))
	}
	if len(rep.Healed) > 0 {
		note("action-args-auto-heal", map[string]any{"keys": rep.Healed}, "flattened arguments lifted: "+strings.Join(rep.Healed, ", "))
	}
	if stripped := append(append([]string{}, rep.Stripped...), rep.HostOnlyStripped...); len(stripped) > 0 {
		note("action.input.unexpected_keys_stripped", map[string]any{"keys": rep.Stripped, "hostOnlyKeys": rep.HostOnlyStripped},
			"stripped "+strings.Join(stripped, ", "))
	}
	return out
}

// dispatchMore dispatches calls in declaration order while fewer than
// MaxPlanParallel are in flight, each with a durable action deadline.
func (d *Dispatcher) dispatchMore(st *RunState) []emission {
	var out []emission
	for i := range st.Calls {
		if st.inFlight() >= d.cfg.MaxPlanParallel {
			break
		}
		c := &st.Calls[i]
		if c.Dispatched || c.NeedsApproval {
			continue
		}
		c.Dispatched = true
		pi := c.PlanIndex
		out = append(out, step(st, "action-dispatched", &pi, c.Action, "to pool "+c.Pool, ""), d.actionRequest(st, *c),
			d.timer(st, events.TimerAction, fmt.Sprintf("call%d", c.PlanIndex), c.CallID, "action "+c.Action,
				time.Duration(c.TimeoutMs)*time.Millisecond+d.cfg.ActionGrace))
	}
	return out
}

func (d *Dispatcher) onResult(ctx context.Context, st *RunState, callID, executor string, ok bool, output any, summary string, complete bool, abErr *actionbus.Error) ([]emission, error) {
	if st.IsTerminal() {
		return nil, nil
	}
	i := st.callIndex(callID)
	if i < 0 || st.Calls[i].Done {
		return nil, nil // a duplicate (the first result wins) or a result of an earlier cycle
	}
	c := &st.Calls[i]
	c.Done, c.OK, c.Output, c.Summary, c.Complete, c.Error, c.Executor = true, ok, output, summary, complete, abErr, executor
	if ok && c.Mode == "dryRun" {
		if h, err := policy.InputHash(c.Args); err == nil {
			st.DryRunHash = h
		}
	}
	// Run state keeps full outputs only where they become the run's
	// output; everything else is kept as the bounded digest the planner
	// sees, so state stays far below the server's message size limit.
	if _, skipped := directFinal(*c); st.Kind == "agent" && !complete && !isDirectFinal(*c) && !skipped {
		c.Output = digest(output, d.cfg.ObservationBytes)
	}
	pi := c.PlanIndex
	status, msg := "ok", summary
	if !ok {
		status, msg = "failed", string(abErr.Code)+": "+abErr.Message
	}
	out := []emission{step(st, "action-"+map[bool]string{true: "completed", false: "failed"}[ok], &pi, c.Action, msg+" (executor "+executor+")", status)}
	if st.Workflow != nil {
		more, err := d.onStepResult(ctx, st, i)
		return append(out, more...), err
	}
	out = append(out, d.dispatchMore(st)...)
	if !st.allDone() {
		return out, nil
	}
	return append(out, d.evaluate(st)...), nil
}

// observe turns a call into the observation the planner sees: status,
// summary, and the output or, when it is larger than ObservationBytes, a
// bounded digest (execution recall: never a full large payload).
func (d *Dispatcher) observe(st *RunState, c CallState, isPlan bool) events.Observation {
	obs := events.Observation{Cycle: st.Cycle, Action: c.Action, OK: c.OK, Output: digest(c.Output, d.cfg.ObservationBytes), Summary: c.Summary, Error: c.Error}
	if isPlan {
		pi := c.PlanIndex
		obs.PlanIndex = &pi
	}
	return obs
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
func (d *Dispatcher) evaluate(st *RunState) []emission {
	isPlan := st.Plan != nil
	out := []emission{step(st, "observe", nil, "", fmt.Sprintf("%d result(s)", len(st.Calls)), "")}
	if isPlan {
		out = append(out, step(st, "plan-executed", nil, "", fmt.Sprintf("%d actions", len(st.Calls)), ""))
	}
	if st.Kind == "exec" {
		c := st.Calls[0]
		st.Observations = append(st.Observations, d.observe(st, c, false))
		if !c.OK {
			return append(out, d.terminate(st, &Terminal{Type: events.TypeRunFailed, Error: c.Error})...)
		}
		return append(out, d.terminate(st, &Terminal{Type: events.TypeRunCompleted, Output: c.Output, Answer: c.Summary})...)
	}
	var failed, succeeded []CallState
	for _, c := range st.Calls {
		if c.OK {
			succeeded = append(succeeded, c)
		} else {
			failed = append(failed, c)
		}
	}
	if isPlan && !st.Plan.PartialOK && len(failed) > 0 {
		// No output is applied; the observation names the first failure in
		// declaration order.
		first := failed[0]
		obs := d.observe(st, first, true)
		obs.Summary = fmt.Sprintf("plan failed: %d of %d actions failed; first failure at planIndex %d; no output applied", len(failed), len(st.Calls), first.PlanIndex)
		st.Observations = append(st.Observations, obs)
		out = append(out, step(st, "plan-failed", nil, "", obs.Summary, "failed"))
	} else {
		for _, c := range st.Calls {
			st.Observations = append(st.Observations, d.observe(st, c, isPlan))
		}
	}
	facts, stopped := d.guard(st, failed, succeeded)
	out = append(out, facts...)
	if stopped {
		return out
	}
	out = append(out, step(st, "evaluate", nil, "", fmt.Sprintf("%d ok, %d failed", len(succeeded), len(failed)), ""))
	if isPlan && st.Plan.PerAction && (st.Plan.PartialOK || len(failed) == 0) {
		return append(out, d.startSynthesis(st)...)
	}
	if !isPlan || st.Plan.PartialOK || len(failed) == 0 {
		// A direct final result ends the run; declaration order wins.
		for _, c := range st.Calls {
			if !c.OK {
				continue
			}
			md, skipped := directFinal(c)
			pi := c.PlanIndex
			if skipped {
				out = append(out, stepWith(st, "direct-final-skipped", &pi, c.Action, "resultKind final without markdown", "", nil))
				continue
			}
			if md != "" {
				out = append(out, stepWith(st, "direct-final-emitted", &pi, c.Action, "direct-emit-final", "ok",
					map[string]any{"reason": "direct-emit-final", "finalAnswerSource": "direct_final"}))
				return append(out, d.terminate(st, &Terminal{Type: events.TypeRunCompleted, Answer: md, Output: c.Output})...)
			}
		}
		// A handler result with Complete ends the run; declaration order wins.
		for _, c := range st.Calls {
			if c.OK && c.Complete {
				return append(out, d.terminate(st, &Terminal{Type: events.TypeRunCompleted, Output: c.Output, Answer: c.Summary})...)
			}
		}
	}
	if isPlan && len(failed) == 0 {
		switch ins := st.Plan.SynthesizeInstruction; ins {
		case "", "direct":
		default:
			st.Synthesize = ins
			out = append(out, step(st, "plan-synthesize-requested", nil, "", ins, ""))
		}
	}
	return append(out, d.askPlanner(st)...)
}

// guard records repeated failures (as action-repeated-failure steps) and
// stops the loop when the same action has failed MaxFailedRounds
// consecutive rounds, failing the run with the failure evidence. A round in
// which an action succeeds, or is not called, resets its count.
func (d *Dispatcher) guard(st *RunState, failed, succeeded []CallState) (out []emission, stopped bool) {
	if st.FailStreaks == nil {
		st.FailStreaks = map[string]int{}
		st.FailEvidence = map[string][]actionbus.Error{}
	}
	round := map[string]bool{}
	for _, c := range succeeded {
		round[c.Action] = round[c.Action] || false // called; failed only if a call failed
	}
	for _, c := range failed {
		round[c.Action] = true
	}
	for name := range st.FailStreaks {
		if _, called := round[name]; !called {
			delete(st.FailStreaks, name)
			delete(st.FailEvidence, name)
		}
	}
	var names []string
	for name := range round {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !round[name] {
			delete(st.FailStreaks, name)
			delete(st.FailEvidence, name)
			continue
		}
		st.FailStreaks[name]++
		for _, c := range failed {
			if c.Action == name && c.Error != nil {
				st.FailEvidence[name] = append(st.FailEvidence[name], *c.Error)
				break
			}
		}
		n := st.FailStreaks[name]
		if n < 2 && n < d.cfg.MaxFailedRounds {
			continue // a single failed round is feedback, not yet a streak
		}
		out = append(out, stepWith(st, "action-repeated-failure", nil, name, fmt.Sprintf("%s failed %d consecutive rounds", name, n), "failed",
			map[string]any{"rounds": n, "evidence": st.FailEvidence[name]}))
		if n >= d.cfg.MaxFailedRounds {
			err := actionbus.Errorf(actionbus.CodeRepeatedFailure, "%s failed %d consecutive rounds; stopping the loop", name, n).
				WithDetail("action", name).WithDetail("rounds", n).WithDetail("evidence", st.FailEvidence[name])
			return append(out, d.fail(st, err)...), true
		}
	}
	return out, false
}
