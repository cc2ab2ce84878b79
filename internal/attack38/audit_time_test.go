package attack38_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/audit"
	"github.com/actionbus/actionbus/internal/events"
)

// outOfRangeTime is a valid RFC 3339 time (a year of four digits, an
// offset under 24 hours) that is in the year 10000 in UTC: the auditor
// records event times in UTC, and a time.Time past 9999 has no JSON
// encoding, so neither the record nor its stripped form can be sealed
// or stored.
const outOfRangeTime = "9999-12-31T23:59:59-23:59"

// TestAttack38_ExecutorErasesARunsAuditWithAnOutOfRangeEventTime: the
// deployed executor user, while it runs a call, publishes an
// event.rejected (it may publish on ab.rejected.>) naming its run, with a
// ce-time that is year 10000 in UTC. The auditor batches its record with
// the run's own records (the call's result, the run's end); the append
// fails for good (no JSON encoding), each record alone too, the stripped
// record too (Stripped keeps EventTime), and every record of the batch is
// then acknowledged unstored. Safe: every stored event of the run,
// the forged one included, has its record, and the run's end is audited.
func TestAttack38_ExecutorErasesARunsAuditWithAnOutOfRangeEventTime(t *testing.T) {
	srv := operatorServer(t, 0)
	exec := srv.ServiceConnect(t, "executor")
	forger, err := events.Open(exec, events.BusConfig{Source: "/executor"})
	require.NoError(t, err)
	subjects := events.MustSubjects(srv.Prefix)
	forgedID := events.NewID()
	st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "page.render", Description: "Render a page."},
			func(ctx context.Context, _ struct{}, c executor.Call) (executor.Result[string], error) {
				rej := &events.EventRejected{Reason: *actionbus.Errorf(actionbus.CodeSchemaValidation, "bad"), RunID: c.RunID,
					OriginalSubject: subjects.Run(events.DefaultTenant, c.RunID, "result"), Consumer: "dispatcher"}
				e, err := forger.New(events.TypeEventRejected, forgedID, "", c.RunID, rej)
				if err != nil {
					return executor.Result[string]{}, err
				}
				publishRaw(ctx, t, exec, subjects.Rejected("AB_RUNS"), e, func(m *nats.Msg) { m.Header.Set("ce-time", outOfRangeTime) })
				return executor.Result[string]{Output: "<p>"}, nil
			})
	}})
	ctx := ctxFor(t, 90*time.Second)
	res, err := st.Client.Run(ctx, client.RunRequest{UserID: "ada", Action: &client.ActionCall{Name: "page.render", Args: map[string]any{}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	require.Equal(t, 1, srv.Stored(t, "AB_REJECTED", ">"), "the forged rejection is stored")

	var recs []client.AuditRecord
	ok := assert.Eventually(t, func() bool {
		recs, err = st.Client.AuditRecords(ctx, res.RunID)
		return err == nil && audit.HasTerminal(recs) && hasEvent(recs, forgedID)
	}, 20*time.Second, 100*time.Millisecond, "every stored event of the run has its record, the run's end too")
	if !ok {
		t.Logf("records of run %s: %d, terminal %v, forged %v", res.RunID, len(recs), audit.HasTerminal(recs), hasEvent(recs, forgedID))
		for _, r := range recs {
			t.Logf("  %s %s %s", r.EventType, r.Kind, r.Status)
		}
	}
}

func hasEvent(recs []client.AuditRecord, id string) bool {
	for _, r := range recs {
		if r.EventID == id {
			return true
		}
	}
	return false
}
