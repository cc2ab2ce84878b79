// Package record validates the records trusted services read from
// buckets that others write — a catalog entry, an idempotency record, a
// presence value — against their JSON Schemas in schemas/ (the files
// docs/protocol.md names), so a Go reader and a reader in any other
// language refuse the same records.
//
// A record that fails is an *actionbus.Error with code invalid_record
// whose details name the kind and the key; the reader refuses it (does
// not list or use it) and logs it once.
package record

import (
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/schema"
	"github.com/actionbus/actionbus/schemas"
)

// Kind names a kind of record: its schema and the word its errors use.
type Kind string

// The kinds of records, with their schema files (schemas.<Kind>Schema).
const (
	// CatalogEntry is a catalog bucket value (schemas/catalog-entry.json).
	CatalogEntry Kind = "catalog_entry"
	// IdempotencyRecord is an idempotency bucket value
	// (schemas/idempotency-record.json).
	IdempotencyRecord Kind = "idempotency_record"
	// Presence is a presence bucket value (schemas/presence.json).
	Presence Kind = "presence"
	// ActionDefinition is one action of an announcement
	// (schemas/action-definition.json); the registrar checks it before
	// it becomes a catalog entry.
	ActionDefinition Kind = "action_definition"
)

// File returns the schema file of kind in schemas/ ("" if unknown).
func File(kind Kind) string {
	switch kind {
	case CatalogEntry:
		return schemas.CatalogEntry
	case IdempotencyRecord:
		return schemas.IdempotencyRecord
	case Presence:
		return schemas.Presence
	case ActionDefinition:
		return schemas.ActionDefinition
	}
	return ""
}

var (
	compileOnce sync.Once
	compiled    map[Kind]*schema.Compiled
	compileErr  error
)

// Compile compiles the schema of every kind (once per process; later
// calls return the first outcome). [Validate] compiles them on first use.
func Compile() error {
	compileOnce.Do(func() {
		set := schema.NewSet()
		if compileErr = set.AddFS(schemas.FS, schemas.BaseURL); compileErr != nil {
			return
		}
		compiled = map[Kind]*schema.Compiled{}
		for _, k := range []Kind{CatalogEntry, IdempotencyRecord, Presence, ActionDefinition} {
			c, err := set.Compile(schemas.BaseURL + File(k))
			if err != nil {
				compileErr = fmt.Errorf("record: schema of %s: %w", k, err)
				return
			}
			compiled[k] = c
		}
	})
	return compileErr
}

// Validate checks doc, the value stored under key, against the schema of
// kind. It returns nil or an *actionbus.Error with code invalid_record
// (details: record, key, and issues when the schema refused it).
func Validate(kind Kind, key string, doc []byte) error {
	if err := Compile(); err != nil {
		return err
	}
	c, ok := compiled[kind]
	if !ok {
		return fmt.Errorf("record: unknown kind %q", kind)
	}
	err := c.ValidateJSON(doc)
	if err == nil {
		return nil
	}
	out := Invalid(kind, key, "%s", err.Error())
	var typed *actionbus.Error
	if errors.As(err, &typed) && typed.Details["issues"] != nil {
		out = out.WithDetail("issues", typed.Details["issues"])
	}
	return out
}

// Invalid returns the invalid_record error of a record of kind under key.
func Invalid(kind Kind, key string, format string, args ...any) *actionbus.Error {
	msg := fmt.Sprintf(format, args...)
	return actionbus.Errorf(actionbus.CodeInvalidRecord, "%s %s is invalid: %s", kind, clip(key), msg).
		WithDetail("record", string(kind)).WithDetail("key", clip(key))
}

// clip bounds a key in a message (keys come from a bucket anyone with
// write access filled).
func clip(s string) string {
	if len(s) <= 200 {
		return s
	}
	cut := 200
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
