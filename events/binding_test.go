package events_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
)

func TestCheckBinding(t *testing.T) {
	s := events.MustSubjects("ab")
	run, other := events.NewID(), events.NewID()
	mk := func(typ, runExt string, data any, ext ...events.Extension) (*eventT, any) {
		e := boundEvent(t, typ, runExt, data, ext...)
		return e, data
	}
	decision := func(id string) *events.DecisionMade {
		return &events.DecisionMade{RunID: id, Cycle: 1, Decision: events.Decision{Type: "final", Answer: "x"}}
	}
	cases := []struct {
		name    string
		subject string
		typ     string
		runExt  string
		data    any
		ext     []events.Extension
		code    actionbus.Code // "" means accepted
	}{
		{"decision on its own subject", s.Run(events.DefaultTenant, run, "decision"), events.TypeDecisionMade, run, decision(run), nil, ""},
		{"decision forged on a client subject", s.Run(events.DefaultTenant, run, "input"), events.TypeDecisionMade, run, decision(run), nil, actionbus.CodeSubjectMismatch},
		{"decision forged on the result subject", s.Run(events.DefaultTenant, run, "result"), events.TypeDecisionMade, run, decision(run), nil, actionbus.CodeSubjectMismatch},
		{"result forged as a terminal event", s.Run(events.DefaultTenant, run, "completed"), events.TypeActionCompleted, run, &events.ActionCompleted{RunID: run, CallID: "c"}, nil, actionbus.CodeSubjectMismatch},
		{"data run id differs from the subject", s.Run(events.DefaultTenant, run, "decision"), events.TypeDecisionMade, run, decision(other), nil, actionbus.CodeSubjectMismatch},
		{"runid extension differs from the subject", s.Run(events.DefaultTenant, run, "decision"), events.TypeDecisionMade, other, decision(run), nil, actionbus.CodeSubjectMismatch},
		{"lower-case run id", s.Run(events.DefaultTenant, "01jabcdefghjkmnpqrstvwxyz0", "decision"), events.TypeDecisionMade, "01jabcdefghjkmnpqrstvwxyz0", decision("01jabcdefghjkmnpqrstvwxyz0"), nil, actionbus.CodeInvalidRunID},
		{"run id with a dash", s.Run(events.DefaultTenant, "run-1", "decision"), events.TypeDecisionMade, "run-1", decision("run-1"), nil, actionbus.CodeInvalidRunID},
		{"extra subject token", s.Run(events.DefaultTenant, run, "decision") + ".x", events.TypeDecisionMade, run, decision(run), nil, actionbus.CodeSubjectMismatch},
		{"request on its pool", s.PoolRequest("default"), events.TypeActionRequested, run, &events.ActionRequested{RunID: run, CallID: "c", Action: "a"},
			[]events.Extension{{Name: events.ExtPool, Value: "default"}}, ""},
		{"request with another pool's extension", s.PoolRequest("default"), events.TypeActionRequested, run, &events.ActionRequested{RunID: run, CallID: "c", Action: "a"},
			[]events.Extension{{Name: events.ExtPool, Value: "payments"}}, actionbus.CodeSubjectMismatch},
		{"request without a pool extension", s.PoolRequest("default"), events.TypeActionRequested, run, &events.ActionRequested{RunID: run, CallID: "c", Action: "a"}, nil, ""},
		{"request of another tenant", s.PoolRequest("default"), events.TypeActionRequested, run, &events.ActionRequested{RunID: run, Tenant: "acme", CallID: "c", Action: "a"},
			[]events.Extension{{Name: events.ExtTenant, Value: "acme"}}, ""},
		{"request whose data names another tenant than its extension", s.PoolRequest("default"), events.TypeActionRequested, run,
			&events.ActionRequested{RunID: run, Tenant: "acme", CallID: "c", Action: "a"}, nil, actionbus.CodeInvalidTenant},
		{"request with an unsafe tenant", s.PoolRequest("default"), events.TypeActionRequested, run, &events.ActionRequested{RunID: run, CallID: "c", Action: "a"},
			[]events.Extension{{Name: events.ExtTenant, Value: "Acme.x"}}, actionbus.CodeInvalidTenant},
		{"event of another tenant on its own subject", s.Run("acme", run, "decision"), events.TypeDecisionMade, run, decision(run),
			[]events.Extension{{Name: events.ExtTenant, Value: "acme"}}, ""},
		{"tenant extension differs from the subject's tenant", s.Run("acme", run, "decision"), events.TypeDecisionMade, run, decision(run), nil, actionbus.CodeInvalidTenant},
		{"tenant extension forged for another tenant's run", s.Run(events.DefaultTenant, run, "cancel"), events.TypeCancelRequested, run, &events.CancelRequested{RunID: run},
			[]events.Extension{{Name: events.ExtTenant, Value: "acme"}}, actionbus.CodeInvalidTenant},
		{"subject tenant that is not a safe token", "ab.run.ACME." + run + ".decision", events.TypeDecisionMade, run, decision(run),
			[]events.Extension{{Name: events.ExtTenant, Value: "ACME"}}, actionbus.CodeInvalidTenant},
		{"terminal on its subject", s.Run(events.DefaultTenant, run, "failed"), events.TypeRunFailed, run, &events.RunFailed{RunID: run, Error: actionbus.Error{Code: "x"}}, nil, ""},
		{"rejection on the rejected subject", s.Rejected("AB_RUNS"), events.TypeEventRejected, "", &events.EventRejected{OriginalSubject: "x"}, nil, ""},
		{"rejection on a run subject", s.Run(events.DefaultTenant, run, "completed"), events.TypeEventRejected, run, &events.EventRejected{RunID: run, OriginalSubject: "x"}, nil, actionbus.CodeSubjectMismatch},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e, data := mk(c.typ, c.runExt, c.data, c.ext...)
			err := s.CheckBinding(c.subject, e, data)
			if c.code == "" {
				assert.NoError(t, err)
				return
			}
			assert.Equal(t, c.code, actionbus.CodeOf(err), "%v", err)
		})
	}
}

