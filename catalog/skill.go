package catalog

import (
	"regexp"
	"strings"

	"github.com/actionbus/actionbus"
)

// The five runtime actions of skills (seed 000), handled by the
// dispatcher: the first four change the run's planner state and run
// alone, never inside a plan; ActionExecuteSkillTool runs one tool of the
// active skill on an executor. A skill's tool may not be named like one.
const (
	ActionListSkills       = "list_agent_skills"
	ActionReadSkill        = "read_agent_skill"
	ActionUseSkill         = "use_agent_skill"
	ActionHandoffToSkill   = "handoff_to_skill"
	ActionExecuteSkillTool = "execute_skill_tool"
)

// SkillStateAction reports whether name is one of the four runtime
// actions of skills that change planner state.
func SkillStateAction(name string) bool {
	return name == ActionListSkills || name == ActionReadSkill || name == ActionUseSkill || name == ActionHandoffToSkill
}

// SkillRuntimeAction reports whether name is one of the five runtime
// actions of skills.
func SkillRuntimeAction(name string) bool {
	return SkillStateAction(name) || name == ActionExecuteSkillTool
}

// Bounds of a skill: its instructions live in run state once read.
const (
	MaxSkillInstructionsBytes = 32 << 10
	MaxSkillTools             = 64
	MaxSkillHandoffs          = 16
)

// nonTerminalKinds are the result kinds of seed 000 that mark a
// preparatory step.
var nonTerminalKinds = map[string]bool{
	"resolution": true, "lookup": true, "preparatory": true, "intermediate": true, "partial": true, "other": true,
}

// NonTerminalKind reports whether a tool result of kind ("resolution",
// "lookup", "preparatory", "intermediate", "partial" or "other") is a
// preparatory step, never the run's final evidence.
func NonTerminalKind(kind string) bool { return nonTerminalKinds[kind] }

// Skill is one bundled skill (seed 000): SKILL.md's front matter and its
// body. Load one with executor.LoadSkill.
type Skill struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Version of the skill; default "1".
	Version string `json:"version,omitempty"`
	// Tools are the tools the skill declares.
	Tools []SkillTool `json:"tools,omitempty"`
	// Handoffs are the skills handoff_to_skill may move to from this one.
	Handoffs []string `json:"handoffs,omitempty"`
	// Instructions are SKILL.md's body: what the planner is told while
	// the skill is active.
	Instructions string `json:"instructions,omitempty"`
	// Pool is the pool whose executors host the tools (set when
	// published).
	Pool string `json:"pool,omitempty"`
}

// SkillTool is one tool a skill declares.
type SkillTool struct {
	Name        string `json:"name"`
	Description string `json:"description,omitempty"`
	// Parameters is the JSON Schema of the tool's arguments (an object
	// schema); nil means any object.
	Parameters map[string]any `json:"parameters,omitempty"`
	// ResultKind is the tool's default result kind (a result's own
	// resultKind wins).
	ResultKind string `json:"resultKind,omitempty"`
	// Mode is the tool's mode (read, draft, dryRun, mutate); default read.
	Mode string `json:"mode,omitempty"`
	// Tier is the tool's default policy tier; default 0 (allow), as the
	// seed's execute_skill_tool.
	Tier int `json:"tier,omitempty"`
	// Permission is what the tool may do to the world (effect,
	// isDestructive, needsApproval, ...); missing fields fall back
	// conservatively from the mode, as for any action.
	Permission *Permission `json:"permission,omitempty"`
}

var skillNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

// ValidSkillName reports whether name may name a skill or a tool: 1 to 64
// lower-case letters, digits, '_' or '-', starting with a letter or a
// digit.
func ValidSkillName(name string) bool { return skillNameRe.MatchString(name) }

// Tool returns the tool the skill declares by name.
func (s *Skill) Tool(name string) (*SkillTool, bool) {
	for i := range s.Tools {
		if s.Tools[i].Name == name {
			return &s.Tools[i], true
		}
	}
	return nil, false
}

// AllowsHandoff reports whether the skill may hand off to target.
func (s *Skill) AllowsHandoff(target string) bool {
	for _, h := range s.Handoffs {
		if h == target {
			return true
		}
	}
	return false
}

// Validate checks a skill: names are tokens (lower-case letters, digits,
// '_' and '-'), tools are unique and not named like runtime actions, result
// kinds and modes are known, and the instructions fit MaxSkillInstructionsBytes.
func (s *Skill) Validate() error {
	bad := func(format string, a ...any) error {
		return actionbus.Errorf(actionbus.CodeInvalidSkill, "skill %q: "+format, append([]any{s.Name}, a...)...)
	}
	if !skillNameRe.MatchString(s.Name) {
		return bad("the name must be 1–64 lower-case letters, digits, '_' or '-'")
	}
	if strings.TrimSpace(s.Description) == "" {
		return bad("a description is required")
	}
	if len(s.Instructions) > MaxSkillInstructionsBytes {
		return bad("instructions are %d bytes; at most %d", len(s.Instructions), MaxSkillInstructionsBytes)
	}
	if len(s.Tools) > MaxSkillTools || len(s.Handoffs) > MaxSkillHandoffs {
		return bad("at most %d tools and %d handoff targets", MaxSkillTools, MaxSkillHandoffs)
	}
	seen := map[string]bool{}
	for _, t := range s.Tools {
		switch {
		case !skillNameRe.MatchString(t.Name):
			return bad("tool %q: the name must be 1–64 lower-case letters, digits, '_' or '-'", t.Name)
		case SkillRuntimeAction(t.Name):
			return bad("tool %q: a runtime action's name", t.Name)
		case seen[t.Name]:
			return bad("tool %q declared twice", t.Name)
		case t.ResultKind != "" && t.ResultKind != "final" && t.ResultKind != "evidence" && !NonTerminalKind(t.ResultKind):
			return bad("tool %q: unknown resultKind %q", t.Name, t.ResultKind)
		case t.Mode != "" && t.Mode != "read" && t.Mode != "draft" && t.Mode != "dryRun" && t.Mode != "mutate":
			return bad("tool %q: unknown mode %q", t.Name, t.Mode)
		case t.Tier < 0 || t.Tier > 3:
			return bad("tool %q: tier %d is not 0–3", t.Name, t.Tier)
		}
		if t.Parameters != nil {
			if typ, ok := t.Parameters["type"]; ok && typ != "object" {
				return bad("tool %q: parameters must be an object schema", t.Name)
			}
		}
		seen[t.Name] = true
	}
	for _, h := range s.Handoffs {
		if !skillNameRe.MatchString(h) || h == s.Name {
			return bad("handoff target %q is not another skill's name", h)
		}
	}
	return nil
}

// SkillSummary is a skill as list_agent_skills shows it.
type SkillSummary struct {
	Name        string   `json:"name"`
	Description string   `json:"description"`
	Version     string   `json:"version,omitempty"`
	Tools       []string `json:"tools,omitempty"`
	Handoffs    []string `json:"handoffs,omitempty"`
}

// Summarize returns the listing of a skill.
func (s *Skill) Summarize() SkillSummary {
	out := SkillSummary{Name: s.Name, Description: s.Description, Version: s.Version, Handoffs: s.Handoffs}
	for _, t := range s.Tools {
		out.Tools = append(out.Tools, t.Name)
	}
	return out
}
