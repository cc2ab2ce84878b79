// Package workflow is the JSON workflow model: parsing, static validation
// (every check of the seed, with codes and JSON-Pointer paths) and
// $fromStep references. It does not execute workflows; the dispatcher does.
package workflow

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/actionbus/actionbus"
)

// Workflow is a JSON workflow: named steps, each one action call.
type Workflow struct {
	WorkflowName string `json:"workflowName"`
	Steps        []Step `json:"steps"`
}

// Step is one action call of a workflow.
type Step struct {
	ID              string         `json:"id"`
	Action          string         `json:"action"`
	Input           map[string]any `json:"input,omitempty"`
	AllowedModes    []string       `json:"allowedModes,omitempty"`
	Retry           *Retry         `json:"retry,omitempty"`
	TimeoutMs       int64          `json:"timeoutMs,omitempty"`
	ContinueOnError bool           `json:"continueOnError,omitempty"`
	IdempotencyKey  string         `json:"idempotencyKey,omitempty"`
}

// Retry says how often a failed step runs again. MaxAttempts includes the
// first attempt.
type Retry struct {
	MaxAttempts int   `json:"maxAttempts"`
	DelayMs     int64 `json:"delayMs,omitempty"`
	// Backoff "exponential" doubles the delay after each failed attempt.
	Backoff string `json:"backoff,omitempty"`
}

// Delay returns the wait before attempt (2, 3, ...).
func (r *Retry) Delay(attempt int) int64 {
	if r == nil {
		return 0
	}
	d := r.DelayMs
	if r.Backoff == "exponential" {
		for i := 2; i < attempt; i++ {
			d *= 2
		}
	}
	return d
}

// Attempts returns the maximum number of attempts (at least 1).
func (s Step) Attempts() int {
	if s.Retry == nil || s.Retry.MaxAttempts < 1 {
		return 1
	}
	return s.Retry.MaxAttempts
}

// Issue is one validation finding.
type Issue struct {
	Code    actionbus.Code `json:"code"`
	Path    string         `json:"path"`
	Message string         `json:"message"`
}

// Issue codes beyond the shared ones.
const (
	CodeInvalidName           actionbus.Code = "invalid_workflow_name"
	CodeMissingSteps          actionbus.Code = "missing_steps"
	CodeInvalidStepID         actionbus.Code = "invalid_step_id"
	CodeInvalidActionMode     actionbus.Code = "invalid_action_mode"
	CodeStepModeExcluded      actionbus.Code = "step_mode_excluded"
	CodeInvalidRetry          actionbus.Code = "invalid_retry"
	CodeInvalidTimeout        actionbus.Code = "invalid_timeout"
	CodeInvalidContinue       actionbus.Code = "invalid_continue_on_error"
	CodeInvalidIdempotencyKey actionbus.Code = "invalid_idempotency_key"
	CodeUnsupportedInput      actionbus.Code = "unsupported_input_value"
	CodeUnknownField          actionbus.Code = "unknown_field"
)

// IssueCodes lists every code an [Issue] can carry.
var IssueCodes = []actionbus.Code{CodeInvalidName, CodeMissingSteps, CodeInvalidStepID, actionbus.CodeDuplicateStep,
	actionbus.CodeActionNotFound, CodeInvalidActionMode, CodeStepModeExcluded, CodeInvalidRetry, CodeInvalidTimeout,
	CodeInvalidContinue, CodeInvalidIdempotencyKey, CodeUnsupportedInput, actionbus.CodeInvalidStepReference, CodeUnknownField}

var (
	namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	modes       = []string{"read", "draft", "dryRun", "mutate"}
)

// Catalog tells validation which actions exist and their modes.
type Catalog map[string]string

