// Package workflow is the JSON workflow model: parsing, static validation
// (every check of the seed, with codes and JSON-Pointer paths) and
// $fromStep references. It does not execute workflows; the dispatcher does.
package workflow

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/jsoncodec"
	"github.com/actionbus/actionbus/internal/schema"
	"github.com/actionbus/actionbus/schemas"
)

// Workflow is a JSON workflow document (the public [events.Workflow]).
type Workflow = events.Workflow

// Step is one action call of a workflow.
type Step = events.WorkflowStep

// Retry says how often a failed step runs again.
type Retry = events.WorkflowRetry

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

// Catalog tells validation which actions exist and their modes.
type Catalog map[string]string

// docSchema is schemas/workflow.json, compiled once.
var docSchema = sync.OnceValues(func() (*schema.Compiled, error) {
	b, err := schemas.FS.ReadFile("workflow.json")
	if err != nil {
		return nil, err
	}
	return schema.CompileDocument(schemas.BaseURL+"workflow.json", b)
})

// Validate checks a workflow document (generic JSON, as decoded) and
// returns every issue, sorted by path: its shape against
// schemas/workflow.json, each violation answered with the code and words
// of the field it is at ([shapeIssue]), then what a schema cannot say
// ([semantics]): unique step ids, references to earlier steps only and,
// with a catalog, that every action exists and that a step's
// allowedModes include its action's mode.
func Validate(doc any, catalog Catalog) []Issue {
	sc, err := docSchema()
	if err != nil {
		return []Issue{{Code: actionbus.CodeWorkflowValidation, Message: "the workflow schema does not compile: " + err.Error()}}
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return []Issue{{Code: actionbus.CodeWorkflowValidation, Message: "a workflow is a JSON document: " + err.Error()}}
	}
	generic, err := jsoncodec.Generic(b)
	if err != nil {
		return []Issue{{Code: actionbus.CodeWorkflowValidation, Message: "a workflow is a JSON document: " + err.Error()}}
	}
	var issues []Issue
	bad := map[string]bool{}
	for _, v := range sc.Violations(generic) {
		is := shapeIssue(v)
		issues = append(issues, is)
		bad[v.Path] = true
	}
	// What decodes of it, field by field (a field of the wrong type is
	// left zero, and its violation is above).
	var wf Workflow
	_ = json.Unmarshal(b, &wf)
	issues = append(issues, semantics(wf, catalog, bad)...)
	slices.SortStableFunc(issues, func(a, b Issue) int { return strings.Compare(a.Path, b.Path) })
	return issues
}

// shapeIssue answers a violation of the workflow schema with the code and
// the words of the field it is at.
func shapeIssue(v schema.Issue) Issue {
	is := func(code actionbus.Code, format string, args ...any) Issue {
		return Issue{Code: code, Path: v.Path, Message: fmt.Sprintf(format, args...)}
	}
	tok := schema.Tokens(v.Path)
	extra := v.Keyword == "additionalProperties"
	last := ""
	if len(tok) > 0 {
		last = tok[len(tok)-1]
	}
	switch {
	case len(tok) == 0:
		return is(actionbus.CodeWorkflowValidation, "a workflow is a JSON object")
	case len(tok) == 1 && extra:
		return is(CodeUnknownField, "unknown workflow field %q", last)
	case tok[0] == "workflowName" && v.Keyword == "required":
		return is(CodeInvalidName, "workflowName is missing")
	case tok[0] == "workflowName":
		return is(CodeInvalidName, "workflowName must be a non-empty name (letters, digits, '.', '_', '-')")
	case len(tok) == 1:
		return is(CodeMissingSteps, "a workflow needs a non-empty steps array")
	case len(tok) == 2:
		return is(actionbus.CodeWorkflowValidation, "a step is a JSON object")
	case len(tok) == 3 && extra:
		return is(CodeUnknownField, "unknown step field %q", last)
	}
	switch field := tok[2]; field {
	case "id":
		return is(CodeInvalidStepID, "step id must be a non-empty name (letters, digits, '.', '_', '-')")
	case "action":
		return is(actionbus.CodeActionNotFound, "step action must be an action name")
	case "allowedModes":
		if len(tok) == 3 {
			return is(CodeInvalidActionMode, "allowedModes must be a non-empty array of modes")
		}
		return is(CodeInvalidActionMode, "unknown mode (want read, draft, dryRun or mutate)")
	case "retry":
		switch {
		case len(tok) == 3:
			return is(CodeInvalidRetry, "retry must be an object {maxAttempts, delayMs}")
		case extra:
			return is(CodeInvalidRetry, "unknown retry field %q", last)
		case last == "maxAttempts":
			return is(CodeInvalidRetry, "maxAttempts must be a whole number from 1 to 20 (it includes the first attempt)")
		case last == "delayMs":
			return is(CodeInvalidRetry, "delayMs must be a whole number of milliseconds from 0 to one day")
		}
		return is(CodeInvalidRetry, "backoff must be \"fixed\" or \"exponential\"")
	case "timeoutMs":
		return is(CodeInvalidTimeout, "timeoutMs must be a whole number of milliseconds from 1 to one day")
	case "continueOnError":
		return is(CodeInvalidContinue, "continueOnError must be true or false")
	case "idempotencyKey":
		return is(CodeInvalidIdempotencyKey, "idempotencyKey must be a non-empty string of at most 512 characters")
	}
	// The input (field "input"), and the $fromStep references in it.
	switch {
	case len(tok) == 3 && v.Keyword == "required":
		// The seed: every step gives its input ({} for none).
		return is(CodeUnsupportedInput, "a step needs an input object ({} for none)")
	case len(tok) == 3:
		return is(CodeUnsupportedInput, "input must be a JSON object")
	case extra:
		return is(CodeUnsupportedInput, "a $fromStep reference has only $fromStep and path")
	case last == "$fromStep":
		// Said of the reference, not of its field.
		return Issue{Code: CodeUnsupportedInput, Path: v.Path[:strings.LastIndexByte(v.Path, '/')], Message: "$fromStep must name a step"}
	case v.Keyword == "required":
		// The seed: a reference is fromStep(stepId, path), the path a JSON
		// Pointer; anything else is an invalid step reference.
		return is(actionbus.CodeInvalidStepReference, "a $fromStep reference needs a path (a JSON Pointer; \"\" for the whole output)")
	}
	return is(actionbus.CodeInvalidStepReference, "path must be a JSON Pointer (\"\" or starting with /)")
}

