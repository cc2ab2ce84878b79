package events_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
)

// FuzzValidate feeds arbitrary data of every event type to the validation
// entry point: no panic, and every error carries a code.
func FuzzValidate(f *testing.F) {
	for _, entry := range events.Catalog {
		f.Add(entry.Type, events.ContentTypeJSON, []byte(`{"runId":"R1"}`))
	}
	f.Add(events.TypeRunRequested, events.ContentTypeMsgpack, []byte{0x81, 0xa5, 'r', 'u', 'n', 'I', 'd', 0xa2, 'R', '1'})
	f.Add(events.TypeRunRequested, "text/plain", []byte("x"))
	f.Fuzz(func(t *testing.T, typ, ct string, data []byte) {
		e := event.New()
		e.SetID("1")
		e.SetSource("/fuzz")
		e.SetType(typ)
		if ct != "" {
			e.SetDataContentType(ct)
		}
		e.DataEncoded = data
		err := events.Validate(&e)
		if err != nil && actionbus.CodeOf(err) == actionbus.CodeInternal {
			t.Fatalf("validation error without a code: %v", err)
		}
		if err == nil {
			entry, ok := events.Lookup(typ)
			if !ok {
				t.Fatalf("unknown type %q validated", typ)
			}
			if err := events.DataAs(&e, entry.New()); err != nil {
				t.Fatalf("valid data does not decode into its struct: %v", err)
			}
		}
	})
}

// FuzzCheckBinding feeds arbitrary subjects, types and run ids to the
// subject-binding check: it must never panic, every refusal must carry a
// code, and an accepted per-run event must have a valid run id equal to
// its subject's run token.
func FuzzCheckBinding(f *testing.F) {
	run := events.NewID()
	f.Add("ab.run.default."+run+".decision", events.TypeDecisionMade, run, run)
	f.Add("ab.run.default."+run+".input", events.TypeDecisionMade, run, run)
	f.Add("ab.run.default.run-1.requested", events.TypeRunRequested, "run-1", "run-1")
	f.Add("ab.pool.default.request", events.TypeActionRequested, run, "")
	f.Add("ab.run..x", events.TypeRunStep, "", "")
	f.Add("ab.run.auditor."+run+".decision", events.TypeDecisionMade, run, run)
	f.Add("ab.run.executor-billing."+run+".decision", events.TypeDecisionMade, run, run)
	f.Fuzz(func(t *testing.T, subject, typ, ext, body string) {
		s := events.MustSubjects("ab")
		e := event.New()
		e.SetID("x")
		e.SetType(typ)
		e.SetSource("/f")
		if ext != "" && utf8.ValidString(ext) {
			e.SetExtension(events.ExtRunID, ext)
		}
		entry, ok := events.Lookup(typ)
		var data any = map[string]any{}
		if ok {
			data = entry.New()
			if f, ok := data.(*events.DecisionMade); ok {
				f.RunID = body
			}
		}
		err := s.CheckBinding(subject, &e, data)
		if err != nil {
			if actionbus.CodeOf(err) == actionbus.CodeInternal {
				t.Fatalf("refusal without a code: %v", err)
			}
			return
		}
		if tenant, _ := s.RunFromSubject(subject); tenant != "" && !events.ValidTenant(tenant) {
			t.Fatalf("accepted %s on %q, whose tenant %q is not a valid tenant", typ, subject, tenant)
		}
		if typ == events.TypeDecisionMade {
			token := s.RunIDFromSubject(subject)
			if !events.ValidRunID(token) || token != body || token != ext {
				t.Fatalf("accepted %s on %q with runid %q and body %q", typ, subject, ext, body)
			}
		}
	})
}

// FuzzCheckTenant: every string is either a valid tenant (the token rule,
// not reserved, not a service name followed by '-' or '_') or refused
// with invalid_tenant; never a panic.
func FuzzCheckTenant(f *testing.F) {
	for _, s := range []string{"default", "acme", "auditor", "executor-billing", "sys", "Acme", "a.b", "", "x_"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tenant string) {
		err := events.CheckTenant(tenant)
		if (err == nil) != events.ValidTenant(tenant) {
			t.Fatalf("CheckTenant(%q) = %v disagrees with ValidTenant", tenant, err)
		}
		if err != nil {
			if actionbus.CodeOf(err) != actionbus.CodeInvalidTenant {
				t.Fatalf("CheckTenant(%q): code %s", tenant, actionbus.CodeOf(err))
			}
			return
		}
		for _, r := range events.ReservedTenants {
			if tenant == r || strings.HasPrefix(tenant, r+"-") && (r == "executor" || r == "auditor" || r == "dispatcher" || r == "planner" || r == "admin" || r == "sys" || r == "system" || r == "actionbus" || r == "operator") {
				t.Fatalf("reserved tenant %q accepted", tenant)
			}
		}
		if len(tenant) > 32 || strings.ContainsAny(tenant, ".*> \t") {
			t.Fatalf("unsafe tenant %q accepted", tenant)
		}
	})
}
