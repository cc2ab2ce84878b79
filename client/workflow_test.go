package client_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/client"
)

func TestTheBuilderProducesTheSameJSONAsWrittenByHand(t *testing.T) {
	built := client.NewWorkflow("retry-failed-delivery-jobs").
		Step("jobs", "delivery.searchJobs", map[string]any{"status": []string{"FAILED"}},
			client.Timeout(1000), client.IdempotencyKey("search-failed:2026-05-06"), client.Retry(2, 50, false)).
		Step("dryRun", "delivery.dryRunRetry", map[string]any{"jobIds": client.FromStep("jobs", "/jobIds")}, client.ContinueOnError()).
		Build()
	byHand := `{
	  "workflowName": "retry-failed-delivery-jobs",
	  "steps": [
	    {"id": "jobs", "action": "delivery.searchJobs", "input": {"status": ["FAILED"]},
	     "timeoutMs": 1000, "idempotencyKey": "search-failed:2026-05-06", "retry": {"maxAttempts": 2, "delayMs": 50}},
	    {"id": "dryRun", "action": "delivery.dryRunRetry", "input": {"jobIds": {"$fromStep": "jobs", "path": "/jobIds"}}, "continueOnError": true}
	  ]
	}`
	b, err := json.Marshal(built)
	require.NoError(t, err)
	assert.JSONEq(t, byHand, string(b))
	// The same document written as a typed literal.
	literal := &client.Workflow{WorkflowName: "retry-failed-delivery-jobs", Steps: []client.WorkflowStep{
		{ID: "jobs", Action: "delivery.searchJobs", Input: map[string]any{"status": []string{"FAILED"}},
			TimeoutMs: 1000, IdempotencyKey: "search-failed:2026-05-06", Retry: &client.WorkflowRetry{MaxAttempts: 2, DelayMs: 50}},
		{ID: "dryRun", Action: "delivery.dryRunRetry", Input: map[string]any{"jobIds": client.StepRef{FromStep: "jobs", Path: "/jobIds"}}, ContinueOnError: true},
	}}
	assert.Equal(t, literal, built)
}
