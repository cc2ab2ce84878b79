// Package payload minimizes action payloads by an audit policy: input
// full, redacted, hash or omit; output full, redacted, summary, hash or
// omit; error full, redacted, summary or omit; exact JSON-Pointer redact
// paths in every mode that keeps or hashes a payload. The auditor applies
// it before a record is written anywhere; the executor applies it before
// an argument or result reaches a trace.
package payload

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/schema"
)

// Payload minimization, the seed's audit hook rules: input is full,
// redacted, hash or omit; output full, redacted, summary, hash or omit;
// error full, redacted, summary or omit. Redact paths are exact JSON
// Pointers; they apply to every mode that keeps or hashes a payload, so a
// hash never fingerprints a secret. The policy is applied by the auditor
// before a record is written anywhere.

// Redacted replaces a redacted value.
const Redacted = "[REDACTED]"

// Policy is the auditor's default payload policy; actions override
// it field by field with their own audit policy.
type Policy = actions.AuditPolicy

// Default keeps no raw payload: inputs are hashed, outputs and
// errors summarized (the seed's production recommendation).
var Default = Policy{Input: actions.PayloadHash, Output: actions.PayloadSummary, Error: actions.PayloadSummary}

// Effective is the policy for one action: each mode the action sets wins
// over the default's, and both sets of redact paths apply.
func Effective(def Policy, action *actions.AuditPolicy) Policy {
	out := def
	out.RedactPaths = append([]string(nil), def.RedactPaths...)
	if action == nil {
		return out
	}
	if action.Input != "" {
		out.Input = action.Input
	}
	if action.Output != "" {
		out.Output = action.Output
	}
	if action.Error != "" {
		out.Error = action.Error
	}
	for _, p := range action.RedactPaths {
		if !contains(out.RedactPaths, p) {
			out.RedactPaths = append(out.RedactPaths, p)
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Redact returns v with the value at each path replaced by [Redacted],
// in a deep copy when anything may change (v itself is never modified).
// "" redacts the whole value; a path that does not exist is ignored.
func Redact(v any, paths []string) any {
	if len(paths) == 0 {
		return v // records are serialized at once; nothing aliases it long
	}
	out := Clone(v)
	for _, p := range paths {
		if p == "" {
			return Redacted
		}
		out = redactAt(out, schema.Tokens(p))
	}
	return out
}

func redactAt(v any, tokens []string) any {
	if len(tokens) == 0 {
		return Redacted
	}
	switch t := v.(type) {
	case map[string]any:
		if x, ok := t[tokens[0]]; ok {
			t[tokens[0]] = redactAt(x, tokens[1:])
		}
	case []any:
		// RFC 6901 array indexes: digits, no leading zero.
		tok := tokens[0]
		if i, err := strconv.Atoi(tok); err == nil && i >= 0 && i < len(t) && strconv.Itoa(i) == tok {
			t[i] = redactAt(t[i], tokens[1:])
		}
	}
	return v
}

// clone deep-copies a JSON value into generic form (maps, slices, float64).
func Clone(v any) any {
	if v == nil {
		return nil
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("<%T not JSON>", v)
	}
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

// Shape is the seed's safe shape summary of a value: object,
// array(length=N), string, number, boolean or null.
func Shape(v any) string {
	switch v.(type) {
	case nil, map[string]any, []any, string, float64, bool:
	default:
		v = Clone(v) // a Go value: look at its JSON form
	}
	switch t := v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "object"
	case []any:
		return fmt.Sprintf("array(length=%d)", len(t))
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "boolean"
	}
	return "object"
}

// Hash is what a payload is recorded as in hash mode: {"hash": its
// stable input hash (policy.InputHash)}.
func Hash(v any) map[string]any {
	h, err := policy.InputHash(v)
	if err != nil {
		h = "unhashable"
	}
	return map[string]any{"hash": h}
}

// ApplyInput minimizes an action input.
func ApplyInput(p Policy, v any) any {
	switch p.Input {
	case actions.PayloadOmit:
		return nil
	case actions.PayloadHash:
		return Hash(Redact(v, p.RedactPaths))
	default: // full and redacted: redaction applies in every mode that keeps a payload
		return Redact(v, p.RedactPaths)
	}
}

// ApplyOutput minimizes an action output. summary is what the action says
// of its output (its handler's Summary, the seed's summarizeOutput): the
// summary mode keeps it, or the shape of the output when there is none.
func ApplyOutput(p Policy, v any, summary string) (value any, outputSummary string) {
	switch p.Output {
	case actions.PayloadOmit:
		return nil, ""
	case actions.PayloadHash:
		return Hash(Redact(v, p.RedactPaths)), ""
	case actions.PayloadFull, actions.PayloadRedacted:
		// Redaction applies in every mode that keeps a payload.
		return Redact(v, p.RedactPaths), ""
	default: // summary
		if summary != "" {
			return nil, summary
		}
		return nil, Shape(v)
	}
}

// ApplyError minimizes an error; summary keeps only its code and message.
func ApplyError(p Policy, e *actionbus.Error) any {
	if e == nil {
		return nil
	}
	switch p.Error {
	case actions.PayloadOmit:
		return nil
	case actions.PayloadFull, actions.PayloadRedacted:
		// Redaction applies in every mode that keeps a payload.
		return Redact(Clone(e), p.RedactPaths)
	default: // summary
		return map[string]any{"code": string(e.Code), "message": e.Message}
	}
}
