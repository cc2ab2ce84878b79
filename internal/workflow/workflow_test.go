package workflow_test

import (
	"encoding/json"
	"os"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/workflow"
)

var catalog = workflow.Catalog{"delivery.searchJobs": "read", "delivery.dryRunRetry": "dryRun", "delivery.executeRetry": "mutate", "odd.action": "teleport"}

func TestValidationReportsEveryCheckWithCodeAndPath(t *testing.T) {
	step := func(extra string) string {
		return `{"id": "jobs", "action": "delivery.searchJobs", "input": {"status": ["FAILED"]}` + extra + `}`
	}
	cases := []struct {
		name string
		doc  string
		want []workflow.Issue // code and path only
	}{
		{"valid", `{"workflowName": "w", "steps": [` + step("") + `, {"id": "dry", "action": "delivery.dryRunRetry", "input": {"jobIds": {"$fromStep": "jobs", "path": "/jobIds"}}}]}`, nil},
		{"missing workflow name", `{"steps": [` + step("") + `]}`, []workflow.Issue{{Code: "invalid_workflow_name", Path: "/workflowName"}}},
		{"invalid workflow name", `{"workflowName": "has space", "steps": [` + step("") + `]}`, []workflow.Issue{{Code: "invalid_workflow_name", Path: "/workflowName"}}},
		{"missing steps", `{"workflowName": "w"}`, []workflow.Issue{{Code: "missing_steps", Path: "/steps"}}},
		{"empty steps", `{"workflowName": "w", "steps": []}`, []workflow.Issue{{Code: "missing_steps", Path: "/steps"}}},
		{"duplicate step ids", `{"workflowName": "w", "steps": [` + step("") + `,` + step("") + `]}`, []workflow.Issue{{Code: "duplicate_step", Path: "/steps/1/id"}}},
		{"unknown action", `{"workflowName": "w", "steps": [{"id": "a", "action": "nope.missing", "input": {}}]}`, []workflow.Issue{{Code: "action_not_found", Path: "/steps/0/action"}}},
		{"invalid action mode", `{"workflowName": "w", "steps": [{"id": "a", "action": "odd.action", "input": {}}]}`, []workflow.Issue{{Code: "invalid_action_mode", Path: "/steps/0/action"}}},
		{"allowedModes exclude the action's mode", `{"workflowName": "w", "steps": [` + step(`, "allowedModes": ["dryRun"]`) + `]}`, []workflow.Issue{{Code: "step_mode_excluded", Path: "/steps/0/allowedModes"}}},
		{"unknown mode in allowedModes", `{"workflowName": "w", "steps": [` + step(`, "allowedModes": ["read", "yolo"]`) + `]}`, []workflow.Issue{{Code: "invalid_action_mode", Path: "/steps/0/allowedModes/1"}}},
		{"maxAttempts below one", `{"workflowName": "w", "steps": [` + step(`, "retry": {"maxAttempts": 0}`) + `]}`, []workflow.Issue{{Code: "invalid_retry", Path: "/steps/0/retry/maxAttempts"}}},
		{"maxAttempts not whole", `{"workflowName": "w", "steps": [` + step(`, "retry": {"maxAttempts": 1.5}`) + `]}`, []workflow.Issue{{Code: "invalid_retry", Path: "/steps/0/retry/maxAttempts"}}},
		{"negative delay", `{"workflowName": "w", "steps": [` + step(`, "retry": {"maxAttempts": 2, "delayMs": -1}`) + `]}`, []workflow.Issue{{Code: "invalid_retry", Path: "/steps/0/retry/delayMs"}}},
		{"retry not an object", `{"workflowName": "w", "steps": [` + step(`, "retry": 3`) + `]}`, []workflow.Issue{{Code: "invalid_retry", Path: "/steps/0/retry"}}},
		{"zero timeout", `{"workflowName": "w", "steps": [` + step(`, "timeoutMs": 0`) + `]}`, []workflow.Issue{{Code: "invalid_timeout", Path: "/steps/0/timeoutMs"}}},
		{"timeout as a string", `{"workflowName": "w", "steps": [` + step(`, "timeoutMs": "10"`) + `]}`, []workflow.Issue{{Code: "invalid_timeout", Path: "/steps/0/timeoutMs"}}},
		{"continueOnError not a boolean", `{"workflowName": "w", "steps": [` + step(`, "continueOnError": "yes"`) + `]}`, []workflow.Issue{{Code: "invalid_continue_on_error", Path: "/steps/0/continueOnError"}}},
		{"empty idempotency key", `{"workflowName": "w", "steps": [` + step(`, "idempotencyKey": " "`) + `]}`, []workflow.Issue{{Code: "invalid_idempotency_key", Path: "/steps/0/idempotencyKey"}}},
		{"idempotency key not a string", `{"workflowName": "w", "steps": [` + step(`, "idempotencyKey": 7`) + `]}`, []workflow.Issue{{Code: "invalid_idempotency_key", Path: "/steps/0/idempotencyKey"}}},
		{"reference to a missing step", `{"workflowName": "w", "steps": [` + step("") + `, {"id": "b", "action": "delivery.dryRunRetry", "input": {"jobIds": {"$fromStep": "ghost", "path": "/x"}}}]}`,
			[]workflow.Issue{{Code: "invalid_step_reference", Path: "/steps/1/input/jobIds/$fromStep"}}},
		{"reference to a future step", `{"workflowName": "w", "steps": [{"id": "a", "action": "delivery.dryRunRetry", "input": {"jobIds": {"$fromStep": "b", "path": "/x"}}}, {"id": "b", "action": "delivery.searchJobs", "input": {}}]}`,
			[]workflow.Issue{{Code: "invalid_step_reference", Path: "/steps/0/input/jobIds/$fromStep"}}},
		{"reference to itself", `{"workflowName": "w", "steps": [{"id": "a", "action": "delivery.dryRunRetry", "input": {"jobIds": [{"$fromStep": "a", "path": ""}]}}]}`,
			[]workflow.Issue{{Code: "invalid_step_reference", Path: "/steps/0/input/jobIds/0/$fromStep"}}},
		{"input not an object", `{"workflowName": "w", "steps": [{"id": "a", "action": "delivery.searchJobs", "input": [1]}]}`, []workflow.Issue{{Code: "unsupported_input_value", Path: "/steps/0/input"}}},
		{"reference with an extra key", `{"workflowName": "w", "steps": [` + step("") + `, {"id": "b", "action": "delivery.dryRunRetry", "input": {"x": {"$fromStep": "jobs", "path": "/a", "default": 1}}}]}`,
			[]workflow.Issue{{Code: "unsupported_input_value", Path: "/steps/1/input/x/default"}}},
		// Seed 002: a reference is fromStep(stepId, path); a missing path
		// or one that is not a JSON Pointer is an invalid step reference.
		{"seed 002: a reference path that is not a pointer is an invalid step reference", `{"workflowName": "w", "steps": [` + step("") + `, {"id": "b", "action": "delivery.dryRunRetry", "input": {"x": {"$fromStep": "jobs", "path": "jobIds"}}}]}`,
			[]workflow.Issue{{Code: "invalid_step_reference", Path: "/steps/1/input/x/path"}}},
		{"seed 002: a reference without a path is an invalid step reference", `{"workflowName": "w", "steps": [` + step("") + `, {"id": "b", "action": "delivery.dryRunRetry", "input": {"x": {"$fromStep": "jobs"}}}]}`,
			[]workflow.Issue{{Code: "invalid_step_reference", Path: "/steps/1/input/x/path"}}},
		// Seed 002: every step gives its input, at /steps/N/input.
		{"seed 002: a step without input is invalid input", `{"workflowName": "w", "steps": [{"id": "a", "action": "delivery.searchJobs"}]}`,
			[]workflow.Issue{{Code: "unsupported_input_value", Path: "/steps/0/input"}}},
		{"unknown step field", `{"workflowName": "w", "steps": [` + step(`, "retries": 3`) + `]}`, []workflow.Issue{{Code: "unknown_field", Path: "/steps/0/retries"}}},
		{"unknown workflow fields, each at its path", `{"workflowName": "w", "steps": [` + step("") + `], "author": "a", "version": 2}`,
			[]workflow.Issue{{Code: "unknown_field", Path: "/author"}, {Code: "unknown_field", Path: "/version"}}},
		{"unknown retry field", `{"workflowName": "w", "steps": [` + step(`, "retry": {"maxAttempts": 2, "jitter": true}`) + `]}`, []workflow.Issue{{Code: "invalid_retry", Path: "/steps/0/retry/jitter"}}},
		{"unknown backoff", `{"workflowName": "w", "steps": [` + step(`, "retry": {"maxAttempts": 2, "backoff": "random"}`) + `]}`, []workflow.Issue{{Code: "invalid_retry", Path: "/steps/0/retry/backoff"}}},
		{"retry without maxAttempts", `{"workflowName": "w", "steps": [` + step(`, "retry": {"delayMs": 5}`) + `]}`, []workflow.Issue{{Code: "invalid_retry", Path: "/steps/0/retry/maxAttempts"}}},
		{"a workflow that is not an object", `["w"]`, []workflow.Issue{{Code: "workflow_validation", Path: ""}}},
		{"a step that is not an object", `{"workflowName": "w", "steps": [` + step("") + `, 7]}`, []workflow.Issue{{Code: "workflow_validation", Path: "/steps/1"}}},
		{"a reference naming no step", `{"workflowName": "w", "steps": [` + step("") + `, {"id": "b", "action": "delivery.dryRunRetry", "input": {"x": {"$fromStep": "", "path": ""}}}]}`,
			[]workflow.Issue{{Code: "unsupported_input_value", Path: "/steps/1/input/x"}}},
		// Attack A43-6: a step's whole input that is a reference is one,
		// checked like any other (and a dependency of the step).
		{"a whole input that is a reference with another key and no path", `{"workflowName": "w", "steps": [` + step("") + `, {"id": "b", "action": "delivery.dryRunRetry", "input": {"$fromStep": false, "got": {"$fromStep": "jobs", "path": ""}}}]}`,
			[]workflow.Issue{{Code: "unsupported_input_value", Path: "/steps/1/input"}, {Code: "unsupported_input_value", Path: "/steps/1/input/got"}, {Code: "invalid_step_reference", Path: "/steps/1/input/path"}}},
		{"a whole input that is a reference to a later step", `{"workflowName": "w", "steps": [{"id": "a", "action": "delivery.dryRunRetry", "input": {"$fromStep": "b", "path": ""}}, {"id": "b", "action": "delivery.searchJobs", "input": {}}]}`,
			[]workflow.Issue{{Code: "invalid_step_reference", Path: "/steps/0/input/$fromStep"}}},
		{"a reference deep in arrays and objects", `{"workflowName": "w", "steps": [` + step("") + `, {"id": "b", "action": "delivery.dryRunRetry", "input": {"x": [{"y": {"$fromStep": "nope", "path": ""}}]}}]}`,
			[]workflow.Issue{{Code: "invalid_step_reference", Path: "/steps/1/input/x/0/y/$fromStep"}}},
		{"every issue at once, shape and meaning, in path order", `{"workflowName": "w w", "steps": [{"id": "a", "action": "nope.missing", "input": {}, "timeoutMs": -1}, {"id": "a", "action": "delivery.searchJobs", "input": {"x": {"$fromStep": "c", "path": "/"}}, "retry": {"maxAttempts": 99}}, {"id": "c", "action": "delivery.searchJobs", "input": {}}]}`,
			[]workflow.Issue{{Code: "action_not_found", Path: "/steps/0/action"}, {Code: "invalid_timeout", Path: "/steps/0/timeoutMs"},
				{Code: "duplicate_step", Path: "/steps/1/id"}, {Code: "invalid_step_reference", Path: "/steps/1/input/x/$fromStep"},
				{Code: "invalid_retry", Path: "/steps/1/retry/maxAttempts"}, {Code: "invalid_workflow_name", Path: "/workflowName"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var doc any
			require.NoError(t, json.Unmarshal([]byte(c.doc), &doc))
			got := workflow.Validate(doc, catalog)
			var slim []workflow.Issue
			for _, is := range got {
				assert.NotEmpty(t, is.Message)
				slim = append(slim, workflow.Issue{Code: is.Code, Path: is.Path})
			}
			assert.Equal(t, c.want, slim)
		})
	}
}

func TestValidationWithoutACatalogSkipsActionChecks(t *testing.T) {
	var doc any
	require.NoError(t, json.Unmarshal([]byte(`{"workflowName": "w", "steps": [{"id": "a", "action": "not.known", "input": {}}]}`), &doc))
	assert.Empty(t, workflow.Validate(doc, nil))
}

func TestReferencesResolveByJSONPointer(t *testing.T) {
	s := workflow.Step{ID: "b", Input: map[string]any{"ids": map[string]any{"$fromStep": "a", "path": "/jobs/1/id"},
		"all": map[string]any{"$fromStep": "a", "path": ""}, "lit": 3.0}}
	out := map[string]any{"a": map[string]any{"jobs": []any{map[string]any{"id": "j0"}, map[string]any{"id": "j1"}}}}
	in, err := workflow.Resolve(s, out)
	require.NoError(t, err)
	assert.Equal(t, "j1", in["ids"])
	assert.Equal(t, out["a"], in["all"])
	assert.Equal(t, 3.0, in["lit"])
	assert.Equal(t, []string{"a"}, workflow.Dependencies(s))
	s.Input["bad"] = map[string]any{"$fromStep": "a", "path": "/nope"}
	_, err = workflow.Resolve(s, out)
	assert.ErrorContains(t, err, "invalid_step_reference")
}

func TestRetryDelays(t *testing.T) {
	fixed := &workflow.Retry{MaxAttempts: 4, DelayMs: 100}
	exp := &workflow.Retry{MaxAttempts: 4, DelayMs: 100, Backoff: "exponential"}
	assert.Equal(t, []int64{100, 100, 100}, []int64{fixed.Delay(2), fixed.Delay(3), fixed.Delay(4)})
	assert.Equal(t, []int64{100, 200, 400}, []int64{exp.Delay(2), exp.Delay(3), exp.Delay(4)})
	assert.Equal(t, 1, workflow.Step{}.Attempts())
}

// TestEveryIssueCodeIsDocumented: docs/events.md lists every issue code.
func TestEveryIssueCodeIsDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/events.md")
	require.NoError(t, err)
	for _, c := range workflow.IssueCodes {
		assert.Contains(t, string(b), "| `"+string(c)+"` |", "issue code %s", c)
	}
}

