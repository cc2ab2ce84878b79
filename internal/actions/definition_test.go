package actions_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
)

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
