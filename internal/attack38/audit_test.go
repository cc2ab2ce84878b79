package attack38_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/audit"
	"github.com/actionbus/actionbus/internal/bus"
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
// then acknowledged unstored. Safe: an event time no record can hold is
// malformed (events.CheckEnvelope), so the forgery is rejected in turn,
// and the run's chain is whole: its call's records and its end.
func TestAttack38_ExecutorErasesARunsAuditWithAnOutOfRangeEventTime(t *testing.T) {
	srv := operatorServer(t, 0)
	exec := srv.ServiceConnect(t, "executor")
	forger, err := bus.Open(exec, bus.BusConfig{Source: "/executor"})
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
				if _, err := tryPublishRaw(ctx, exec, subjects.Rejected("AB_RUNS"), e, func(m *nats.Msg) { m.Header.Set("ce-time", outOfRangeTime) }); err != nil {
					return executor.Result[string]{}, err
				}
				return executor.Result[string]{Output: "<p>"}, nil
			})
	}})
	ctx := ctxFor(t, 90*time.Second)
	res, err := st.Client.Run(ctx, client.RunRequest{UserID: "ada", Action: &client.ActionCall{Name: "page.render", Args: map[string]any{}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	require.Eventually(t, func() bool { return srv.Stored(t, "AB_REJECTED", ">") == 2 }, 20*time.Second, 50*time.Millisecond,
		"the forged rejection is stored, and rejected as malformed")

	var recs []client.AuditRecord
	ok := assert.Eventually(t, func() bool {
		recs, err = st.Client.AuditRecords(ctx, res.RunID)
		return err == nil && audit.HasTerminal(recs) && hasKind(recs, audit.KindAction, "succeeded")
	}, 20*time.Second, 100*time.Millisecond, "the run's call and its end are audited")
	if !ok {
		t.Logf("records of run %s: %d, terminal %v, forged %v", res.RunID, len(recs), audit.HasTerminal(recs), hasEvent(recs, forgedID))
		for _, r := range recs {
			t.Logf("  %s %s %s", r.EventType, r.Kind, r.Status)
		}
	}
}

func hasKind(recs []client.AuditRecord, kind, status string) bool {
	for _, r := range recs {
		if r.Kind == kind && r.Status == status {
			return true
		}
	}
	return false
}

func hasEvent(recs []client.AuditRecord, id string) bool {
	for _, r := range recs {
		if r.EventID == id {
			return true
		}
	}
	return false
}

// TestAttack38_TenantClientRunsUnauditedWithAnOutOfRangeEventTime: the
// least trusted party does the same to its own run. A tenant's NATS
// client publishes its run.requested with a ce-time that is year 10000
// in UTC; the ingress carries every ce- header into the stored request,
// the dispatcher runs it (the action runs, its effect happens), and the
// auditor's first append of the run — the request's record with the
// records batched with it — can be encoded neither together, nor alone,
// nor stripped, so it is acknowledged unstored. Safe: a time no record
// can hold makes the request malformed (events.CheckEnvelope): it is
// rejected, its run fails without running anything, and the run's chain
// holds the rejection and the run's end.
func TestAttack38_TenantClientRunsUnauditedWithAnOutOfRangeEventTime(t *testing.T) {
	srv := operatorServer(t, 0)
	const tenant = "acme"
	nc := srv.TenantAdd(t, tenant, actionbustest.TenantLimits{})
	runs := srv.Record(t, srv.Prefix+".run.>")
	var effects atomic.Int32
	srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "payments.refund", Description: "Refund a payment."},
			func(context.Context, struct{}, executor.Call) (executor.Result[string], error) {
				effects.Add(1)
				return executor.Result[string]{Output: "refunded"}, nil
			})
	}})
	ctx := ctxFor(t, 90*time.Second)
	bus, err := bus.Open(nc, bus.BusConfig{Source: "/client"})
	require.NoError(t, err)
	runID := events.NewID()
	e, err := bus.New(events.TypeRunRequested, runID, tenant, runID, &events.RunRequested{RunID: runID, UserID: "ada",
		Action: &events.ActionCall{Name: "payments.refund", Args: map[string]any{}}})
	require.NoError(t, err)
	publishRaw(ctx, t, nc, events.MustSubjects(srv.Prefix).Run(tenant, runID, "requested"), e,
		func(m *nats.Msg) { m.Header.Set("ce-time", outOfRangeTime) })
	runs.WaitForType(t, 30*time.Second, events.TypeRunFailed, runID)
	require.Zero(t, effects.Load(), "the malformed request ran nothing")

	c, err := client.New(nc, client.Options{Prefix: srv.Prefix, Tenant: tenant})
	require.NoError(t, err)
	var recs []client.AuditRecord
	ok := assert.Eventually(t, func() bool {
		recs, err = c.AuditRecords(ctx, runID)
		return err == nil && audit.HasTerminal(recs) && hasKind(recs, audit.KindRejected, "rejected")
	}, 20*time.Second, 100*time.Millisecond, "the request's rejection and the run's end are audited")
	if !ok {
		t.Logf("records of run %s: %d (err %v)", runID, len(recs), err)
		for _, r := range recs {
			t.Logf("  %s %s %s", r.EventType, r.Kind, r.Status)
		}
	}
}

