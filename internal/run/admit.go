package run

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/skills"
)

// callSpec is an action call asked for: a decision's action, one action
// of a plan, a host's exec call or a workflow step.
type callSpec struct {
	Action string
	Args   map[string]any
	Origin string
	// PlanIndex is the call's index in its plan or workflow; InPlan says
	// whether errors and steps name it (plans and workflows do).
	PlanIndex int
	InPlan    bool
	// InBatch marks a plan entry: planner state mutators are refused.
	InBatch bool
	// Via is the generic action a call came through (execute_skill_tool),
	// whose explicit policy applies when the action has none.
	Via string
	// StepID, StepModes and TimeoutMs are a workflow step's (its id, its
	// own allowed modes, its timeout override).
	StepID    string
	StepModes []string
	TimeoutMs int64
	// IdempotencyKey is a host's key; Attempt and MaxAttempts a workflow
	// step's retry state.
	IdempotencyKey string
	Attempt        int
	MaxAttempts    int
}

// verdict is the outcome of admitting one call.
type verdict int

const (
	// admitted: the call may run.
	admitted verdict = iota
	// needsApproval: the policy asks for an approval first.
	needsApproval
	// unknownAction: the catalog does not resolve the action (not in it,
	// published by several pools, or unreadable).
	unknownAction
	// refused: the call can never run in this run (a mode the run or step
	// does not allow, a planner state mutator inside a plan).
	refused
	// argsInvalid: the arguments do not satisfy the action's schema.
	argsInvalid
	// denied: the policy denies the call.
	denied
)

// admission is what admitting a call decided.
type admission struct {
	Verdict verdict
	// Call is the call to record (for admitted, needsApproval and
	// argsInvalid verdicts).
	Call CallState
	// Err says why a call is not admitted.
	Err *actionbus.Error
	// Snapshot is the policy's judgement (admitted, needsApproval, denied).
	Snapshot policy.Snapshot
}

