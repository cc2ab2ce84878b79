package dispatch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/events"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/workflow"
)

// Workflow runs: a run.requested carrying a JSON workflow. Validation runs
// before any step starts. Steps whose references are satisfied run in
// parallel (at most MaxPlanParallel at once); outputs are reported in
// declaration order. Every step is host input.

// startWorkflow validates a workflow and starts its first steps.
func (d *Dispatcher) startWorkflow(ctx context.Context, st *RunState, doc map[string]any) ([]emission, error) {
	catalog := workflow.Catalog{}
	for _, e := range d.cat.List() {
		catalog[e.Name] = string(e.Mode)
	}
	// Actions published a moment ago may not be in the view yet.
	if steps, ok := doc["steps"].([]any); ok {
		for _, s := range steps {
			if m, ok := s.(map[string]any); ok {
				if name, ok := m["action"].(string); ok {
					if _, known := catalog[name]; !known {
						if e, err := d.cat.Get(ctx, name); err == nil {
							catalog[name] = string(e.Mode)
						}
					}
				}
			}
		}
	}
	if issues := workflow.Validate(doc, catalog); len(issues) > 0 {
		return d.fail(st, workflow.Error(issues)), nil
	}
	def, err := workflow.Parse(doc)
	if err != nil {
		return d.fail(st, actionbus.Errorf(actionbus.CodeWorkflowValidation, "%w", err)), nil
	}
	st.Kind = "workflow"
	st.Cycle = 1
	st.Phase = PhaseActing
	st.Workflow = &WorkflowRun{Def: *def, Steps: make([]StepRun, len(def.Steps))}
	st.Calls = make([]CallState, len(def.Steps))
	for i, s := range def.Steps {
		st.Workflow.Steps[i] = StepRun{Status: StepPending, Attempt: 1}
		st.Calls[i] = CallState{PlanIndex: i, Action: s.Action, Origin: events.OriginHost, Attempt: 1, Dispatched: true, Done: true}
	}
	out := []emission{step(st, "workflow-validated", nil, "", fmt.Sprintf("%s: %d steps", def.WorkflowName, len(def.Steps)), "ok")}
	more, err := d.advanceWorkflow(ctx, st)
	return append(out, more...), err
}

// advanceWorkflow readies every pending step whose references are
// satisfied, dispatches what it can, and completes the run when every step
// is done.
func (d *Dispatcher) advanceWorkflow(ctx context.Context, st *RunState) ([]emission, error) {
	wf := st.Workflow
	var out []emission
	outputs := map[string]any{}
	status := map[string]string{}
	for i, s := range wf.Def.Steps {
		status[s.ID] = wf.Steps[i].Status
		if wf.Steps[i].Status == StepDone {
			outputs[s.ID] = wf.Steps[i].Output
		}
	}
	for i, s := range wf.Def.Steps {
		if wf.Steps[i].Status != StepPending {
			continue
		}
		ready := true
		for _, dep := range s.Dependencies() {
			if status[dep] != StepDone {
				ready = false
			}
		}
		if !ready {
			continue
		}
		more, stop, err := d.readyStep(ctx, st, i, outputs)
		out = append(out, more...)
		if err != nil || stop {
			return out, err
		}
	}
	out = append(out, d.dispatchMore(st)...)
	if slices.ContainsFunc(wf.Steps, func(s StepRun) bool { return s.Status != StepDone }) {
		return out, nil
	}
	result := map[string]any{"workflowName": wf.Def.WorkflowName}
	byStep := map[string]any{}
	steps := make([]any, 0, len(wf.Steps))
	for i, s := range wf.Def.Steps {
		byStep[s.ID] = wf.Steps[i].Output
		// The terminal result holds the outputs from here on: run state
		// keeps each output once.
		wf.Steps[i].Output = nil
		steps = append(steps, map[string]any{"id": s.ID, "action": s.Action, "attempts": wf.Steps[i].Attempt,
			"ok": wf.Steps[i].Error == nil})
	}
	result["outputByStep"], result["steps"] = byStep, steps
	out = append(out, step(st, "workflow-completed", nil, "", fmt.Sprintf("%d steps", len(wf.Steps)), "ok"))
	return append(out, d.terminate(st, &Terminal{Type: events.TypeRunCompleted, Output: result,
		Answer: fmt.Sprintf("workflow %s completed", wf.Def.WorkflowName)})...), nil
}