// Validate checks a workflow document (generic JSON, as decoded) and
// returns every issue, in document order. With a catalog it also checks
// that every action exists and that step allowedModes include its mode.
func Validate(doc any, catalog Catalog) []Issue {
	var issues []Issue
	add := func(code actionbus.Code, path, format string, args ...any) {
		issues = append(issues, Issue{Code: code, Path: path, Message: fmt.Sprintf(format, args...)})
	}
	root, ok := doc.(map[string]any)
	if !ok {
		add(actionbus.CodeWorkflowValidation, "", "a workflow is a JSON object")
		return issues
	}
	for k := range root {
		if k != "workflowName" && k != "steps" {
			add(CodeUnknownField, "/"+k, "unknown workflow field %q", k)
		}
	}
	name, _ := root["workflowName"].(string)
	if _, present := root["workflowName"]; !present {
		add(CodeInvalidName, "/workflowName", "workflowName is missing")
	} else if !namePattern.MatchString(name) {
		add(CodeInvalidName, "/workflowName", "workflowName must be a non-empty name (letters, digits, '.', '_', '-')")
	}
	steps, ok := root["steps"].([]any)
	if !ok || len(steps) == 0 {
		add(CodeMissingSteps, "/steps", "a workflow needs a non-empty steps array")
		slices.SortStableFunc(issues, func(a, b Issue) int { return strings.Compare(a.Path, b.Path) })
		return issues
	}
	seen := map[string]int{}
	for i, raw := range steps {
		p := "/steps/" + strconv.Itoa(i)
		st, ok := raw.(map[string]any)
		if !ok {
			add(actionbus.CodeWorkflowValidation, p, "a step is a JSON object")
			continue
		}
		for k := range st {
			switch k {
			case "id", "action", "input", "allowedModes", "retry", "timeoutMs", "continueOnError", "idempotencyKey":
			default:
				add(CodeUnknownField, p+"/"+k, "unknown step field %q", k)
			}
		}
		id, _ := st["id"].(string)
		switch {
		case !namePattern.MatchString(id):
			add(CodeInvalidStepID, p+"/id", "step id must be a non-empty name (letters, digits, '.', '_', '-')")
		default:
			if first, dup := seen[id]; dup {
				add(actionbus.CodeDuplicateStep, p+"/id", "step id %q is already used by step %d", id, first)
			} else {
				seen[id] = i
			}
		}
		action, _ := st["action"].(string)
		mode := ""
		if !namePattern.MatchString(action) {
			add(actionbus.CodeActionNotFound, p+"/action", "step action must be an action name")
		} else if catalog != nil {
			m, known := catalog[action]
			if !known {
				add(actionbus.CodeActionNotFound, p+"/action", "action %q is not in the catalog", action)
			} else if !slices.Contains(modes, m) {
				add(CodeInvalidActionMode, p+"/action", "action %q has an invalid mode %q", action, m)
			} else {
				mode = m
			}
		}
		if v, present := st["allowedModes"]; present {
			list, ok := v.([]any)
			if !ok || len(list) == 0 {
				add(CodeInvalidActionMode, p+"/allowedModes", "allowedModes must be a non-empty array of modes")
			} else {
				var have []string
				for j, m := range list {
					s, _ := m.(string)
					if !slices.Contains(modes, s) {
						add(CodeInvalidActionMode, fmt.Sprintf("%s/allowedModes/%d", p, j), "unknown mode %v (want read, draft, dryRun or mutate)", m)
					}
					have = append(have, s)
				}
				if mode != "" && !slices.Contains(have, mode) {
					add(CodeStepModeExcluded, p+"/allowedModes", "allowedModes exclude the mode %s of action %s", mode, action)
				}
			}
		}
		if v, present := st["retry"]; present {
			r, ok := v.(map[string]any)
			if !ok {
				add(CodeInvalidRetry, p+"/retry", "retry must be an object {maxAttempts, delayMs}")
			} else {
				for k := range r {
					if k != "maxAttempts" && k != "delayMs" && k != "backoff" {
						add(CodeInvalidRetry, p+"/retry/"+k, "unknown retry field %q", k)
					}
				}
				if n, ok := wholeNumber(r["maxAttempts"]); !ok || n < 1 || n > 20 {
					add(CodeInvalidRetry, p+"/retry/maxAttempts", "maxAttempts must be a whole number from 1 to 20 (it includes the first attempt)")
				}
				if d, present := r["delayMs"]; present {
					if n, ok := wholeNumber(d); !ok || n < 0 || n > 24*3600*1000 {
						add(CodeInvalidRetry, p+"/retry/delayMs", "delayMs must be a whole number of milliseconds from 0 to one day")
					}
				}
				if b, present := r["backoff"]; present && b != "exponential" && b != "fixed" {
					add(CodeInvalidRetry, p+"/retry/backoff", "backoff must be \"fixed\" or \"exponential\"")
				}
			}
		}
		if v, present := st["timeoutMs"]; present {
			if n, ok := wholeNumber(v); !ok || n < 1 || n > 24*3600*1000 {
				add(CodeInvalidTimeout, p+"/timeoutMs", "timeoutMs must be a whole number of milliseconds from 1 to one day")
			}
		}
		if v, present := st["continueOnError"]; present {
			if _, ok := v.(bool); !ok {
				add(CodeInvalidContinue, p+"/continueOnError", "continueOnError must be true or false")
			}
		}
		if v, present := st["idempotencyKey"]; present {
			if s, ok := v.(string); !ok || strings.TrimSpace(s) == "" || len(s) > 512 {
				add(CodeInvalidIdempotencyKey, p+"/idempotencyKey", "idempotencyKey must be a non-empty string of at most 512 characters")
			}
		}
		if v, present := st["input"]; !present {
			// The seed: every step gives its input ({} for none).
			add(CodeUnsupportedInput, p+"/input", "a step needs an input object ({} for none)")
		} else {
			in, ok := v.(map[string]any)
			if !ok {
				add(CodeUnsupportedInput, p+"/input", "input must be a JSON object")
			} else {
				walkRefs(in, p+"/input", func(path string, ref map[string]any) {
					from, ok := ref["$fromStep"].(string)
					if !ok || from == "" {
						add(CodeUnsupportedInput, path, "$fromStep must name a step")
						return
					}
					for k := range ref {
						if k != "$fromStep" && k != "path" {
							add(CodeUnsupportedInput, path+"/"+escape(k), "a $fromStep reference has only $fromStep and path")
						}
					}
					// The seed: a reference is fromStep(stepId, path), the path a
					// JSON Pointer; anything else is an invalid step reference.
					if ptr, present := ref["path"]; !present {
						add(actionbus.CodeInvalidStepReference, path+"/path", "a $fromStep reference needs a path (a JSON Pointer; \"\" for the whole output)")
					} else if s, ok := ptr.(string); !ok || (s != "" && !strings.HasPrefix(s, "/")) {
						add(actionbus.CodeInvalidStepReference, path+"/path", "path must be a JSON Pointer (\"\" or starting with /)")
					}
					j, known := seen[from]
					switch {
					case from == id:
						add(actionbus.CodeInvalidStepReference, path+"/$fromStep", "step %q refers to itself", from)
					case !known || j >= i:
						if stepIndex(steps, from) > i {
							add(actionbus.CodeInvalidStepReference, path+"/$fromStep", "step %q is a future step; references resolve against earlier steps only", from)
						} else {
							add(actionbus.CodeInvalidStepReference, path+"/$fromStep", "no earlier step %q", from)
						}
					}
				})
			}
		}
	}
	slices.SortStableFunc(issues, func(a, b Issue) int { return strings.Compare(a.Path, b.Path) })
	return issues
}