// TestAttack38_ExecutorHoldsTheAuditorWithARejectionOfADottedTenant: row
// 86 keeps a rejection's run id from naming an audit subject, but not its
// tenant. An event.rejected is bound to no tenant by its subject
// (ab.rejected.<stream>), so its tenant extension is checked by no one;
// the auditor takes the record's tenant from the original subject only
// when that names a valid tenant, else from the extension. The deployed
// executor user publishes an event.rejected whose original subject names
// no run and whose ce-tenant is "x.y": the record's audit subject is
// ab.audit.x.y.norun.records, which the auditor may not publish, so its
// append fails for ever and the auditor, which acknowledges by position,
// acknowledges no later rejection. Safe: the auditor acknowledges it, and
// the rejections after it.
func TestAttack38_ExecutorHoldsTheAuditorWithARejectionOfADottedTenant(t *testing.T) {
	srv := operatorServer(t, 0)
	srv.StartStack(t, actionbustest.StackOptions{})
	exec := srv.ServiceConnect(t, "executor")
	forger, err := bus.Open(exec, bus.BusConfig{Source: "/executor"})
	require.NoError(t, err)
	ctx := ctxFor(t, 60*time.Second)
	subjects := events.MustSubjects(srv.Prefix)
	rej := &events.EventRejected{Reason: *actionbus.Errorf(actionbus.CodeSchemaValidation, "bad"), OriginalSubject: "nowhere", Consumer: "dispatcher"}
	e, err := forger.New(events.TypeEventRejected, events.NewID(), "", "", rej)
	require.NoError(t, err)
	ack := publishRaw(ctx, t, exec, subjects.Rejected("AB_RUNS"), e, func(m *nats.Msg) { m.Header.Set("ce-tenant", "x.y") })

	// A rejection after it, of no tenant at all.
	e, err = forger.New(events.TypeEventRejected, events.NewID(), "", "", rej)
	require.NoError(t, err)
	after := publishRaw(ctx, t, exec, subjects.Rejected("AB_RUNS"), e, nil)
	require.Greater(t, after.Sequence, ack.Sequence)

	stream, err := srv.JS.Stream(ctx, "AB_REJECTED")
	require.NoError(t, err)
	floor := func() uint64 {
		c, err := stream.Consumer(ctx, "auditor-rejected")
		if err != nil {
			return 0
		}
		return c.CachedInfo().AckFloor.Stream
	}
	assert.Eventually(t, func() bool { return floor() >= after.Sequence }, 20*time.Second, 100*time.Millisecond,
		"the auditor acknowledges the rejection and the one after it (stream sequences %d, %d)", ack.Sequence, after.Sequence)
	t.Logf("auditor-rejected ack floor %d", floor())
}
