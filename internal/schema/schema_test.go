package schema_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/schema"
)

// TestViolationsNeverQuoteTheValue: a rejected value may be a secret, and
// validation errors travel in events, audit records and logs. Each rule's
// message names the path and the rule, never the value.
func TestViolationsNeverQuoteTheValue(t *testing.T) {
	const secret = "Hunter2-Secret"
	c, err := schema.CompileDocument("https://actionbus.dev/test.json", []byte(`{
		"type": "object",
		"properties": {
			"pattern": {"type": "string", "pattern": "^[a-z]+$"},
			"enum":    {"enum": ["a", "b"]},
			"const":   {"const": "a"},
			"format":  {"type": "string", "format": "email"},
			"min":     {"type": "string", "minLength": 40},
			"max":     {"type": "string", "maxLength": 3},
			"type":    {"type": "integer"},
			"number":  {"type": "number", "maximum": 1}
		}
	}`))
	require.NoError(t, err)
	for field, value := range map[string]any{
		"pattern": secret, "enum": secret, "const": secret,
		"min": secret, "max": secret, "type": secret, "number": 123456789,
	} {
		t.Run(field, func(t *testing.T) {
			err := c.Validate(map[string]any{field: value})
			require.Error(t, err)
			assert.ErrorIs(t, err, actionbus.ErrSchemaValidation)
			var abErr *actionbus.Error
			require.ErrorAs(t, err, &abErr)
			all := abErr.Error() + strings.Join(func() []string {
				var out []string
				for _, is := range abErr.Details["issues"].([]schema.Issue) {
					out = append(out, is.Path, is.Reason, is.Keyword)
				}
				return out
			}(), " ")
			assert.Contains(t, all, "/"+field, "the path is named")
			assert.NotContains(t, all, secret)
			assert.NotContains(t, all, "123456789")
		})
	}
}
