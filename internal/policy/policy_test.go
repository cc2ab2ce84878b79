package policy_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/policy"
)

func TestCheckMode(t *testing.T) {
	cases := []struct {
		name      string
		requested []string
		mode      actions.Mode
		want      actionbus.Code
	}{
		{"read by default", nil, actions.ModeRead, ""},
		{"draft by default", nil, actions.ModeDraft, ""},
		{"dryRun by default", nil, actions.ModeDryRun, ""},
		{"mutate not by default", nil, actions.ModeMutate, actionbus.CodeModeNotAllowed},
		{"explicit list replaces the defaults", []string{"read"}, actions.ModeDryRun, actionbus.CodeModeNotAllowed},
		{"allowed mutate needs approval", []string{"read", "mutate"}, actions.ModeMutate, actionbus.CodeApprovalRequired},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := policy.CheckMode(c.requested, "a.b", c.mode)
			if c.want == "" {
				assert.Nil(t, err)
				return
			}
			if assert.NotNil(t, err) {
				assert.Equal(t, c.want, err.Code)
				assert.Equal(t, "a.b", err.Details["action"])
			}
		})
	}
}
