package events

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/schema"
	"github.com/actionbus/actionbus/schemas"
)

var (
	compileOnce sync.Once
	compiled    map[string]*schema.Compiled
	compileErr  error
)

// CompileSchemas compiles the embedded data schema of every catalog entry
// (once per process; later calls return the first outcome). [Validate]
// compiles them on first use; a service calls CompileSchemas when it
// starts so that a broken schema fails it at once.
func CompileSchemas() error {
	_, err := dataSchemas()
	return err
}

// dataSchemas compiles the embedded data schema of every catalog entry once.
func dataSchemas() (map[string]*schema.Compiled, error) {
	compileOnce.Do(func() {
		set := schema.NewSet()
		if compileErr = set.AddFS(schemas.FS, schemas.BaseURL); compileErr != nil {
			return
		}
		compiled = make(map[string]*schema.Compiled, len(Catalog))
		for _, entry := range Catalog {
			c, err := set.Compile(schemas.BaseURL + entry.Schema)
			if err != nil {
				compileErr = fmt.Errorf("events: schema of %s: %w", entry.Type, err)
				return
			}
			compiled[entry.Type] = c
		}
	})
	return compiled, compileErr
}

// SchemaURL returns the dataschema URL of an event type ("" if unknown).
func SchemaURL(eventType string) string {
	if e, ok := Lookup(eventType); ok {
		return schemas.BaseURL + e.Schema
	}
	return ""
}

// Validate checks an event the way every consumer and publisher does: the
// CloudEvent attributes are valid, the type is in the [Catalog], the data
// decodes with the codec its datacontenttype names, and the data is valid
// against the type's JSON Schema. Errors are *actionbus.Error with codes
// malformed_event, unknown_event_type, unsupported_content_type or
// schema_validation. Validate never panics on input.
func Validate(e *event.Event) error {
	if err := CheckEnvelope(e); err != nil {
		return err
	}
	return validateData(e)
}

// CheckEnvelope checks the CloudEvent attributes of e (the envelope, not
// the data). The error is an *actionbus.Error with code malformed_event.
func CheckEnvelope(e *event.Event) error {
	if err := e.Validate(); err != nil {
		return actionbus.Errorf(actionbus.CodeMalformedEvent, "invalid cloudevent: %w", err)
	}
	// A time RFC 3339 allows but no record can hold: years past 9999 (or
	// before 1) in UTC have no JSON form, so an event with one could
	// never be audited, and would hold every record stored with it.
	if t := e.Time(); !t.IsZero() && (t.UTC().Year() < 1 || t.UTC().Year() > 9999) {
		return actionbus.Errorf(actionbus.CodeMalformedEvent, "invalid cloudevent: time %s is outside the years 1 to 9999 in UTC", t.Format(time.RFC3339))
	}
	// The tenant attribute names a subject token wherever it is used (the
	// audit subject of the event's records): a tenant or none.
	if v, ok := ExtensionOf(e, ExtTenant); ok {
		if t, _ := v.(string); t != DefaultTenant && !ValidTenant(t) {
			return actionbus.Errorf(actionbus.CodeMalformedEvent, "invalid cloudevent: tenant %q is not a tenant", clip(fmt.Sprint(v), 64))
		}
	}
	return nil
}

// validateData checks that the type is in the catalog and the data is
// valid against its schema.
func validateData(e *event.Event) error {
	all, err := dataSchemas()
	if err != nil {
		return err
	}
	sc, ok := all[e.Type()]
	if !ok {
		return actionbus.Errorf(actionbus.CodeUnknownEventType, "event type %q is not in the catalog", e.Type())
	}
	doc, err := jsonInstance(e)
	if err != nil {
		return err
	}
	return sc.ValidateJSON(doc)
}

// FromDispatcher reports whether events of eventType are published by the
// dispatcher alone ([Entry.Producer]): work items, run outcomes, decision
// and synthesis requests, approval requests, timers. Only the dispatcher's
// NATS user may publish on their subjects (deploy/nats), and a receiver
// checks that an event's type is the one its subject binds.
func FromDispatcher(eventType string) bool {
	e, ok := Lookup(eventType)
	return ok && strings.HasPrefix(e.Producer, "dispatcher")
}

// ValidateIncoming checks the data of an event a service received (the
// decoder checked its envelope): when a client, an approver, a planner or an
// executor produced it (the trust boundary where validation belongs), not
// when the dispatcher did — the dispatcher built it from data it validated
// when it came in, so every receiver checking it again would only repeat
// that (a tenth of a service's CPU, measured). Its data is still decoded
// into its typed struct, and its subject binding checked, by the bus when it receives the event.
func ValidateIncoming(e *event.Event) error {
	if FromDispatcher(e.Type()) {
		return nil
	}
	return validateData(e)
}
