package catalog

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"text/template"
)

// Limits are the limits of one action, declared with the action (and
// overridable by policy): a concurrency key and bound, and a rate. The
// zero Limits limit nothing.
type Limits struct {
	// Key is a text/template over the call: {{.tenant}}, {{.user}},
	// {{.action}}, {{.metadata.NAME}} and {{.input.NAME}}; calls whose keys
	// render equal share the limit. Default: one key for the action (all
	// its calls share it).
	Key string `json:"key,omitempty"`
	// MaxInFlight bounds the calls of one key running at once; 0 means no
	// bound.
	MaxInFlight int `json:"maxInFlight,omitempty"`
	// Rate bounds how often calls of one key start; nil means no bound.
	Rate *Rate `json:"rate,omitempty"`
}

// Rate is a token bucket: Limit calls per PerMs milliseconds, with up to
// Burst started at once after a quiet spell (default Burst: 1).
type Rate struct {
	Limit int   `json:"limit"`
	PerMs int64 `json:"perMs"`
	Burst int   `json:"burst,omitempty"`
}

// IsZero reports whether l limits nothing.
func (s Limits) IsZero() bool { return s.MaxInFlight <= 0 && s.Rate == nil }

// Validate reports a spec that cannot be enforced.
func (s Limits) Validate() error {
	if s.MaxInFlight < 0 {
		return errors.New("limits: maxInFlight must not be negative")
	}
	if r := s.Rate; r != nil {
		if r.Limit < 1 || r.PerMs < 1 || r.Burst < 0 {
			return errors.New("limits: rate needs limit ≥ 1 and perMs ≥ 1 (burst ≥ 0)")
		}
	}
	if s.Key != "" {
		if _, err := parseKey(s.Key); err != nil {
			return err
		}
	}
	return nil
}

func parseKey(expr string) (*template.Template, error) {
	t, err := template.New("key").Option("missingkey=zero").Parse(expr)
	if err != nil {
		return nil, fmt.Errorf("limits: key expression: %w", err)
	}
	return t, nil
}

// LimitCall is what a key expression may read of one call.
type LimitCall struct {
	Tenant   string
	UserID   string
	Action   string
	Metadata map[string]any
	Input    map[string]any
}

// maxKeyBytes bounds a rendered key.
const maxKeyBytes = 256

// RenderKey renders the spec's key for call: the text the limit is kept
// under (the action's name and the rendered expression).
func (s Limits) RenderKey(call LimitCall) (string, error) {
	if s.Key == "" {
		return call.Action, nil
	}
	t, err := parseKey(s.Key)
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	data := map[string]any{"tenant": call.Tenant, "user": call.UserID, "action": call.Action,
		"metadata": call.Metadata, "input": call.Input}
	if err := t.Execute(&b, data); err != nil {
		return "", fmt.Errorf("limits: key expression: %w", err)
	}
	key := strings.ReplaceAll(b.String(), "<no value>", "")
	if len(key) > maxKeyBytes {
		key = key[:maxKeyBytes]
	}
	return call.Action + "|" + key, nil
}
