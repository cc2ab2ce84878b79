package dispatch_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// TestACancelInputOrApprovalAnswerForAnUnknownRunIsRejectedOnce: a cancel, an input or
// an approval's answer for a run that was never requested is rejected
// once, run_not_found, and
// its message is settled: it is not redelivered (it used to be, until its
// deliveries ran out, about nine minutes).
func TestACancelInputOrApprovalAnswerForAnUnknownRunIsRejectedOnce(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{NoPlanner: true})
	rec := srv.Record(t, "")
	ctx := ctxT(t)
	for _, tc := range []struct {
		verb, eventType string
		send            func(runID string) error
	}{
		{"cancel", events.TypeCancelRequested, func(runID string) error { return st.Client.Cancel(ctx, runID, "test") }},
		{"input", events.TypeInputProvided, func(runID string) error { return st.Client.Input(ctx, runID, "yes") }},
		{"approve", events.TypeApprovalGranted, func(runID string) error {
			// A grant as any approver publishes it (client.Approve looks
			// the approval up first, and would not send it).
			_, err := srv.JS.PublishMsg(ctx, &nats.Msg{
				Subject: "ab.run.default." + runID + ".approve",
				Header: nats.Header{"ce-specversion": {"1.0"}, "ce-id": {events.NewID()}, "ce-source": {"/approver"},
					"ce-type": {events.TypeApprovalGranted}, "ce-datacontenttype": {"application/json"}, "ce-runid": {runID}, "ce-tenant": {"default"}},
				Data: []byte(`{"runId":"` + runID + `","approvalId":"` + runID + `-1-0","token":"k1.AAAA"}`),
			})
			return err
		}},
	} {
		t.Run(tc.verb, func(t *testing.T) {
			runID := events.NewID()
			require.NoError(t, tc.send(runID))
			rejected := func(r actionbustest.Recorded) bool {
				var rej events.EventRejected
				return r.Type() == events.TypeEventRejected && json.Unmarshal(r.Event.Data(), &rej) == nil && rej.RunID == runID
			}
			got := rec.WaitFor(t, 10*time.Second, rejected)
			var rej events.EventRejected
			require.NoError(t, json.Unmarshal(got.Event.Data(), &rej))
			assert.Equal(t, actionbus.CodeRunNotFound, rej.Reason.Code)
			assert.Equal(t, "tenant default has no run "+runID, rej.Reason.Message, "the answer for no run (run.NoRun)")
			assert.Equal(t, []string{tc.eventType}, rej.OriginalHeaders["ce-type"], "the rejection keeps what was rejected")
			assert.Equal(t, "ab.run.default."+runID+"."+tc.verb, rej.OriginalSubject)

			// Settled: nothing of the requests consumer is pending or was
			// redelivered, and the rejection stays the only one.
			cons, err := srv.JS.Consumer(ctx, bus.Topology{}.StreamRequests(), bus.PartitionConsumer(bus.ConsumerDispatcherRequests, 0))
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				info, err := cons.Info(ctx)
				return err == nil && info.NumAckPending == 0 && info.NumPending == 0
			}, 5*time.Second, 20*time.Millisecond)
			info, err := cons.Info(ctx)
			require.NoError(t, err)
			assert.Zero(t, info.NumRedelivered, "the message must not be redelivered")
			assert.Equal(t, 1, rec.Count(rejected))
		})
	}
	// No run came of either.
	assert.Zero(t, rec.Count(func(r actionbustest.Recorded) bool {
		return r.Type() == events.TypeRunFailed || r.Type() == events.TypeRunCanceled
	}))
}
