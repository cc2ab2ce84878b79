package client

import "encoding/json"

// Workflow builds a JSON workflow (the same document other languages
// write by hand): named steps, each one action call, whose input may refer
// to earlier steps' outputs with [FromStep].
type Workflow struct {
	name  string
	steps []map[string]any
}

// NewWorkflow starts a workflow named name.
func NewWorkflow(name string) *Workflow { return &Workflow{name: name} }

// StepOption sets an optional control of a step.
type StepOption func(map[string]any)

// Retry makes a failed step run again: attempts include the first; delay
// between attempts; exponential doubles the delay after each attempt.
func Retry(attempts int, delayMs int64, exponential bool) StepOption {
	return func(s map[string]any) {
		r := map[string]any{"maxAttempts": attempts, "delayMs": delayMs}
		if exponential {
			r["backoff"] = "exponential"
		}
		s["retry"] = r
	}
}

// Timeout bounds each attempt of a step.
func Timeout(ms int64) StepOption { return func(s map[string]any) { s["timeoutMs"] = ms } }

// ContinueOnError lets later steps run after this step fails; its output
// becomes {ok: false, error: {code, message}}.
func ContinueOnError() StepOption { return func(s map[string]any) { s["continueOnError"] = true } }

// IdempotencyKey passes an idempotency key to the step's action.
func IdempotencyKey(key string) StepOption {
	return func(s map[string]any) { s["idempotencyKey"] = key }
}

// StepModes restricts the modes the step may use.
func StepModes(modes ...string) StepOption {
	return func(s map[string]any) { s["allowedModes"] = modes }
}

// Step adds a step.
func (w *Workflow) Step(id, action string, input map[string]any, opts ...StepOption) *Workflow {
	if input == nil {
		input = map[string]any{} // every step gives its input
	}
	s := map[string]any{"id": id, "action": action, "input": input}
	for _, o := range opts {
		o(s)
	}
	w.steps = append(w.steps, s)
	return w
}

// FromStep refers to the value at a JSON Pointer in an earlier step's
// output.
func FromStep(stepID, path string) map[string]any {
	return map[string]any{"$fromStep": stepID, "path": path}
}

// Build returns the workflow document, as generic JSON.
func (w *Workflow) Build() map[string]any {
	b, _ := json.Marshal(map[string]any{"workflowName": w.name, "steps": w.steps})
	var doc map[string]any
	_ = json.Unmarshal(b, &doc)
	return doc
}
