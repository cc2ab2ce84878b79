package run

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/workflow"
)

// Workflow runs: a run.requested carrying a JSON workflow. Validation runs
// before any step starts. Steps whose references are satisfied run in
// parallel (at most MaxPlanParallel at once); outputs are reported in
// declaration order. Every step is host input.

// startWorkflow validates a workflow and starts its first steps.
func (mm *Machine) startWorkflow(ctx context.Context, st *State, doc map[string]any, prior *State) ([]Effect, error) {
	// The catalog the validation needs: the modes of the actions the
	// steps name (an unknown name is left out, and reported by Validate).
	catalog := workflow.Catalog{}
	if steps, ok := doc["steps"].([]any); ok {
		for _, s := range steps {
			if m, ok := s.(map[string]any); ok {
				if name, ok := m["action"].(string); ok {
					if _, known := catalog[name]; known {
						continue
					}
					e, err := mm.env.Action(ctx, name)
					switch {
					case err == nil:
						catalog[name] = string(e.Mode)
					case ctx.Err() != nil:
						return nil, err
					case !errors.Is(err, actionbus.ErrActionNotFound):
						return mm.fail(st, lookupRefusal(name, err).WithDetail("step", m["id"])), nil
					}
				}
			}
		}
	}
	if issues := workflow.Validate(doc, catalog); len(issues) > 0 {
		return mm.fail(st, workflow.Error(issues)), nil
	}
	def, err := workflow.Parse(doc)
	if err != nil {
		return mm.fail(st, actionbus.Errorf(actionbus.CodeWorkflowValidation, "%w", err)), nil
	}
	st.Kind = KindWorkflow
	st.Cycle = 1
	st.Phase = PhaseActing
	st.Workflow = &WorkflowRun{Def: *def, Steps: make([]StepRun, len(def.Steps))}
	st.Calls = make([]CallState, len(def.Steps))
	for i, s := range def.Steps {
		st.Workflow.Steps[i] = StepRun{Status: StepStatusPending, Attempt: 1}
		st.Calls[i] = CallState{PlanIndex: i, Action: s.Action, Origin: events.OriginHost, Attempt: 1, Dispatched: true, Done: true}
	}
	out := []Effect{step(st, StepWorkflowValidated, nil, "", fmt.Sprintf("%s: %d steps", def.WorkflowName, len(def.Steps)), "ok")}
	if prior != nil {
		if err := sameDefinition(st, prior); err != nil {
			return append(out, mm.fail(st, err)...), nil
		}
		// Claimed before anything of the prior run is reused: a refused
		// retry holds none of its results.
		refused, cerr := mm.claimRetry(ctx, st, prior)
		if cerr != nil {
			return nil, cerr
		}
		if refused != nil {
			return append(out, mm.fail(st, refused)...), nil
		}
		out = append(out, retriedLink(st, prior))
		for _, i := range reuseSteps(st, prior) {
			pi := i
			out = append(out, stepWith(st, StepWorkflowStepReused, &pi, def.Steps[i].Action, "completed by run "+prior.RunID, "ok",
				map[string]any{"step": def.Steps[i].ID, "retryOf": prior.RunID}))
		}
	}
	more, err := mm.advanceWorkflow(ctx, st)
	return append(out, more...), err
}

// sameDefinition refuses a retry of a workflow run that had another
// definition.
func sameDefinition(st *State, prior *State) *actionbus.Error {
	a, _ := json.Marshal(prior.Workflow.Def)
	b, _ := json.Marshal(st.Workflow.Def)
	if string(a) != string(b) {
		return actionbus.Errorf(actionbus.CodeRetryRefused, "run %s had another workflow definition", prior.RunID).
			WithDetail("retryOf", prior.RunID)
	}
	return nil
}

// reuseSteps marks done the steps the prior run (of the same definition)
// completed, with their outputs, so that they do not run again.
func reuseSteps(st *State, prior *State) []int {
	var reused []int
	for i, ps := range prior.Workflow.Steps {
		if ps.Status == StepStatusDone && ps.Error == nil {
			st.Workflow.Steps[i] = StepRun{Status: StepStatusDone, Attempt: ps.Attempt, Output: ps.Output}
			reused = append(reused, i)
		}
	}
	return reused
}

// advanceWorkflow readies every pending step whose references are
// satisfied, dispatches what it can, and completes the run when every step
// is done.
func (m *Machine) advanceWorkflow(ctx context.Context, st *State) ([]Effect, error) {
	return m.advanceWorkflowWith(ctx, st, nil)
}