// admit is the one admission path of an action call, for single actions,
// plan actions and workflow steps alike: catalog, planner-state rule, the
// run's and the step's allowed modes, arguments (prepared: aliases,
// healing, stripping, schema), policy (judged and its snapshot recorded),
// and the call's timeout. Nothing in the call's input takes part in the
// policy's judgement: model input cannot grant approval. The effects are
// the progress steps of what was decided; an error means the catalog could
// not be read.
func (m *Machine) admit(ctx context.Context, st *State, s callSpec) ([]Effect, admission, error) {
	var pi *int
	if s.InPlan {
		pi = &s.PlanIndex
	}
	where := func(e *actionbus.Error) *actionbus.Error {
		if s.StepID != "" {
			return e.WithDetail("step", s.StepID)
		}
		if s.InPlan {
			return e.WithDetail("planIndex", s.PlanIndex)
		}
		return e
	}
	entry, err := m.env.Action(ctx, s.Action)
	if err != nil {
		if ctx.Err() != nil {
			return nil, admission{}, err // the service stops: the event is handled again
		}
		return nil, admission{Verdict: unknownAction, Err: where(lookupRefusal(s.Action, err))}, nil
	}
	if !modelMayCall(s.Origin, s.Action, s.Via, st.activeSkill(), entry.PlannerVisible()) {
		return nil, admission{Verdict: unknownAction, Err: where(actionbus.Errorf(actionbus.CodeActionNotFound,
			"action %q is not one a planner may call", s.Action).WithDetail("action", s.Action).WithDetail("reason", "not_planner_visible"))}, nil
	}
	if !entry.ServesTenant(st.TenantOrDefault()) {
		return nil, admission{Verdict: refused, Err: where(actionbus.Errorf(actionbus.CodeTenantNotServed,
			"action %q is hosted by a pool dedicated to other tenants", s.Action).WithDetail("action", s.Action))}, nil
	}
	if s.InBatch && (skills.Mutator(s.Action) || (entry.Planner != nil && entry.Planner.StateMutator)) {
		return nil, admission{Verdict: refused, Err: where(actionbus.Errorf(actionbus.CodePlanRejected,
			"%s changes planner state and must run as a standalone action before planning", s.Action))}, nil
	}
	if perr := policy.CheckMode(st.AllowedModes, entry.Name, entry.Mode); perr != nil {
		return nil, admission{Verdict: refused, Err: where(perr)}, nil
	}
	if len(s.StepModes) > 0 {
		if perr := policy.CheckMode(s.StepModes, entry.Name, entry.Mode); perr != nil {
			return nil, admission{Verdict: refused, Err: where(perr)}, nil
		}
	}
	checker, err := m.env.Checker(entry)
	if err != nil {
		return nil, admission{}, err
	}
	args, report, issues := checker.Prepare(s.Args, s.Origin)
	out := m.recordArgsReport(st, pi, s.Action, report)
	attempt := max(s.Attempt, 1)
	call := CallState{PlanIndex: s.PlanIndex, CallID: st.derive("call", st.Cycle, s.PlanIndex, attempt), Action: s.Action,
		Pool: entry.Pool, Args: args, Origin: s.Origin, Mode: string(entry.Mode),
		TimeoutMs: actions.Timeout(entry.TimeoutMs, s.TimeoutMs, actions.DefaultTimeout).Milliseconds(),
		Attempt:   s.Attempt, StepID: s.StepID, MaxAttempts: s.MaxAttempts}
	if s.Origin == events.OriginHost {
		call.IdempotencyKey = s.IdempotencyKey // a planner never chooses one
	}
	if issues != nil {
		for k := range issues {
			issues[k].PlanIndex = pi
		}
		abErr := actions.ArgsError(s.Action, issues)
		out = append(out, stepWith(st, StepActionArgsInvalid, pi, s.Action, abErr.Message, "failed", actions.ArgsDetails(s.Action, issues)))
		call.Dispatched, call.Done, call.Error = true, true, abErr
		return out, admission{Verdict: argsInvalid, Call: call, Err: abErr}, nil
	}
	snap := m.env.Evaluate(ctx, policy.Request{Action: entry.Name, Mode: entry.Mode, Tier: entry.Tier,
		Permission: entry.Permission, Origin: s.Origin, UserID: st.UserID, Principal: st.Principal, Metadata: st.Metadata, Via: s.Via})
	call.Policy = st.recordPolicy(snap)
	evaluated := stepWith(st, StepPolicyEvaluated, pi, s.Action, snap.Action+": "+snap.Reason, "", map[string]any{"snapshot": snap})
	// An allowed call's evaluation travels on its work item, which the
	// auditor records: its step is progress. A denial or a question for an
	// approver is recorded on its own.
	evaluated.Progress = snap.Action == policy.Allow
	out = append(out, evaluated)
	switch snap.Action {
	case policy.Deny:
		return out, admission{Verdict: denied, Snapshot: snap, Err: where(actionbus.Errorf(actionbus.CodePolicyRejected,
			"policy denies %s: %s", s.Action, snap.Reason).WithDetail("action", s.Action).WithDetail("snapshot", snap))}, nil
	case policy.Ask:
		return out, admission{Verdict: needsApproval, Call: call, Snapshot: snap}, nil
	}
	return out, admission{Verdict: admitted, Call: call, Snapshot: snap}, nil
}

// modelMayCall reports whether a call of the given origin may run an
// action: host input may run any action; model input only a
// planner-visible one, or a hidden skill tool reached through
// execute_skill_tool (via) as a tool of the active skill. The dispatcher
// decides this, not the planner: a model that names a hidden action
// directly (a skill tool around execute_skill_tool's rules and policy) is
// refused.
func modelMayCall(origin, action, via, activeSkill string, plannerVisible bool) bool {
	switch {
	case origin != events.OriginModel, plannerVisible:
		return true
	case via == skills.ExecuteTool && activeSkill != "":
		return strings.HasPrefix(action, skills.ActionName(activeSkill, ""))
	}
	return false
}

