package dispatch_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/run"
)

// TestARepairFindsTheEventsThatEndedARunWhereTheyAreStored: a client
// stores, before it requests its run, a cancel whose id it reuses later
// for the cancel that ends the run (another Nats-Msg-Id keeps both). The
// early one is rejected (the run does not exist yet) but stays in the
// requests stream, valid, of the same type and id. The dispatcher crashes
// after publishing the run's end; a repair from the log must apply the
// cancel that ended the run — the one at the position the end names —
// not the earlier one, which would end the copy otherwise and have the
// end adopted on the state as read (dropping, with a result in the same
// transition, a call's success that a retry would then run again).
func TestARepairFindsTheEventsThatEndedARunWhereTheyAreStored(t *testing.T) {
	_, rec, g, ops, st, js, d, asRead := grantAndCancelSetup(t)
	runID, cancelID := events.NewID(), events.NewID()
	cancel := func(msgID, reason string) *nats.Msg {
		return &nats.Msg{Subject: "ab.run.default." + runID + ".cancel",
			Header: nats.Header{"ce-specversion": {"1.0"}, "ce-id": {cancelID}, "ce-source": {"/client"},
				"ce-type": {events.TypeCancelRequested}, "ce-datacontenttype": {"application/json"},
				"ce-runid": {runID}, "ce-tenant": {"default"}, "Nats-Msg-Id": {msgID}},
			Data: []byte(`{"runId":"` + runID + `","reason":"` + reason + `","requestedBy":"client"}`)}
	}
	_, err := js.PublishMsg(ctxT(t), cancel("early", "early"))
	require.NoError(t, err)
	rec.WaitFor(t, 10*time.Second, func(r actionbustest.Recorded) bool {
		return r.Type() == events.TypeEventRejected && r.Subject == "ab.rejected.AB_REQUESTS"
	})

	wf := client.NewWorkflow("grant").
		Step("wait", "gate.wait", map[string]any{}).
		Step("restart", "ops.restart", map[string]any{"service": "api"}).
		Build()
	_, err = st.Client.Start(ctxT(t), client.RunRequest{RunID: runID, UserID: "operator_1", AllowedModes: []string{"read", "mutate"}, Workflow: wf})
	require.NoError(t, err)
	awaitingApproval(t, rec, runID)
	g.awaitStarted(t)
	_, err = js.PublishMsg(ctxT(t), cancel("late", "operator"))
	require.NoError(t, err)
	res, err := st.Client.Wait(ctxT(t), runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCanceled, res.Status)
	var before run.State
	select {
	case before = <-asRead:
	case <-ctxT(t).Done():
		t.Fatal("the dispatcher did not crash after the end")
	}
	endedBy := storedEndedBy(t, js, runID)
	require.Contains(t, endedBy, events.TypeCancelRequested+" "+cancelID+" AB_REQUESTS:", "the end names the cancel by its type, id and position")
	end := &run.Terminal{Type: events.TypeRunCanceled, Reason: "operator"}
	rebuilt, kept := dispatch.Recompute(ctxT(t), d, &before, end, endedBy, nil, events.DefaultTenant)
	require.True(t, kept, "an earlier stored cancel of the same type and id stood in for the one that ended the run (%s)", endedBy)
	assert.Equal(t, run.StatusCanceled, rebuilt.Status)
	assert.Equal(t, "operator", rebuilt.Terminal.Reason)
	assert.Empty(t, ops.ran(), "the mutation waiting for its approval never ran")
}
