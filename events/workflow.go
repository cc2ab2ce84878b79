package events

// Workflow is a JSON workflow document: named steps, each one action call,
// run in dependency order (a step waits for the steps its input refers
// to; independent steps run at once). Its JSON is the same document
// every language writes (schemas/workflow.json); RunRequested carries it
// as generic JSON so that the dispatcher sees, and refuses with a
// workflow_validation error, fields this type does not know.
type Workflow struct {
	// WorkflowName names the workflow: letters, digits, '.', '_' and '-',
	// at most 128.
	WorkflowName string `json:"workflowName"`
	// Steps are the workflow's calls, at least one, in declaration order
	// (which is the order of the run's results).
	Steps []WorkflowStep `json:"steps"`
}

// WorkflowStep is one action call of a workflow.
type WorkflowStep struct {
	// ID names the step, unique in its workflow (the same alphabet as
	// WorkflowName); references and results use it.
	ID string `json:"id"`
	// Action is the catalog name of the action the step calls.
	Action string `json:"action"`
	// Input is the action's input: any JSON object, in which a [StepRef]
	// (an object {"$fromStep": id, "path": pointer}) stands for a value of
	// an earlier step's output. Never omitted: {} for none.
	Input map[string]any `json:"input"`
	// AllowedModes, when set, are the modes the step's action may have
	// (read, draft, dryRun, mutate); the run's AllowedModes apply as well.
	AllowedModes []string `json:"allowedModes,omitempty"`
	// Retry, when set, runs a failed step again; nil: one attempt.
	Retry *WorkflowRetry `json:"retry,omitempty"`
	// TimeoutMs bounds each attempt, from 1 ms to one day; 0: the action's
	// own timeout.
	TimeoutMs int64 `json:"timeoutMs,omitempty"`
	// ContinueOnError lets later steps run after this step fails; its
	// output becomes {ok: false, error: {code, message}}. Default false:
	// the workflow fails with the step.
	ContinueOnError bool `json:"continueOnError,omitempty"`
	// IdempotencyKey is passed to the action (at most 512 characters, not
	// blank); a mutate action without one is idempotent per call.
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
}

// WorkflowRetry says how often a failed step runs again.
type WorkflowRetry struct {
	// MaxAttempts counts every attempt, the first included: 1 to 20.
	MaxAttempts int `json:"maxAttempts"`
	// DelayMs is the wait before the second attempt, 0 to one day.
	DelayMs int64 `json:"delayMs,omitempty"`
	// Backoff "exponential" doubles the delay after each failed attempt;
	// "fixed" (the default, also when empty) keeps it.
	Backoff string `json:"backoff,omitempty"`
}

// BackoffExponential is the [WorkflowRetry] backoff that doubles the delay.
const BackoffExponential = "exponential"

// StepRef stands, in a step's input, for the value at Path (a JSON
// Pointer, "" for the whole output) in the output of the earlier step
// FromStep.
type StepRef struct {
	FromStep string `json:"$fromStep"`
	Path     string `json:"path"`
}

// Attempts returns the most attempts the step may make: at least 1.
func (s WorkflowStep) Attempts() int {
	if s.Retry == nil || s.Retry.MaxAttempts < 1 {
		return 1
	}
	return s.Retry.MaxAttempts
}

// Delay returns the wait before attempt (2, 3, ...); 0 for a nil retry.
func (r *WorkflowRetry) Delay(attempt int) int64 {
	if r == nil {
		return 0
	}
	d := r.DelayMs
	if r.Backoff == BackoffExponential {
		for i := 2; i < attempt; i++ {
			d *= 2
		}
	}
	return d
}