// lookupRefusal is the refusal of a call whose action the catalog did not
// resolve: action_not_found when no pool publishes it, catalog_conflict
// (naming the pools) when several do, invalid_record when its only entry
// fails its schema or hash, catalog_unavailable when the catalog
// could not be read. Every lookup error is a typed refusal, so a call is
// always answered, never left to be redelivered until the run's deadline.
func lookupRefusal(action string, err error) *actionbus.Error {
	var abErr *actionbus.Error
	switch {
	case errors.Is(err, actionbus.ErrActionNotFound):
		return actionbus.Errorf(actionbus.CodeActionNotFound, "action %q is not in the catalog", action).WithDetail("action", action)
	case errors.Is(err, actionbus.ErrCatalogConflict) && errors.As(err, &abErr),
		errors.Is(err, actionbus.ErrInvalidRecord) && errors.As(err, &abErr):
		return abErr.WithDetail("action", action)
	}
	return actionbus.Errorf(actionbus.CodeCatalogUnavailable, "the catalog could not resolve action %q: %w", action, err).
		WithDetail("action", action)
}

// recordArgsReport records alias rewrites, healed and stripped keys as
// steps and run diagnostics.
func (m *Machine) recordArgsReport(st *State, pi *int, action string, rep actions.ArgsReport) []Effect {
	var out []Effect
	note := func(name StepName, details map[string]any, msg string) {
		st.Diagnostics = append(st.Diagnostics, Diagnostic{Name: string(name), Cycle: st.Cycle, PlanIndex: pi, Action: action, Details: details})
		out = append(out, stepWith(st, name, pi, action, msg, "", details))
	}
	if len(rep.Rewrites) > 0 {
		note(StepActionArgsAliasRewrite, map[string]any{"rewrites": rep.Rewrites}, fmt.Sprintf("%d alias(es) rewritten", len(rep.Rewrites)))
	}
	if len(rep.Healed) > 0 {
		note(StepActionArgsAutoHeal, map[string]any{"keys": rep.Healed}, "flattened arguments lifted: "+strings.Join(rep.Healed, ", "))
	}
	if stripped := append(append([]string{}, rep.Stripped...), rep.HostOnlyStripped...); len(stripped) > 0 {
		note(StepActionInputUnexpectedKeysStripped, map[string]any{"keys": rep.Stripped, "hostOnlyKeys": rep.HostOnlyStripped},
			"stripped "+strings.Join(stripped, ", "))
	}
	return out
}