// advanceWorkflowWith is advanceWorkflow with the outputs of steps done in
// this transition as they came (by step id), which the state keeps by a
// reference to an artifact not stored yet.
func (m *Machine) advanceWorkflowWith(ctx context.Context, st *State, fresh map[string]any) ([]Effect, error) {
	wf := st.Workflow
	var out []Effect
	outputs := map[string]any{}
	status := map[string]StepStatus{}
	for i, s := range wf.Def.Steps {
		status[s.ID] = wf.Steps[i].Status
		if wf.Steps[i].Status == StepStatusDone {
			outputs[s.ID] = wf.Steps[i].Output
			if v, ok := fresh[s.ID]; ok {
				outputs[s.ID] = v
			}
		}
	}
	for i, s := range wf.Def.Steps {
		if wf.Steps[i].Status != StepStatusPending {
			continue
		}
		ready := true
		for _, dep := range workflow.Dependencies(s) {
			if status[dep] != StepStatusDone {
				ready = false
			}
		}
		if !ready {
			continue
		}
		more, stop, err := m.readyStep(ctx, st, i, outputs)
		out = append(out, more...)
		if err != nil || stop {
			return out, err
		}
	}
	out = append(out, m.dispatchMore(st)...)
	if slices.ContainsFunc(wf.Steps, func(s StepRun) bool { return s.Status != StepStatusDone }) {
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
	out = append(out, step(st, StepWorkflowCompleted, nil, "", fmt.Sprintf("%d steps", len(wf.Steps)), "ok"))
	return append(out, m.terminate(st, &Terminal{Type: events.TypeRunCompleted, Output: result,
		Answer: fmt.Sprintf("workflow %s completed", wf.Def.WorkflowName)})...), nil
}

// readyStep prepares step i's call: resolves its references (loading
// outputs kept as artifacts), admits it (catalog, modes, arguments,
// policy) and marks it ready, or awaiting approval. stop reports that the
// run ended.
func (m *Machine) readyStep(ctx context.Context, st *State, i int, outputs map[string]any) (out []Effect, stop bool, err error) {
	s := st.Workflow.Def.Steps[i]
	failStep := func(err *actionbus.Error) ([]Effect, bool, error) {
		if _, ok := err.Details["step"]; !ok {
			err = err.WithDetail("step", s.ID)
		}
		return append(out, m.stepFailed(st, i, err)...), st.IsTerminal(), nil
	}
	for _, dep := range workflow.Dependencies(s) {
		if outputs[dep], err = m.loadOutput(ctx, st.Tenant, outputs[dep]); err != nil {
			var abErr *actionbus.Error
			if errors.As(err, &abErr) {
				return failStep(abErr) // a typed refusal (a tampered output), not an outage
			}
			return nil, false, err
		}
	}
	input, rerr := workflow.Resolve(s, outputs)
	if rerr != nil {
		var abErr *actionbus.Error
		if !errors.As(rerr, &abErr) {
			abErr = actionbus.Errorf(actionbus.CodeInvalidStepReference, "%v", rerr)
		}
		return failStep(abErr)
	}
	attempt := st.Workflow.Steps[i].Attempt
	steps, a, err := m.admit(ctx, st, callSpec{Action: s.Action, Args: input, Origin: events.OriginHost, PlanIndex: i, InPlan: true,
		StepID: s.ID, StepModes: s.AllowedModes, TimeoutMs: s.TimeoutMs, IdempotencyKey: s.IdempotencyKey,
		Attempt: attempt, MaxAttempts: s.Attempts()})
	if err != nil {
		return nil, false, err
	}
	out = steps
	switch a.Verdict {
	case unknownAction, argsInvalid:
		return failStep(a.Err)
	case refused, denied:
		return append(out, m.fail(st, a.Err)...), true, nil
	}
	st.Calls[i] = a.Call
	st.Workflow.Steps[i].Status = StepStatusReady
	if a.Verdict == needsApproval {
		return append(out, m.requestApproval(st, i, a.Snapshot)...), false, nil
	}
	return out, false, nil
}

// loadOutput returns a step output kept as an artifact reference
// ({"artifact": ref}) as the value it stands for; any other output as is.
func (m *Machine) loadOutput(ctx context.Context, tenant string, v any) (any, error) {
	ref, ok := artifactRef(v)
	if !ok {
		return v, nil
	}
	data, err := m.env.GetArtifact(ctx, tenant, ref)
	if err != nil {
		var abErr *actionbus.Error
		if errors.As(err, &abErr) {
			return nil, abErr
		}
		return nil, fmt.Errorf("run: load output artifact %s: %w", ref.ID, err)
	}
	var out any
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("run: output artifact %s is not JSON: %w", ref.ID, err)
	}
	return out, nil
}

// artifactRef recognizes an output that is an artifact reference.
func artifactRef(v any) (events.ArtifactRef, bool) {
	var ref events.ArtifactRef
	switch t := v.(type) {
	case map[string]any:
		if len(t) != 1 || t["artifact"] == nil {
			return ref, false
		}
		b, err := json.Marshal(t["artifact"])
		if err != nil || json.Unmarshal(b, &ref) != nil || ref.ID == "" {
			return ref, false
		}
		return ref, true
	}
	return ref, false
}