// FuzzValidate: any JSON document is answered with issues, each with a
// known code and a message, never a panic; a document with none parses.
func FuzzValidate(f *testing.F) {
	f.Add(`{"workflowName": "w", "steps": [{"id": "a", "action": "delivery.searchJobs", "input": {}}]}`)
	f.Add(`{"workflowName": "w", "steps": [{"id": "a", "action": "x.y", "input": {"k": [{"$fromStep": "a", "path": "/0"}]}, "retry": {"maxAttempts": 2}}]}`)
	f.Add(`{"steps": 3, "x": null}`)
	f.Add(`[1, {"$fromStep": 2}]`)
	f.Fuzz(func(t *testing.T, doc string) {
		var v any
		if json.Unmarshal([]byte(doc), &v) != nil {
			return
		}
		issues := workflow.Validate(v, catalog)
		for _, is := range issues {
			if !slices.Contains(workflow.IssueCodes, is.Code) && is.Code != actionbus.CodeWorkflowValidation {
				t.Fatalf("issue with an unknown code: %+v", is)
			}
			if is.Message == "" {
				t.Fatalf("issue without a message: %+v", is)
			}
		}
		if len(issues) == 0 {
			if _, err := workflow.Parse(v); err != nil {
				t.Fatalf("a valid workflow does not parse: %v", err)
			}
		}
	})
}
