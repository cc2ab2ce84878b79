package executor

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/catalog"
	"github.com/actionbus/actionbus/internal/skills"
)

// Skill is a bundled agent skill (seed 000): its SKILL.md front matter —
// name, description, version, the tools it declares, the skills it may hand
// off to — and its body, the instructions the planner sees while the skill
// is active. [LoadSkill] reads one from a directory. It is
// [catalog.Skill].
type Skill = catalog.Skill

// SkillTool is one tool a skill declares: its name, description, argument
// schema (parameters), default result kind, mode (default read) and
// policy tier (default 0). It is [catalog.SkillTool].
type SkillTool = catalog.SkillTool

// ToolFunc runs one call of a skill tool. args are the tool's arguments,
// checked against its parameters. The returned object is the tool's
// result; its resultKind and _meta fields (and, with resultKind "final",
// markdown) are hoisted onto the result envelope the planner sees.
type ToolFunc func(ctx context.Context, args map[string]any, call Call) (map[string]any, error)

// LoadSkill reads dir/SKILL.md from fsys.
func LoadSkill(fsys fs.FS, dir string) (Skill, error) { return skills.Load(fsys, dir) }

// RegisterSkill adds a skill and the handlers of its tools to ex: every
// tool the skill declares needs a handler, and every handler a declared
// tool. Each tool becomes a hidden action named skill.<skill>.<tool> with
// the tool's mode and tier, so a call goes through the same policy,
// approvals, idempotency and audit as any action; the planner reaches it
// through execute_skill_tool. The skill is published to the catalog when
// ex runs.
func RegisterSkill(ex *Executor, s Skill, tools map[string]ToolFunc) error {
	if s.Version == "" {
		s.Version = "1"
	}
	s.Pool = ex.cfg.Pool
	if err := s.Validate(); err != nil {
		return err
	}
	for name := range tools {
		if _, ok := s.Tool(name); !ok {
			return actionbus.Errorf(actionbus.CodeInvalidSkill, "skill %q: a handler for %q, which it does not declare", s.Name, name)
		}
	}
	for _, t := range s.Tools {
		h, ok := tools[t.Name]
		if !ok {
			return actionbus.Errorf(actionbus.CodeInvalidSkill, "skill %q: tool %q has no handler", s.Name, t.Name)
		}
		params := t.Parameters
		if params == nil {
			params = map[string]any{"type": "object"}
		}
		in, err := json.Marshal(params)
		if err != nil {
			return fmt.Errorf("executor: skill %s: tool %s: %w", s.Name, t.Name, err)
		}
		mode := Mode(t.Mode)
		if mode == "" {
			mode = ModeRead
		}
		a := Action{Name: skills.ActionName(s.Name, t.Name), Description: t.Description, Mode: mode, Tier: t.Tier,
			InputSchema: in, OutputSchema: json.RawMessage(`{"type":"object"}`), Version: s.Version,
			Planner: &PlannerMeta{Hidden: true}, Permission: t.Permission}
		err = Register(ex, a, func(ctx context.Context, args map[string]any, call Call) (Result[map[string]any], error) {
			out, err := h(ctx, args, call)
			if err != nil {
				return Result[map[string]any]{}, err
			}
			if out == nil {
				out = map[string]any{}
			}
			return Result[map[string]any]{Output: out}, nil
		})
		if err != nil {
			return err
		}
	}
	ex.skillsMu.Lock()
	defer ex.skillsMu.Unlock()
	ex.skills = append(ex.skills, s)
	return nil
}