// startCalls admits every action of a decision up front, then records the
// calls and dispatches the first MaxPlanParallel of them. Nothing runs
// unless every check that applies passed: an unknown action or a refused
// mode fails the run; invalid arguments go back to the planner as
// action_args_invalid observations to correct itself. In a plan without
// partial_ok one invalid action holds back the whole plan; with partial_ok
// the valid actions run and the invalid ones are recorded as failed
// results. A plan cannot pause for approval: an action that needs one
// rejects the plan.
func (m *Machine) startCalls(ctx context.Context, st *State, decs []events.Decision, origin string, plan *PlanState) ([]Effect, error) {
	isPlan := plan != nil
	var out []Effect
	if isPlan {
		out = append(out, step(st, StepPlanValidating, nil, "", fmt.Sprintf("%d actions", len(decs)), ""))
	}
	calls := make([]CallState, 0, len(decs))
	invalid := 0
	for i, dec := range decs {
		var tool *skills.Tool
		via := ""
		if dec.Name == skills.ExecuteTool {
			via = dec.Name
			// A skill tool call: resolved against the active skill before
			// anything of the decision runs.
			var healed []string
			var refused *actionbus.Error
			var err error
			if dec, tool, healed, refused, err = m.resolveSkillTool(ctx, st, dec); err != nil {
				return nil, err
			}
			if refused != nil {
				if isPlan {
					refused = refused.WithDetail("planIndex", i)
				}
				return append(out, m.skillToolRefused(st, isPlan, refused)...), nil
			}
			var pi *int
			if isPlan {
				pi = &i
			}
			out = append(out, m.recordArgsReport(st, pi, skills.ExecuteTool, actions.ArgsReport{Healed: healed})...)
		}
		steps, a, err := m.admit(ctx, st, callSpec{Action: dec.Name, Args: dec.Args, Origin: origin, PlanIndex: i,
			InPlan: isPlan, InBatch: isPlan, IdempotencyKey: dec.IdempotencyKey, Via: via})
		if err != nil {
			return nil, err
		}
		if tool != nil {
			a.Call.Skill, a.Call.Tool = st.Agent.Skills.Active.Name, tool.Name
		}
		out = append(out, steps...)
		switch a.Verdict {
		case unknownAction:
			return append(out, m.fail(st, a.Err)...), nil
		case refused:
			if a.Err.Code == actionbus.CodePlanRejected {
				return append(out, m.reject(st, StepPlanValidationFailed, a.Err)...), nil
			}
			return append(out, m.fail(st, a.Err)...), nil
		case denied:
			if isPlan {
				return append(out, m.reject(st, StepPlanValidationFailed, a.Err)...), nil
			}
			return append(out, m.fail(st, a.Err)...), nil
		case needsApproval:
			if isPlan {
				err := actionbus.Errorf(actionbus.CodeApprovalRequired, "%s needs approval (%s); run it as a single action, not inside a plan", dec.Name, a.Snapshot.Reason).
					WithDetail("action", dec.Name).WithDetail("planIndex", i)
				return append(out, m.reject(st, StepPlanValidationFailed, err)...), nil
			}
			a.Call.NeedsApproval = true
		case argsInvalid:
			invalid++
		}
		calls = append(calls, a.Call)
	}
	if invalid > 0 && (!isPlan || !plan.PartialOK) {
		return append(out, m.argsRejected(st, calls, isPlan)...), nil
	}
	st.Phase = PhaseActing
	st.Calls = calls
	if st.Agent != nil {
		st.Agent.Plan = plan
	}
	if !isPlan && calls[0].NeedsApproval {
		return append(out, m.requestApproval(st, 0, st.PolicySnapshots[calls[0].Policy-1])...), nil
	}
	if isPlan {
		out = append(out, step(st, StepPlanExecuting, nil, "", fmt.Sprintf("%d actions, at most %d at once", len(calls), m.lim.MaxPlanParallel), ""))
	}
	out = append(out, step(st, StepAct, nil, "", fmt.Sprintf("%d call(s)", len(calls)), ""))
	out = append(out, m.dispatchMore(st)...)
	if st.allDone() {
		out = append(out, m.evaluate(st)...)
	}
	return out, nil
}

// skillToolRefused answers an execute_skill_tool the active skill cannot
// run: nothing of the decision runs; a plan is rejected whole, a single
// call becomes a failed observation; either way the planner is asked
// again with the reason (an exec or workflow run, without a planner,
// fails).
func (m *Machine) skillToolRefused(st *State, isPlan bool, err *actionbus.Error) []Effect {
	if st.Agent == nil {
		return m.fail(st, err)
	}
	if isPlan {
		return m.reject(st, StepPlanValidationFailed, err)
	}
	st.Agent.Observations = append(st.Agent.Observations, events.Observation{Cycle: st.Cycle, Action: skills.ExecuteTool, Error: err})
	facts, stopped := m.guard(st, []CallState{{Action: skills.ExecuteTool, Error: err}}, nil)
	out := append([]Effect{step(st, StepActionFailed, nil, skills.ExecuteTool, string(err.Code)+": "+err.Message, "failed")}, facts...)
	if stopped {
		return out
	}
	st.Agent.Feedback = err
	return append(out, m.askPlanner(st)...)
}

// argsRejected answers a decision held back by invalid arguments: the
// failures become observations and the planner is asked again (an exec
// run fails), unless the same action keeps failing.
func (m *Machine) argsRejected(st *State, calls []CallState, isPlan bool) []Effect {
	var out []Effect
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
		if st.Agent != nil {
			st.Agent.Observations = append(st.Agent.Observations, m.observe(st, c, isPlan))
		}
	}
	if isPlan {
		out = append(out, step(st, StepPlanValidationFailed, nil, "", fmt.Sprintf("%d of %d actions have invalid arguments; nothing ran", len(failed), len(calls)), "failed"))
	}
	if st.Agent == nil { // an exec run has no planner to correct it
		return append(out, m.fail(st, first)...)
	}
	facts, stopped := m.guard(st, failed, nil)
	out = append(out, facts...)
	if stopped {
		return out
	}
	st.Agent.Feedback = first
	return append(out, m.askPlanner(st)...)
}