// readyStep prepares step i's call: resolves its references, checks mode,
// arguments and policy, and marks it ready (or awaiting approval).
func (d *Dispatcher) readyStep(ctx context.Context, st *RunState, i int, outputs map[string]any) ([]emission, bool, error) {
	s := st.Workflow.Def.Steps[i]
	pi := i
	failStep := func(err *actionbus.Error) ([]emission, bool, error) {
		err = err.WithDetail("step", s.ID)
		return d.stepFailed(st, i, err), st.IsTerminal(), nil
	}
	input, rerr := s.Resolve(outputs)
	if rerr != nil {
		var abErr *actionbus.Error
		errors.As(rerr, &abErr)
		return failStep(abErr)
	}
	entry, err := d.cat.Get(ctx, s.Action)
	if err != nil {
		if errors.Is(err, actionbus.ErrActionNotFound) {
			return failStep(actionbus.Errorf(actionbus.CodeActionNotFound, "action %q is not in the catalog", s.Action))
		}
		return nil, false, err
	}
	if perr := policy.CheckMode(st.AllowedModes, entry.Name, entry.Mode); perr != nil {
		return d.fail(st, perr.WithDetail("step", s.ID)), true, nil
	}
	if len(s.AllowedModes) > 0 {
		if perr := policy.CheckMode(s.AllowedModes, entry.Name, entry.Mode); perr != nil {
			return d.fail(st, perr.WithDetail("step", s.ID)), true, nil
		}
	}
	checker, err := d.checkers.get(entry.Definition, entry.Hash)
	if err != nil {
		return nil, false, err
	}
	args, report, issues := checker.Prepare(input, events.OriginHost)
	out := d.recordArgsReport(st, &pi, s.Action, report)
	if issues != nil {
		for k := range issues {
			issues[k].PlanIndex = &pi
		}
		more, stop, err := failStep(actions.ArgsError(s.Action, issues))
		return append(out, more...), stop, err
	}
	snap := d.policy.Load().Evaluate(ctx, policy.Request{Action: entry.Name, Mode: entry.Mode, Tier: entry.Tier,
		Permission: entry.Permission, Origin: events.OriginHost, UserID: st.UserID, Metadata: st.Metadata})
	st.PolicySnapshots = append(st.PolicySnapshots, snap)
	out = append(out, stepWith(st, "policy-evaluated", &pi, s.Action, snap.Action+": "+snap.Reason, "", map[string]any{"snapshot": snap}))
	if snap.Action == policy.Deny {
		err := actionbus.Errorf(actionbus.CodePolicyRejected, "policy denies %s: %s", s.Action, snap.Reason).
			WithDetail("step", s.ID).WithDetail("snapshot", snap)
		return append(out, d.fail(st, err)...), true, nil
	}
	timeout := entry.TimeoutMs
	if s.TimeoutMs > 0 {
		timeout = s.TimeoutMs
	}
	if timeout <= 0 {
		timeout = actions.DefaultTimeout.Milliseconds()
	}
	attempt := st.Workflow.Steps[i].Attempt
	st.Calls[i] = CallState{PlanIndex: i, CallID: st.derive("call", 1, i, attempt), Action: s.Action,
		Pool: entry.Pool, Args: args, Origin: events.OriginHost, TimeoutMs: timeout, Mode: string(entry.Mode),
		IdempotencyKey: s.IdempotencyKey, Attempt: attempt, StepID: s.ID, MaxAttempts: s.Attempts()}
	st.Workflow.Steps[i].Status = StepReady
	if snap.Action == policy.Ask {
		more, err := d.requestApproval(st, i, snap)
		return append(out, more...), false, err
	}
	return out, false, nil
}

// onStepResult records a step's result: retries, continue-on-error, or
// the run's failure; then the workflow advances.
func (d *Dispatcher) onStepResult(ctx context.Context, st *RunState, i int) ([]emission, error) {
	c := st.Calls[i]
	if c.OK {
		st.Workflow.Steps[i].Status = StepDone
		// The step holds the output; its call keeps none, so run state
		// stores each output once.
		st.Workflow.Steps[i].Output, st.Calls[i].Output = c.Output, nil
		return d.advanceWorkflow(ctx, st)
	}
	out := d.stepFailed(st, i, c.Error)
	if st.IsTerminal() {
		return out, nil
	}
	more, err := d.advanceWorkflow(ctx, st)
	return append(out, more...), err
}

// stepFailed applies a step failure: another attempt after its retry
// delay (a durable timer), or continue-on-error, or the run fails.
func (d *Dispatcher) stepFailed(st *RunState, i int, cause *actionbus.Error) []emission {
	s := st.Workflow.Def.Steps[i]
	sr := &st.Workflow.Steps[i]
	pi := i
	if sr.Attempt < s.Attempts() {
		sr.Status = StepWaitingRetry
		delay := time.Duration(s.Retry.Delay(sr.Attempt+1)) * time.Millisecond
		return []emission{
			stepWith(st, "workflow-step-retry", &pi, s.Action, fmt.Sprintf("attempt %d of %d failed: %s; retrying in %s", sr.Attempt, s.Attempts(), cause.Code, delay), "failed",
				map[string]any{"step": s.ID, "attempt": sr.Attempt, "maxAttempts": s.Attempts()}),
			d.timer(st, events.TimerRetry, fmt.Sprintf("retry%d-%d", i, st.Workflow.Steps[i].Attempt), s.ID, "retry "+s.ID, delay),
		}
	}
	if s.ContinueOnError {
		sr.Status, sr.Error = StepDone, cause
		sr.Output = map[string]any{"ok": false, "error": map[string]any{"code": string(cause.Code), "message": cause.Message}}
		return []emission{stepWith(st, "workflow-step-continued", &pi, s.Action, "failed; continueOnError", "failed", map[string]any{"step": s.ID})}
	}
	sr.Status, sr.Error = StepFailed, cause
	err := actionbus.Errorf(actionbus.CodeWorkflowExecution, "step %s (%s) failed after %d attempt(s): %s", s.ID, s.Action, sr.Attempt, cause.Error()).
		WithDetail("step", s.ID).WithDetail("attempts", sr.Attempt).WithDetail("cause", cause)
	return d.fail(st, err)
}

// onRetryTimer starts the next attempt of a step waiting for its retry.
func (d *Dispatcher) onRetryTimer(ctx context.Context, st *RunState, stepID string) ([]emission, error) {
	if st.Workflow == nil || st.IsTerminal() {
		return nil, nil
	}
	for i, s := range st.Workflow.Def.Steps {
		if s.ID != stepID || st.Workflow.Steps[i].Status != StepWaitingRetry {
			continue
		}
		st.Workflow.Steps[i].Attempt++
		st.Workflow.Steps[i].Status = StepPending
		return d.advanceWorkflow(ctx, st)
	}
	return nil, nil
}

// waitingRetry reports whether a workflow step is waiting for a retry.
func (st *RunState) waitingRetry() bool {
	return st.Workflow != nil && slices.ContainsFunc(st.Workflow.Steps, func(s StepRun) bool { return s.Status == StepWaitingRetry })
}
