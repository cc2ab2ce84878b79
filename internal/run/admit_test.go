package run

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/skills"
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

func TestModelMayCallOnlyPlannerVisibleActionsOrTheActiveSkillsTools(t *testing.T) {
	const tool = "skill.report.count_rows"
	for _, tc := range []struct {
		name                    string
		origin, action, via, sk string
		visible, want           bool
	}{
		{"host input runs a hidden action", events.OriginHost, tool, "", "", false, true},
		{"model input runs a visible action", events.OriginModel, "demo.echo", "", "", true, true},
		{"model names a hidden skill tool directly", events.OriginModel, tool, "", "", false, false},
		{"model names it directly with the skill active", events.OriginModel, tool, "", "report", false, false},
		{"model names a hidden action", events.OriginModel, "internal.reset", "", "", false, false},
		{"through execute_skill_tool with the skill active", events.OriginModel, tool, skills.ExecuteTool, "report", false, true},
		{"through execute_skill_tool, no active skill", events.OriginModel, tool, skills.ExecuteTool, "", false, false},
		{"through execute_skill_tool, another skill active", events.OriginModel, tool, skills.ExecuteTool, "review", false, false},
		{"through execute_skill_tool, a prefix of the skill's name", events.OriginModel, tool, skills.ExecuteTool, "rep", false, false},
		{"through execute_skill_tool, a hidden non-skill action", events.OriginModel, "internal.reset", skills.ExecuteTool, "report", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, modelMayCall(tc.origin, tc.action, tc.via, tc.sk, tc.visible))
		})
	}
}