// keepOutput returns what run state keeps of a step's output: the output
// itself up to InlineOutputBytes, else a reference to an artifact holding
// it (stored by the shell: the effect returned), so that 20 steps of 250
// KB stay far below the server's max payload.
func (m *Machine) keepOutput(st *State, i int, v any) (any, []Effect) {
	if _, ok := artifactRef(v); ok {
		return v, nil
	}
	data, err := json.Marshal(v)
	if err != nil || len(data) <= m.lim.InlineOutputBytes {
		return v, nil
	}
	ref, put := m.artifact(st, st.derive("step-output", i, st.Workflow.Steps[i].Attempt), data)
	return map[string]any{"artifact": ref}, []Effect{put}
}

// onStepResult records a step's result: retries, continue-on-error, or
// the run's failure; then the workflow advances.
func (m *Machine) onStepResult(ctx context.Context, st *State, i int) ([]Effect, error) {
	c := st.Calls[i]
	if c.OK {
		kept, put := m.keepOutput(st, i, c.Output)
		st.Workflow.Steps[i].Status = StepStatusDone
		// The step holds the output; its call keeps neither output nor
		// arguments (a resolved reference can be large), so run state
		// stores each output once and a finished step costs little.
		// The steps it readies read the output as it came: the artifact
		// that keeps it is stored by the shell after this transition.
		st.Workflow.Steps[i].Output, st.Calls[i].Output, st.Calls[i].Args = kept, nil, nil
		more, err := m.advanceWorkflowWith(ctx, st, map[string]any{st.Workflow.Def.Steps[i].ID: c.Output})
		return append(put, more...), err
	}
	out := m.stepFailed(st, i, c.Error)
	if st.IsTerminal() {
		return out, nil
	}
	more, err := m.advanceWorkflow(ctx, st)
	return append(out, more...), err
}

// stepFailed applies a step failure: another attempt after its retry
// delay (a durable timer), or continue-on-error, or the run fails.
func (m *Machine) stepFailed(st *State, i int, cause *actionbus.Error) []Effect {
	s := st.Workflow.Def.Steps[i]
	sr := &st.Workflow.Steps[i]
	pi := i
	if sr.Attempt < s.Attempts() {
		sr.Status = StepStatusWaitingRetry
		delay := time.Duration(s.Retry.Delay(sr.Attempt+1)) * time.Millisecond
		return []Effect{
			stepWith(st, StepWorkflowStepRetry, &pi, s.Action, fmt.Sprintf("attempt %d of %d failed: %s; retrying in %s", sr.Attempt, s.Attempts(), cause.Code, delay), "failed",
				map[string]any{"step": s.ID, "attempt": sr.Attempt, "maxAttempts": s.Attempts()}),
			m.timer(st, events.TimerFired{Kind: events.TimerRetry, StepID: s.ID, Stage: "retry " + s.ID}, fmt.Sprintf("retry%d-%d", i, sr.Attempt), delay),
		}
	}
	if s.ContinueOnError {
		sr.Status, sr.Error = StepStatusDone, cause
		sr.Output = map[string]any{"ok": false, "error": map[string]any{"code": string(cause.Code), "message": cause.Message}}
		return []Effect{stepWith(st, StepWorkflowStepContinued, &pi, s.Action, "failed; continueOnError", "failed", map[string]any{"step": s.ID})}
	}
	sr.Status, sr.Error = StepStatusFailed, cause
	err := actionbus.Errorf(actionbus.CodeWorkflowExecution, "step %s (%s) failed after %d attempt(s): %s", s.ID, s.Action, sr.Attempt, cause.Error()).
		WithDetail("step", s.ID).WithDetail("attempts", sr.Attempt).WithDetail("cause", cause)
	return m.fail(st, err)
}

// onRetryTimer starts the next attempt of a step waiting for its retry.
func (m *Machine) onRetryTimer(ctx context.Context, st *State, stepID string) ([]Effect, error) {
	if st.Workflow == nil || st.IsTerminal() {
		return nil, nil
	}
	for i, s := range st.Workflow.Def.Steps {
		if s.ID != stepID || st.Workflow.Steps[i].Status != StepStatusWaitingRetry {
			continue
		}
		st.Workflow.Steps[i].Attempt++
		st.Workflow.Steps[i].Status = StepStatusPending
		return m.advanceWorkflow(ctx, st)
	}
	return nil, nil
}

// waitingRetry reports whether a workflow step is waiting for a retry.
func (st *State) waitingRetry() bool {
	return st.Workflow != nil && slices.ContainsFunc(st.Workflow.Steps, func(s StepRun) bool { return s.Status == StepStatusWaitingRetry })
}
