package audit

import (
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
)

// A rejected event is audited under the tenant of the subject it was
// published on, also when it names no valid run: acme's junk on its own
// subject never lands in the default tenant's audit trail.
func TestARejectionIsAuditedUnderTheTenantOfItsSubject(t *testing.T) {
	b := &Builder{Prefix: "ab"}
	for _, tc := range []struct {
		name, subject, runID, tenant string
	}{
		{"a valid run", "ab.run.acme.01JB0000000000000000000000.input", "01JB0000000000000000000000", "acme"},
		{"no valid run", "ab.run.acme.not-a-run.input", "", "acme"},
		{"no run subject at all", "ab.pool.default.request", "", ""},
		// A rejection is published by any service, an executor too: a run
		// id in its data that is no subject token must not name an audit
		// subject (the append could never be stored, and would hold the
		// auditor's acknowledgements of every event behind it).
		{"a forged run id with dots and wildcards", "ab.run.acme.01JB0000000000000000000000.input", "01JB.acme.>", "acme"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := event.New()
			e.SetID(events.NewID())
			e.SetType(events.TypeEventRejected)
			e.SetSource("/dispatcher")
			r := &events.Received{Event: &e, Subject: "ab.rejected.x", Data: &events.EventRejected{
				RunID: tc.runID, OriginalSubject: tc.subject, Reason: actionbus.Error{Code: actionbus.CodeInvalidRunID}}}
			rec := b.Record(r)
			if rec.Tenant != tc.tenant {
				t.Fatalf("tenant %q, want %q", rec.Tenant, tc.tenant)
			}
			if !events.ValidRunID(tc.runID) && rec.RunID != NoRun {
				t.Fatalf("run %q, want %q", rec.RunID, NoRun)
			}
		})
	}
}
