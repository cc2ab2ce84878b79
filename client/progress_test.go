package client

import (
	"encoding/json"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

const progressRun = "01JDQ2Z7W4M3T2V9K8F6H5G4C3"

// receivedProgress decodes a run.progress message whose data is body, as a
// follower's bus does (the dispatcher's events are not checked against
// their schema by their readers).
func receivedProgress(id string, body []byte) (*events.Received, bool) {
	subject := "ab.run.default." + progressRun + ".progress"
	h := nats.Header{"ce-specversion": {"1.0"}, "ce-id": {id}, "ce-source": {"/dispatcher"}, "ce-type": {events.TypeRunProgress},
		"ce-datacontenttype": {"application/json"}, "ce-runid": {progressRun}, "ce-tenant": {"default"}}
	e, err := bus.Decode(subject, h, body)
	if err != nil {
		return nil, false
	}
	var p events.RunProgress
	if events.DataAs(e, &p) != nil {
		return nil, false
	}
	return &events.Received{Event: e, Data: &p, Subject: subject, Tenant: "default"}, true
}

func names(t testing.TB, evs []Event) (ids, steps []string) {
	for _, e := range evs {
		s, ok := e.Step()
		require.True(t, ok, "each event is one step: %s", e.Data)
		ids, steps = append(ids, e.ID), append(steps, s.Name)
	}
	return ids, steps
}

func TestAProgressEventIsDeliveredAsOneEventPerStepInOrder(t *testing.T) {
	for _, tc := range []struct {
		name      string
		body      string
		wantIDs   []string
		wantSteps []string
	}{
		{"version 2, several steps: one event each, numbered",
			`{"version":2,"runId":"` + progressRun + `","steps":[{"runId":"` + progressRun + `","name":"observe","cycle":1},` +
				`{"runId":"` + progressRun + `","name":"act","cycle":1},{"runId":"` + progressRun + `","name":"action-dispatched","cycle":1,"action":"echo"}]}`,
			[]string{"E#1", "E#2", "E#3"}, []string{"observe", "act", "action-dispatched"}},
		{"version 2, one step: the message's id",
			`{"version":2,"runId":"` + progressRun + `","steps":[{"runId":"` + progressRun + `","name":"final","cycle":2}]}`,
			[]string{"E"}, []string{"final"}},
		{"version 1 (one step, no version): read as one step",
			`{"runId":"` + progressRun + `","name":"decide","cycle":1}`,
			[]string{"E"}, []string{"decide"}},
		{"a version this client does not know: nothing", `{"version":3,"runId":"` + progressRun + `","steps":[]}`, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := receivedProgress("E", []byte(tc.body))
			require.True(t, ok)
			ids, steps := names(t, eventsOf(r, progressRun))
			assert.Equal(t, tc.wantIDs, ids)
			assert.Equal(t, tc.wantSteps, steps)
		})
	}
}

// FuzzProgressEvents: whatever a run.progress message carries, a follower
// does not panic, and every event it delivers is one named step.
func FuzzProgressEvents(f *testing.F) {
	f.Add([]byte(`{"version":2,"runId":"` + progressRun + `","steps":[{"runId":"` + progressRun + `","name":"observe","cycle":1}]}`))
	f.Add([]byte(`{"runId":"` + progressRun + `","name":"decide","cycle":1}`))
	f.Add([]byte(`{"version":2,"steps":null}`))
	f.Add([]byte(`{"version":0,"steps":[{"name":"x"}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, ok := receivedProgress("E", body)
		if !ok {
			return
		}
		for _, e := range eventsOf(r, progressRun) {
			var s Step
			if err := json.Unmarshal(e.Data, &s); err != nil {
				t.Fatalf("an event that is not a step: %s", e.Data)
			}
			assert.Equal(t, events.TypeRunProgress, e.Type)
		}
	})
}
