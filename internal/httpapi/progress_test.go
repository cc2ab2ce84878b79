package httpapi_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/events"
)

// TestTheEventStreamShowsEveryStepOfEachProgressMessageInOrder: a run's
// event stream (GET /v1/runs/{id}/events) has one run.progress event per
// step, in order, although each transition's live steps crossed the
// server as one message.
func TestTheEventStreamShowsEveryStepOfEachProgressMessageInOrder(t *testing.T) {
	a := newAPI(t)
	runID := a.start(map[string]any{"prompt": "paint it", "scenario": "ask"})
	a.waitForRun(func(r map[string]any) bool { return r["runId"] == runID && r["status"] == "awaiting_input" }, nil)
	rec := a.srv.Record(t, "ab.run.default."+runID+".>")
	// Following (its subscription in place once the first stored event is
	// sent), the run is answered: what follows is live.
	answered := false
	var streamed []string
	a.events("/v1/runs/"+runID+"/events", "reader", func(event string, data map[string]any) bool {
		if !answered {
			answered = true
			status, body := a.do(http.MethodPost, "/v1/runs/"+runID+"/input", "runner", map[string]any{"answer": "blue"})
			require.Equal(t, http.StatusAccepted, status, body)
		}
		if event == "run.progress" {
			step, _ := data["data"].(map[string]any)
			streamed = append(streamed, step["name"].(string))
		}
		return event == "end"
	})
	rec.WaitForType(t, 0, events.TypeRunCompleted, runID)
	var carried []string
	messages := 0
	for _, r := range rec.All() {
		if r.Type() != events.TypeRunProgress {
			continue
		}
		var p events.RunProgress
		require.NoError(t, events.DataAs(r.Event, &p))
		messages++
		for _, s := range p.Steps {
			carried = append(carried, s.Name)
		}
	}
	t.Logf("%d messages carried %q", messages, carried)
	require.Less(t, messages, len(carried), "a message carried several steps")
	assert.Equal(t, carried, streamed, "the stream shows every step, in order")
}