// semantics checks what the schema cannot: step ids unique, references
// naming earlier steps, and with a catalog actions that exist with a mode
// the step allows. It skips what has a shape issue (bad holds the paths
// of the schema's violations).
func semantics(wf Workflow, catalog Catalog, bad map[string]bool) []Issue {
	var issues []Issue
	add := func(code actionbus.Code, path, format string, args ...any) {
		issues = append(issues, Issue{Code: code, Path: path, Message: fmt.Sprintf(format, args...)})
	}
	seen := map[string]int{}
	for i, s := range wf.Steps {
		p := "/steps/" + strconv.Itoa(i)
		if bad[p] {
			continue
		}
		if !bad[p+"/id"] {
			if first, dup := seen[s.ID]; dup {
				add(actionbus.CodeDuplicateStep, p+"/id", "step id %q is already used by step %d", s.ID, first)
			} else {
				seen[s.ID] = i
			}
		}
		if catalog != nil && !bad[p+"/action"] {
			switch m, known := catalog[s.Action]; {
			case !known:
				add(actionbus.CodeActionNotFound, p+"/action", "action %q is not in the catalog", s.Action)
			case !slices.Contains(modes, m):
				add(CodeInvalidActionMode, p+"/action", "action %q has an invalid mode %q", s.Action, m)
			case s.AllowedModes != nil && !bad[p+"/allowedModes"] && !slices.Contains(s.AllowedModes, m):
				add(CodeStepModeExcluded, p+"/allowedModes", "allowedModes exclude the mode %s of action %s", m, s.Action)
			}
		}
		walkRefs(s.Input, p+"/input", func(path string, ref map[string]any) {
			from, _ := ref["$fromStep"].(string)
			if bad[path+"/$fromStep"] || from == "" {
				return
			}
			switch j, known := seen[from]; {
			case from == s.ID:
				add(actionbus.CodeInvalidStepReference, path+"/$fromStep", "step %q refers to itself", from)
			case known && j < i:
			case slices.IndexFunc(wf.Steps, func(o Step) bool { return o.ID == from }) > i:
				add(actionbus.CodeInvalidStepReference, path+"/$fromStep", "step %q is a future step; references resolve against earlier steps only", from)
			default:
				add(actionbus.CodeInvalidStepReference, path+"/$fromStep", "no earlier step %q", from)
			}
		})
	}
	return issues
}

// modes are the action modes a catalog entry may have.
var modes = []string{"read", "draft", "dryRun", "mutate"}

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

// Dependencies returns the ids of the steps a step's input refers to (in
// an input decoded from JSON).
func Dependencies(s Step) []string {
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
func Resolve(s Step, outputs map[string]any) (map[string]any, error) {
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
