package events_test

import (
	"os"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
)

func progressEvent(data string) *event.Event {
	e := event.New()
	e.SetID("1")
	e.SetSource("/test")
	e.SetType(events.TypeRunProgress)
	e.SetDataContentType(events.ContentTypeJSON)
	e.DataEncoded = []byte(data)
	return &e
}

// TestTheProgressSchemaTakesAListOfStepsOfVersion2: run.progress data is
// version 2, a run id and at least one step of run.step's shape; a
// version 1 body (one step) or anything else is refused.
func TestTheProgressSchemaTakesAListOfStepsOfVersion2(t *testing.T) {
	const run = `"runId":"01JDQ2Z7W4M3T2V9K8F6H5G4C3"`
	for _, tc := range []struct {
		name string
		data string
		ok   bool
	}{
		{"two steps", `{"version":2,` + run + `,"steps":[{` + run + `,"name":"act","cycle":1},{` + run + `,"name":"action-dispatched","cycle":1,"planIndex":0,"action":"echo"}]}`, true},
		{"one step", `{"version":2,` + run + `,"steps":[{` + run + `,"name":"final","cycle":2,"status":"ok"}]}`, true},
		{"version 1: one step as the data", `{` + run + `,"name":"act","cycle":1}`, false},
		{"another version", `{"version":3,` + run + `,"steps":[{` + run + `,"name":"act","cycle":1}]}`, false},
		{"no steps", `{"version":2,` + run + `,"steps":[]}`, false},
		{"a step without a name", `{"version":2,` + run + `,"steps":[{` + run + `,"cycle":1}]}`, false},
		{"a step with a field run.step does not have", `{"version":2,` + run + `,"steps":[{` + run + `,"name":"act","cycle":1,"x":1}]}`, false},
		{"a field of its own", `{"version":2,` + run + `,"steps":[{` + run + `,"name":"act","cycle":1}],"x":1}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := events.Validate(progressEvent(tc.data))
			if tc.ok {
				assert.NoError(t, err)
			} else {
				assert.Equal(t, actionbus.CodeSchemaValidation, actionbus.CodeOf(err), "%v", err)
			}
		})
	}
}

// TestTheProgressSampleInTheDocsIsValid: the run.progress sample of
// docs/events.md is valid against schemas/run.progress.json.
func TestTheProgressSampleInTheDocsIsValid(t *testing.T) {
	b, err := os.ReadFile("../docs/events.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(b), "A **`run.progress` carries the live steps of one transition**")
	require.True(t, ok, "docs/events.md describes run.progress")
	_, rest, ok = strings.Cut(rest, "```json\n")
	require.True(t, ok, "with a sample")
	sample, _, ok := strings.Cut(rest, "```")
	require.True(t, ok)
	assert.NoError(t, events.Validate(progressEvent(sample)))
}
