package actions_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
)

func bp(b bool) *bool { return &b }

func TestPermissionNormalization(t *testing.T) {
	cases := []struct {
		name string
		mode actions.Mode
		in   *actions.Permission
		want actions.NormalizedPermission
	}{
		{"read without metadata", actions.ModeRead, nil,
			actions.NormalizedPermission{Effect: "read_state", InterruptBehavior: "block", ConcurrencySafe: true, ReadOnly: true, Source: "fallback"}},
		{"mutate without metadata", actions.ModeMutate, nil,
			actions.NormalizedPermission{Effect: "write_state", InterruptBehavior: "block", Destructive: true, NeedsApproval: true, Source: "fallback"}},
		{"draft without metadata is not read-only", actions.ModeDraft, nil,
			actions.NormalizedPermission{Effect: "draft", InterruptBehavior: "block", Source: "fallback"}},
		{"partial metadata keeps declared fields", actions.ModeRead, &actions.Permission{Effect: "external_network", InterruptBehavior: "abort_safe"},
			actions.NormalizedPermission{Effect: "external_network", InterruptBehavior: "abort_safe", ConcurrencySafe: true, ReadOnly: true, Source: "fallback"}},
		{"complete metadata is host metadata", actions.ModeRead, &actions.Permission{Effect: "external_network", InterruptBehavior: "abort_safe",
			ConcurrencySafe: bp(true), Destructive: bp(false), ReadOnly: bp(true), NeedsApproval: bp(true)},
			actions.NormalizedPermission{Effect: "external_network", InterruptBehavior: "abort_safe", ConcurrencySafe: true, ReadOnly: true, NeedsApproval: true, Source: "host_metadata"}},
		{"a mutate action cannot declare itself safe", actions.ModeMutate, &actions.Permission{ReadOnly: bp(true), NeedsApproval: bp(false), Source: "built_in_metadata"},
			actions.NormalizedPermission{Effect: "write_state", InterruptBehavior: "block", Destructive: true, NeedsApproval: true, Source: "built_in_metadata"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, c.in.Normalize(c.mode))
		})
	}
}

func TestRegistrationRefusals(t *testing.T) {
	schema := json.RawMessage(`{"type":"object","properties":{"x":{"type":"object"}}}`)
	cases := []struct {
		name string
		def  actions.Definition
		code actionbus.Code
	}{
		{"bad name", actions.Definition{Name: "a b", InputSchema: schema}, actionbus.CodeInvalidDefinition},
		{"bad mode", actions.Definition{Name: "a", Mode: "delete", InputSchema: schema}, actionbus.CodeInvalidDefinition},
		{"bad tier", actions.Definition{Name: "a", Tier: 5, InputSchema: schema}, actionbus.CodeInvalidDefinition},
		{"bad schema", actions.Definition{Name: "a", InputSchema: json.RawMessage(`{"type":7}`)}, actionbus.CodeInvalidDefinition},
		{"visible without schema or opt-out", actions.Definition{Name: "a"}, actionbus.CodeInvalidDefinition},
		{"blank opt-out reason", actions.Definition{Name: "a", Planner: &actions.PlannerMeta{ArgsSchemaOptOut: "  "}}, actionbus.CodeInvalidDefinition},
		{"bad decision type", actions.Definition{Name: "a", InputSchema: schema, Planner: &actions.PlannerMeta{DecisionType: "final"}}, actionbus.CodeInvalidDefinition},
		{"bad risk level", actions.Definition{Name: "a", InputSchema: schema, RiskLevel: "spicy"}, actionbus.CodeInvalidDefinition},
		{"bad audit mode", actions.Definition{Name: "a", InputSchema: schema, AuditPolicy: &actions.AuditPolicy{Input: "everything"}}, actionbus.CodeInvalidAuditPolicy},
		{"bad redact path", actions.Definition{Name: "a", InputSchema: schema, AuditPolicy: &actions.AuditPolicy{RedactPaths: []string{"token"}}}, actionbus.CodeInvalidAuditPolicy},
		{"heal into a missing property", actions.Definition{Name: "a", InputSchema: schema, HealFlattenedInto: "args"}, actionbus.CodeInvalidDefinition},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.def.Normalize()
			assert.Equal(t, c.code, actionbus.CodeOf(err), "%v", err)
		})
	}
	ok := []actions.Definition{
		{Name: "hidden.noSchema", Planner: &actions.PlannerMeta{Hidden: true}},
		{Name: "visible.optOut", Planner: &actions.PlannerMeta{ArgsSchemaOptOut: "free-form input by design"}},
		{Name: "heal", InputSchema: schema, HealFlattenedInto: "x"},
	}
	for _, d := range ok {
		assert.NoError(t, d.Normalize(), d.Name)
	}
	r := actions.NewRegistry()
	assert.NoError(t, r.Register(actions.Definition{Name: "dup", InputSchema: schema}, noop))
	assert.ErrorIs(t, r.Register(actions.Definition{Name: "dup", InputSchema: schema}, noop), actionbus.ErrActionExists)
}
