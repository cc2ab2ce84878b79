package conformance

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/events"
)

// failure decodes an action.failed from its JSON, as the kit reads one.
func failure(t *testing.T, data string) *result {
	t.Helper()
	var f events.ActionFailed
	require.NoError(t, json.Unmarshal([]byte(data), &f))
	return &result{failed: &f}
}

// The details.issues checks pass the Go executor's answers (docs/protocol.md's
// shapes) and fail the shapes the TypeScript executor had before: reason
// invalid, a missing property keyed at its object, no output issues, a
// value repeated.
func TestTheIssueChecksTellTheProtocolsShapesFromOthers(t *testing.T) {
	goMissing := `{"error":{"code":"action_args_invalid","message":"arguments of conformance.echo are invalid: /text: missing required property",
		"details":{"actionName":"conformance.echo","key":"/text","reason":"missing","error":"missing required property",
		"issues":[{"actionName":"conformance.echo","key":"/text","reason":"missing","error":"missing required property"}]}}}`
	assert.NoError(t, checkMissing(failure(t, goMissing)))
	tsMissing := `{"error":{"code":"action_args_invalid","message":"arguments of conformance.echo are invalid: /: must have required property 'text'",
		"details":{"actionName":"conformance.echo","key":"","reason":"invalid","error":"must have required property 'text'",
		"issues":[{"actionName":"conformance.echo","key":"","reason":"invalid","error":"must have required property 'text'"}]}}}`
	assert.ErrorContains(t, checkMissing(failure(t, tsMissing)), `expected an issue with key "/text"`)
	noTop := `{"error":{"code":"action_args_invalid","message":"m","details":{"actionName":"conformance.echo",
		"issues":[{"actionName":"conformance.echo","key":"/text","reason":"missing","error":"missing required property"}]}}}`
	assert.ErrorContains(t, checkMissing(failure(t, noTop)), "to repeat the first issue's")

	goType := `{"error":{"code":"action_args_invalid","message":"arguments of conformance.echo are invalid: /text: must be of type string, got number",
		"details":{"actionName":"conformance.echo","key":"/text","reason":"type","error":"must be of type string, got number",
		"issues":[{"actionName":"conformance.echo","key":"/text","reason":"type","error":"must be of type string, got number"}]}}}`
	assert.NoError(t, checkType(failure(t, goType)))
	tsType := `{"error":{"code":"action_args_invalid","message":"arguments of conformance.echo are invalid: /text: must be string",
		"details":{"actionName":"conformance.echo","key":"/text","reason":"invalid","error":"must be string",
		"issues":[{"actionName":"conformance.echo","key":"/text","reason":"invalid","error":"must be string"}]}}}`
	assert.ErrorContains(t, checkType(failure(t, tsType)), `reason "type"`)
	echoed := `{"error":{"code":"action_args_invalid","message":"arguments of conformance.echo are invalid: /text: 918273645 is no string",
		"details":{"actionName":"conformance.echo","key":"/text","reason":"type","error":"918273645 is no string",
		"issues":[{"actionName":"conformance.echo","key":"/text","reason":"type","error":"918273645 is no string"}]}}}`
	assert.ErrorContains(t, checkType(failure(t, echoed)), "never the rejected value")

	goOutput := `{"error":{"code":"schema_validation","message":"/count: missing required property; /name: must be of type string, got number",
		"details":{"issues":[{"path":"/count","keyword":"required","reason":"missing required property"},
		{"path":"/name","keyword":"type","reason":"must be of type string, got number"}]}}}`
	assert.NoError(t, checkOutputIssues(failure(t, goOutput)))
	tsOutput := `{"error":{"code":"schema_validation","message":"output of conformance.shape does not fit its output schema: /: must have required property 'count'; /name: must be string"}}`
	assert.ErrorContains(t, checkOutputIssues(failure(t, tsOutput)), "expected details.issues")
	unsorted := `{"error":{"code":"schema_validation","message":"m",
		"details":{"issues":[{"path":"/name","keyword":"type","reason":"must be of type string, got number"},
		{"path":"/count","keyword":"required","reason":"missing required property"}]}}}`
	assert.ErrorContains(t, checkOutputIssues(failure(t, unsorted)), "sorted by path")
}