func TestValidRunID(t *testing.T) {
	for id, want := range map[string]bool{
		events.NewID():                true,
		"01ARZ3NDEKTSV4RRFFQ69G5FAV":  true,
		"01arz3ndektsv4rrffq69g5fav":  false,
		"01ARZ3NDEKTSV4RRFFQ69G5FA":   false,
		"01ARZ3NDEKTSV4RRFFQ69G5FAVX": false,
		"01ARZ3NDEKTSV4RRFFQ69G5FA-":  false,
		"01ARZ3NDEKTSV4RRFFQ69G5F.V":  false,
		"81ARZ3NDEKTSV4RRFFQ69G5FAV":  false, // overflows 48-bit time
		"":                            false,
		"*":                           false,
	} {
		assert.Equal(t, want, events.ValidRunID(id), id)
	}
}

// Every per-run event type's data has a RunID the binding check compares.
func TestEveryPerRunTypeHasRunID(t *testing.T) {
	run := events.NewID()
	s := events.MustSubjects("ab")
	for _, entry := range events.Catalog {
		if entry.Type == events.TypeEventRejected {
			continue
		}
		data := entry.New()
		setRunID(data, run)
		e := boundEvent(t, entry.Type, run, data)
		subject, err := s.SubjectFor(entry.Type, events.DefaultTenant, run, "default")
		if err != nil { // audit records
			subject = s.Audit(events.DefaultTenant, run, "kind")
			if entry.Type == events.TypeAuditAppended {
				subject = s.AuditAppend(events.DefaultTenant, run)
			}
		}
		if entry.Type == events.TypeActionRequested {
			e.SetExtension(events.ExtPool, "default")
		}
		assert.NoError(t, s.CheckBinding(subject, e, data), entry.Type)
	}
}

// An audit append holds records of its own run only: a record naming
// another run or tenant makes the whole message unreadable as audit.
func TestAnAuditAppendHoldsOnlyItsRunsRecords(t *testing.T) {
	run := events.NewID()
	for name, tc := range map[string]struct {
		rec events.AuditRecorded
		ok  bool
	}{
		"its run":      {events.AuditRecorded{RunID: run, Tenant: "acme"}, true},
		"another run":  {events.AuditRecorded{RunID: events.NewID(), Tenant: "acme"}, false},
		"other tenant": {events.AuditRecorded{RunID: run, Tenant: "globex"}, false},
	} {
		t.Run(name, func(t *testing.T) {
			data := &events.AuditAppended{RunID: run, Tenant: "acme", Records: []events.AuditRecorded{{RunID: run, Tenant: "acme"}, tc.rec}}
			e := boundEvent(t, events.TypeAuditAppended, run, data)
			recs, err := events.AuditRecordsOf(&events.Received{Event: e, Data: data})
			if tc.ok {
				require.NoError(t, err)
				assert.Len(t, recs, 2)
				return
			}
			assert.Error(t, err)
			assert.Nil(t, recs)
		})
	}
}
