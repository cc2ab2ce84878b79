// Package schemas embeds the JSON Schemas (draft 2020-12) of the data of
// every actionbus event type, so that every binary validates against the
// same files that other languages read from this folder.
//
// It holds files only; validation is done by package events.
package schemas

import "embed"

// FS holds every schema file of this folder: one <noun>.<verb>.json per
// event type, plus defs.json with the shared definitions.
//
//go:embed *.json
var FS embed.FS

// BaseURL is the $id prefix of every schema.
const BaseURL = "https://actionbus.dev/schemas/"
