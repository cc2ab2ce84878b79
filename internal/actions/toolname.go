package actions

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
)

var toolNameUnsafe = regexp.MustCompile(`[^A-Za-z0-9_-]`)

// ToolName is an action name (or an alias) as a provider function name
// (^[A-Za-z0-9_-]{1,64}$), the name a planner in native tool-call mode
// offers and calls it by: every other character (an action name's dots)
// becomes "__", and a name over 64 characters is cut to 55 and suffixed
// with 8 hex digits of its SHA-256. Distinct action names can share a
// tool name ("a.b" and "a__b"); the registrar claims the tool name of every
// name an entry can be called by, so no two pools' entries share one.
func ToolName(action string) string {
	n := toolNameUnsafe.ReplaceAllStringFunc(action, func(string) string { return "__" })
	if len(n) > 64 {
		sum := sha256.Sum256([]byte(action))
		n = n[:55] + "_" + hex.EncodeToString(sum[:4])
	}
	return n
}
