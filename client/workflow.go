package client

import (
	"encoding/json"
	"fmt"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
)

// Workflow is a workflow document, typed: named steps, each one action
// call, whose input may refer to earlier steps' outputs with [FromStep].
// Build one with [NewWorkflow] or write it as a literal; it is the same
// JSON document other languages write by hand (schemas/workflow.json).
type Workflow = events.Workflow

// WorkflowStep is one step of a [Workflow].
type WorkflowStep = events.WorkflowStep

// WorkflowRetry is a step's retry policy.
type WorkflowRetry = events.WorkflowRetry

// StepRef stands, in a step's input, for a value of an earlier step's
// output.
type StepRef = events.StepRef

// WorkflowBuilder builds a [Workflow] a step at a time.
type WorkflowBuilder struct {
	wf Workflow
}

// NewWorkflow starts a workflow named name.
func NewWorkflow(name string) *WorkflowBuilder {
	return &WorkflowBuilder{wf: Workflow{WorkflowName: name}}
}

// StepOption sets an optional control of a step.
type StepOption func(*WorkflowStep)

// Retry makes a failed step run again: attempts include the first; delay
// between attempts; exponential doubles the delay after each attempt.
func Retry(attempts int, delayMs int64, exponential bool) StepOption {
	return func(s *WorkflowStep) {
		s.Retry = &WorkflowRetry{MaxAttempts: attempts, DelayMs: delayMs}
		if exponential {
			s.Retry.Backoff = events.BackoffExponential
		}
	}
}

// Timeout bounds each attempt of a step.
func Timeout(ms int64) StepOption { return func(s *WorkflowStep) { s.TimeoutMs = ms } }

// ContinueOnError lets later steps run after this step fails; its output
// becomes {ok: false, error: {code, message}}.
func ContinueOnError() StepOption { return func(s *WorkflowStep) { s.ContinueOnError = true } }

// IdempotencyKey passes an idempotency key to the step's action.
func IdempotencyKey(key string) StepOption {
	return func(s *WorkflowStep) { s.IdempotencyKey = key }
}

// StepModes restricts the modes the step may use.
func StepModes(modes ...string) StepOption {
	return func(s *WorkflowStep) { s.AllowedModes = modes }
}

// Step adds a step; a nil input is {} (every step gives its input).
func (b *WorkflowBuilder) Step(id, action string, input map[string]any, opts ...StepOption) *WorkflowBuilder {
	if input == nil {
		input = map[string]any{}
	}
	s := WorkflowStep{ID: id, Action: action, Input: input}
	for _, o := range opts {
		o(&s)
	}
	b.wf.Steps = append(b.wf.Steps, s)
	return b
}

// FromStep refers to the value at a JSON Pointer ("" for all of it) in an
// earlier step's output.
func FromStep(stepID, path string) StepRef {
	return StepRef{FromStep: stepID, Path: path}
}

// Build returns the workflow built so far.
func (b *WorkflowBuilder) Build() *Workflow {
	wf := b.wf
	wf.Steps = append([]WorkflowStep(nil), b.wf.Steps...)
	return &wf
}

// workflowDocument is the workflow a request carries, as the generic JSON
// the wire holds: WorkflowJSON as it is, else Workflow; nil for neither.
func workflowDocument(req RunRequest) (map[string]any, error) {
	b := []byte(req.WorkflowJSON)
	switch {
	case req.Workflow != nil && len(b) > 0:
		return nil, actionbus.Errorf(actionbus.CodeWorkflowValidation, "a run request carries Workflow or WorkflowJSON, not both")
	case req.Workflow != nil:
		var err error
		if b, err = json.Marshal(req.Workflow); err != nil {
			return nil, actionbus.Errorf(actionbus.CodeWorkflowValidation, "the workflow is not JSON: %w", err)
		}
	case len(b) == 0:
		return nil, nil
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil || doc == nil {
		return nil, actionbus.Errorf(actionbus.CodeWorkflowValidation, "a workflow is a JSON object%s", errSuffix(err))
	}
	return doc, nil
}

func errSuffix(err error) string {
	if err == nil {
		return ""
	}
	return fmt.Sprintf(": %v", err)
}

// typedWorkflow decodes a stored workflow document into a Workflow, as far
// as it decodes (a field of another type is left zero): for reading; a
// request that is sent again carries the document as it is
// (RunRequest.WorkflowJSON).
func typedWorkflow(doc map[string]any) *Workflow {
	if doc == nil {
		return nil
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil
	}
	var wf Workflow
	_ = json.Unmarshal(b, &wf)
	return &wf
}

// rawWorkflow is a stored workflow document as JSON, nil for none.
func rawWorkflow(doc map[string]any) json.RawMessage {
	if doc == nil {
		return nil
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil
	}
	return b
}