func stepIndex(steps []any, id string) int {
	for i, s := range steps {
		if m, ok := s.(map[string]any); ok && m["id"] == id {
			return i
		}
	}
	return -1
}

func wholeNumber(v any) (int64, bool) {
	switch n := v.(type) {
	case float64:
		if n == float64(int64(n)) {
			return int64(n), true
		}
	case json.Number:
		i, err := n.Int64()
		return i, err == nil
	case int:
		return int64(n), true
	case int64:
		return n, true
	}
	return 0, false
}

// walkRefs calls fn for every object in v that has a "$fromStep" key.
func walkRefs(v any, path string, fn func(path string, ref map[string]any)) {
	switch t := v.(type) {
	case map[string]any:
		if _, ok := t["$fromStep"]; ok {
			fn(path, t)
			return
		}
		for k, x := range t {
			walkRefs(x, path+"/"+escape(k), fn)
		}
	case []any:
		for i, x := range t {
			walkRefs(x, path+"/"+strconv.Itoa(i), fn)
		}
	}
}

func escape(k string) string {
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}

// Error turns issues into the workflow_validation error.
func Error(issues []Issue) *actionbus.Error {
	msgs := make([]string, 0, len(issues))
	for _, is := range issues {
		msgs = append(msgs, is.Path+": "+is.Message)
	}
	return actionbus.Errorf(actionbus.CodeWorkflowValidation, "workflow is invalid: %s", strings.Join(msgs, "; ")).WithDetail("issues", issues)
}

// Parse decodes a validated workflow document.
func Parse(doc any) (*Workflow, error) {
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	var w Workflow
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, err
	}
	return &w, nil
}

// Dependencies returns the ids of the steps a step's input refers to.
func (s Step) Dependencies() []string {
	var deps []string
	walkRefs(s.Input, "", func(_ string, ref map[string]any) {
		if id, ok := ref["$fromStep"].(string); ok && !slices.Contains(deps, id) {
			deps = append(deps, id)
		}
	})
	return deps
}

// Resolve returns the step's input with every reference replaced by the
// value at its JSON Pointer in the referenced step's output. It fails with
// invalid_step_reference when a pointer does not resolve.
func (s Step) Resolve(outputs map[string]any) (map[string]any, error) {
	var firstErr error
	var resolve func(v any) any
	resolve = func(v any) any {
		switch t := v.(type) {
		case map[string]any:
			if from, ok := t["$fromStep"].(string); ok {
				ptr, _ := t["path"].(string)
				val, err := pointer(outputs[from], ptr)
				if err != nil && firstErr == nil {
					firstErr = actionbus.Errorf(actionbus.CodeInvalidStepReference, "step %s: $fromStep %s path %q: %v", s.ID, from, ptr, err)
				}
				return val
			}
			out := make(map[string]any, len(t))
			for k, x := range t {
				out[k] = resolve(x)
			}
			return out
		case []any:
			out := make([]any, len(t))
			for i, x := range t {
				out[i] = resolve(x)
			}
			return out
		}
		return v
	}
	in, _ := resolve(s.Input).(map[string]any)
	if in == nil {
		in = map[string]any{}
	}
	return in, firstErr
}

// pointer evaluates an RFC 6901 JSON Pointer against v.
func pointer(v any, ptr string) (any, error) {
	if ptr == "" {
		return v, nil
	}
	for _, tok := range strings.Split(ptr[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch t := v.(type) {
		case map[string]any:
			x, ok := t[tok]
			if !ok {
				return nil, fmt.Errorf("no key %q", tok)
			}
			v = x
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(t) {
				return nil, fmt.Errorf("no index %q", tok)
			}
			v = t[i]
		default:
			return nil, fmt.Errorf("cannot descend into %T at %q", v, tok)
		}
	}
	return v, nil
}
