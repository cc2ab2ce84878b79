package events

import (
	"reflect"
	"strings"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/oklog/ulid/v2"

	"github.com/actionbus/actionbus"
)

// ValidRunID reports whether id may name a run: a ULID in its canonical
// form (26 upper-case Crockford base-32 characters). Run ids appear as
// subject tokens, in approval ids ("<runId>-<cycle>-<index>") and as
// key-value keys, so nothing else is accepted: no dots, wildcards, dashes
// or lower case.
func ValidRunID(id string) bool {
	if len(id) != ulid.EncodedSize || strings.ToUpper(id) != id {
		return false
	}
	_, err := ulid.ParseStrict(id)
	return err == nil
}

// CheckRunID returns a typed invalid_run_id error when id is not a
// [ValidRunID]. The message names the rule, never more than the id.
func CheckRunID(id string) error {
	if ValidRunID(id) {
		return nil
	}
	return (&actionbus.Error{Code: actionbus.CodeInvalidRunID,
		Message: "run ids are ULIDs (26 upper-case Crockford base-32 characters)"}).WithDetail("runId", clip(id, 64))
}

// CheckBinding enforces the trust rule of every consumer: an event is
// accepted only on the subject its type is published on, and an event of
// a run only when its runid extension and its data's runId both equal the
// run token of the subject (a canonical ULID). A service believes the
// subject — which NATS permissions bind to the sender — never the payload
// alone. The tenant extension must equal the subject's tenant token
// (subjects bind a run to its tenant, and NATS permissions bind a tenant's
// users to its subjects). data is the decoded data struct of e. The error
// is a typed *actionbus.Error (subject_mismatch, invalid_run_id or
// invalid_tenant).
func (s Subjects) CheckBinding(subject string, e *event.Event, data any) error {
	entry, ok := Lookup(e.Type())
	if !ok {
		return actionbus.Errorf(actionbus.CodeUnknownEventType, "unknown event type %q", e.Type())
	}
	vars, ok := s.match(entry.Subject, subject)
	if !ok {
		return (&actionbus.Error{Code: actionbus.CodeSubjectMismatch,
			Message: "event type " + e.Type() + " is not carried on this subject"}).
			WithDetail("type", e.Type()).WithDetail("subject", clip(subject, 256)).WithDetail("expected", entry.Subject)
	}
	if pool, ok := vars["pool"]; ok {
		if p, ok := ExtensionOf(e, ExtPool); ok && isOtherString(p, pool) {
			return (&actionbus.Error{Code: actionbus.CodeSubjectMismatch,
				Message: "the event's pool differs from its subject's pool token"}).WithDetail("pool", pool)
		}
		// Work carries its run's tenant only in the extension.
		if t := StringExtension(e, ExtTenant); t != "" || e.Type() == TypeActionRequested {
			if err := CheckTenant(t); err != nil {
				return err
			}
		}
	}
	if tenant, ok := vars["tenant"]; ok {
		if err := CheckTenant(tenant); err != nil {
			return err
		}
		if t := StringExtension(e, ExtTenant); t != tenant {
			return (&actionbus.Error{Code: actionbus.CodeInvalidTenant,
				Message: "the event's tenant extension differs from its subject's tenant token"}).
				WithDetail("subjectTenant", tenant).WithDetail("tenant", clip(t, 64))
		}
	}
	// A data struct that names the tenant (work, audit records) names
	// the event's.
	if t, has := dataField(data, "Tenant"); has && t != "" {
		if ext := StringExtension(e, ExtTenant); t != ext {
			return (&actionbus.Error{Code: actionbus.CodeInvalidTenant,
				Message: "the event data's tenant differs from its tenant extension"}).WithDetail("tenant", clip(t, 64))
		}
	}
	runToken, perRun := vars["runId"]
	if !perRun {
		return nil
	}
	if strings.HasPrefix(entry.Subject, "{prefix}.run.") {
		if err := CheckRunID(runToken); err != nil {
			return err
		}
	}
	ext := StringExtension(e, ExtRunID)
	body := dataRunID(data)
	if ext != runToken || body != runToken {
		return (&actionbus.Error{Code: actionbus.CodeSubjectMismatch,
			Message: "the event's run id differs from its subject's run token"}).
			WithDetail("subjectRunId", runToken).WithDetail("runid", clip(ext, 64)).WithDetail("dataRunId", clip(body, 64))
	}
	return nil
}

// match matches subject against a catalog subject pattern whose
// placeholders ({prefix} aside) each stand for one token, and returns the
// placeholders' values.
func (s Subjects) match(pattern, subject string) (map[string]string, bool) {
	pat := strings.Split(strings.Replace(pattern, "{prefix}", s.prefix, 1), ".")
	tok := strings.Split(subject, ".")
	if len(pat) != len(tok) {
		return nil, false
	}
	vars := map[string]string{}
	for i, p := range pat {
		if strings.HasPrefix(p, "{") && strings.HasSuffix(p, "}") {
			if !validToken(tok[i]) {
				return nil, false
			}
			vars[p[1:len(p)-1]] = tok[i]
			continue
		}
		if p != tok[i] {
			return nil, false
		}
	}
	return vars, true
}

// dataRunID returns the RunID field of an event's data struct ("" when it
// has none). Every per-run data type has one (TestEveryPerRunTypeHasRunID).
func dataRunID(data any) string {
	id, _ := dataField(data, "RunID")
	return id
}

// dataField returns the string field name of an event's data struct, and
// whether it has one.
func dataField(data any, name string) (string, bool) {
	v := reflect.ValueOf(data)
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return "", false
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return "", false
	}
	f := v.FieldByName(name)
	if !f.IsValid() || f.Kind() != reflect.String {
		return "", false
	}
	return f.String(), true
}

// clip shortens s to at most n bytes for error details: a rejected event
// may carry anything, and a detail must stay small.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// isOtherString reports whether v is a string other than s.
func isOtherString(v any, s string) bool {
	str, ok := v.(string)
	return ok && str != s
}
