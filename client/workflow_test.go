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
	var byHand map[string]any
	require.NoError(t, json.Unmarshal([]byte(`{
	  "workflowName": "retry-failed-delivery-jobs",
	  "steps": [
	    {"id": "jobs", "action": "delivery.searchJobs", "input": {"status": ["FAILED"]},
	     "timeoutMs": 1000, "idempotencyKey": "search-failed:2026-05-06", "retry": {"maxAttempts": 2, "delayMs": 50}},
	    {"id": "dryRun", "action": "delivery.dryRunRetry", "input": {"jobIds": {"$fromStep": "jobs", "path": "/jobIds"}}, "continueOnError": true}
	  ]
	}`), &byHand))
	assert.Equal(t, byHand, built)
}
