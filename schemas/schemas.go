// Package schemas embeds the JSON Schemas (draft 2020-12) of the data of
// every actionbus event type, so that every binary validates against the
// same files that other languages read from this folder.
//
// It holds files only; validation is done by package events.
package schemas

import "embed"

// FS holds every schema file of this folder: one <noun>.<verb>.json per
// event type, defs.json with the shared definitions, and the schemas of
// the records of docs/protocol.md that are no events (the names below).
//
//go:embed *.json
var FS embed.FS

// BaseURL is the $id prefix of every schema.
const BaseURL = "https://actionbus.dev/schemas/"

// The schemas of records that are not events (docs/protocol.md, "Records
// and their schemas"): files of FS, validated by internal/record.
const (
	// ActionDefinition is one action of an announcement.
	ActionDefinition = "action-definition.json"
	// CatalogEntry is a value of the catalog bucket.
	CatalogEntry = "catalog-entry.json"
	// IdempotencyRecord is a value of a pool's idempotency bucket.
	IdempotencyRecord = "idempotency-record.json"
	// Presence is a value of a pool's presence bucket.
	Presence = "presence.json"
)
