package audit_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/audit"
	"github.com/actionbus/actionbus/internal/bus"
)

const echoScenario = `
scenarios:
  echo:
    decisions:
      - {type: action, name: t.echo, args: {}}
      - {type: final, answer: ok}
`

// resultRecords returns the run's records of executor results.
func resultRecords(recs []client.AuditRecord) []client.AuditRecord {
	var out []client.AuditRecord
	for _, r := range recs {
		if r.EventType == events.TypeActionCompleted || r.EventType == events.TypeActionFailed {
			out = append(out, r)
		}
	}
	return out
}

// Issue 36, item 8: two forged results for a call that was answered leave
// one outcome record (the first result) and one duplicate record each,
// named forgeries; the chain still verifies.
func TestForgedResultsOfACallAreAuditedAsDuplicates(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	runs := srv.Record(t, "ab.run.>")
	st := srv.StartStack(t, actionbustest.StackOptions{Scenarios: echoScenario, Register: registerEcho})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "echo"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status)
	var done events.ActionCompleted
	runs.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
		return r.Event != nil && r.Type() == events.TypeActionCompleted && events.DataAs(r.Event, &done) == nil && done.RunID == res.RunID
	})

	forgeResults(ctx, t, srv, done, map[string]any{"forged": true}, 2)
	recs := waitForResults(ctx, t, st, res.RunID, 3)
	results := resultRecords(recs)
	assert.Equal(t, "succeeded", results[0].Status)
	assert.Equal(t, events.ResultID(done.CallID, done.Attempt), results[0].EventID, "the outcome is the executor's result")
	for _, r := range results[1:] {
		assert.Equal(t, audit.StatusDuplicate, r.Status)
		assert.Equal(t, audit.DuplicateForgery, r.Duplicate)
		assert.Equal(t, results[0].EventID, r.DuplicateOf)
	}
	v := audit.Check(recs, st.AuditorKey)
	assert.Nil(t, v.Broken, "%+v", v.Broken)
}

// Issue 36, item 8: a call answered again after its outcome was recorded
// (a redispatched request's answer, stored again past the stream's
// duplicate window) is one duplicate record, named a redispatch, not a
// second outcome after the run's end, even when the auditor restarted in
// between and knows the chain only from the stream.
func TestAResultAnsweredAgainIsAuditedOnceAsADuplicate(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	runs := srv.Record(t, "ab.run.>")
	st := srv.StartStack(t, actionbustest.StackOptions{Scenarios: echoScenario, Register: registerEcho, NoAuditor: true})
	seed, pub := seed(t)
	// One record per append: the chain's last message is not the result's.
	stop := startAuditor(t, srv, audit.Config{MaxBatch: 1, Seed: seed})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "echo"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status)
	result := runs.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
		return r.Event != nil && r.Type() == events.TypeActionCompleted && r.Subject == "ab.run.default."+res.RunID+".result"
	})
	var recs []client.AuditRecord
	require.Eventually(t, func() bool {
		recs, err = st.Client.AuditRecords(ctx, res.RunID)
		return err == nil && audit.HasTerminal(recs) && len(resultRecords(recs)) == 1
	}, 20*time.Second, 20*time.Millisecond)
	stop()
	startAuditor(t, srv, audit.Config{MaxBatch: 1, Seed: seed})

	// The executor's answer again, under its own event id; only the
	// message id differs, as for a copy stored past the duplicate window.
	again := nats.NewMsg(result.Subject)
	again.Data = result.Data
	for k, v := range result.Header {
		again.Header[k] = v
	}
	again.Header.Set(nats.MsgIdHdr, "past-the-window")
	ack, err := srv.JS.PublishMsg(ctx, again)
	require.NoError(t, err)
	require.False(t, ack.Duplicate)

	require.Eventually(t, func() bool {
		recs, err = st.Client.AuditRecords(ctx, res.RunID)
		return err == nil && len(resultRecords(recs)) == 2
	}, 20*time.Second, 20*time.Millisecond)
	results := resultRecords(recs)
	require.Len(t, results, 2)
	assert.Equal(t, "succeeded", results[0].Status)
	assert.Equal(t, audit.StatusDuplicate, results[1].Status, "one outcome record per call")
	assert.Equal(t, audit.DuplicateRedispatch, results[1].Duplicate)
	assert.Equal(t, results[0].EventID, results[1].DuplicateOf)
	v := audit.Check(recs, pub)
	assert.Nil(t, v.Broken, "%+v", v.Broken)
}

// forgeResults publishes n results of the call done answers, with output,
// under fresh ids, as a user that may publish results (an executor) can.
func forgeResults(ctx context.Context, t *testing.T, srv *actionbustest.Server, done events.ActionCompleted, output any, n int) {
	t.Helper()
	forger, err := bus.Open(srv.Connect(t), bus.BusConfig{Source: "/forger"})
	require.NoError(t, err)
	forged := done
	forged.Output = output
	for range n {
		_, err := forger.Emit(ctx, events.TypeActionCompleted, events.NewID(), events.DefaultTenant, done.RunID, "", &forged)
		require.NoError(t, err)
	}
}

// waitForResults waits until the run's chain holds n result records of
// its calls and returns the run's records.
func waitForResults(ctx context.Context, t *testing.T, st *actionbustest.Stack, runID string, n int) []client.AuditRecord {
	t.Helper()
	var recs []client.AuditRecord
	require.Eventually(t, func() bool {
		var err error
		recs, err = st.Client.AuditRecords(ctx, runID)
		return err == nil && len(resultRecords(recs)) == n
	}, 30*time.Second, 50*time.Millisecond, "the run's chain holds %d results", n)
	return recs
}
