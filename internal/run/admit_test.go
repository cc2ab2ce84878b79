package run

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus"
)

func TestLookupErrorsAreTypedRefusals(t *testing.T) {
	conflict := (&actionbus.Error{Code: actionbus.CodeCatalogConflict,
		Message: `action "x" is published by several pools ([default gpu])`}).WithDetail("pools", []string{"default", "gpu"})
	for _, tc := range []struct {
		name    string
		err     error
		code    actionbus.Code
		message string
	}{
		{"not found", actionbus.Errorf(actionbus.CodeActionNotFound, "gone"), actionbus.CodeActionNotFound, `action "x" is not in the catalog`},
		{"conflict names both pools", conflict, actionbus.CodeCatalogConflict, "[default gpu]"},
		{"wrapped conflict", fmt.Errorf("view: %w", conflict), actionbus.CodeCatalogConflict, "[default gpu]"},
		{"unreadable catalog", errors.New("nats: timeout"), actionbus.CodeCatalogUnavailable, "nats: timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := lookupRefusal("x", tc.err)
			assert.Equal(t, tc.code, got.Code)
			assert.Contains(t, got.Message, tc.message)
			assert.Equal(t, "x", got.Details["action"])
		})
	}
}
