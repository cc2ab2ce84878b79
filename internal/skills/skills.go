// Package skills defines bundled agent skills (seed 000): a skill is a
// directory with a SKILL.md — YAML front matter (name, description,
// version, the tools it declares, the skills it may hand off to) and a
// markdown body of instructions for the planner. Its tools are hosted by
// executors as hidden catalog actions (ActionName), so every tool call goes
// through the same admission, policy, approvals, idempotency and audit as
// any action. Skills are published to the catalog bucket beside the
// actions, under keys no action can have (Key).
package skills

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
)

// The five runtime actions of skills (seed 000). The first four change
// planner state and run in the dispatcher; ExecuteTool runs one tool of
// the active skill on an executor.
const (
	ListSkills  = "list_agent_skills"
	ReadSkill   = "read_agent_skill"
	UseSkill    = "use_agent_skill"
	Handoff     = "handoff_to_skill"
	ExecuteTool = "execute_skill_tool"
)

// Mutator reports whether name is one of the four skill actions that
// change planner state (refused inside plans).
func Mutator(name string) bool {
	return name == ListSkills || name == ReadSkill || name == UseSkill || name == Handoff
}

// Runtime reports whether name is a runtime action of skills, handled by
// the dispatcher (a tool may never be named so).
func Runtime(name string) bool { return Mutator(name) || name == ExecuteTool }

// Bounds of a skill: its instructions live in run state once read.
const (
	MaxInstructionsBytes = 32 << 10
	MaxTools             = 64
	MaxHandoffs          = 16
)

// Non-terminal result kinds (seed 000): a tool result of one of these is
// a preparatory step, never the run's final evidence.
var NonTerminalKinds = map[string]bool{
	"resolution": true, "lookup": true, "preparatory": true, "intermediate": true, "partial": true, "other": true,
}

// Skill is one bundled skill.
type Skill struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Version of the skill; default "1".
	Version string `json:"version,omitempty"`
	// Tools are the tools the skill declares.
	Tools []Tool `json:"tools,omitempty"`
	// Handoffs are the skills handoff_to_skill may move to from this one.
	Handoffs []string `json:"handoffs,omitempty"`
	// Instructions are SKILL.md's body: what the planner is told while
	// the skill is active.
	Instructions string `json:"instructions,omitempty"`
	// Pool is the pool whose executors host the tools (set when
	// published).
	Pool string `json:"pool,omitempty"`
}

// Tool is one tool a skill declares.
type Tool struct {
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
	Permission *actions.Permission `json:"permission,omitempty"`
}

// ActionName is the catalog action that runs tool of skill.
func ActionName(skill, tool string) string { return "skill." + skill + "." + tool }

var nameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

// ValidName reports whether name may name a skill or a tool: 1 to 64
// lower-case letters, digits, '_' or '-', starting with a letter or a
// digit.
func ValidName(name string) bool { return nameRe.MatchString(name) }

// Tool returns the tool the skill declares by name.
func (s *Skill) Tool(name string) (*Tool, bool) {
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
// kinds and modes are known, and the instructions fit MaxInstructionsBytes.
func (s *Skill) Validate() error {
	bad := func(format string, a ...any) error {
		return actionbus.Errorf(actionbus.CodeInvalidSkill, "skill %q: "+format, append([]any{s.Name}, a...)...)
	}
	if !nameRe.MatchString(s.Name) {
		return bad("the name must be 1–64 lower-case letters, digits, '_' or '-'")
	}
	if strings.TrimSpace(s.Description) == "" {
		return bad("a description is required")
	}
	if len(s.Instructions) > MaxInstructionsBytes {
		return bad("instructions are %d bytes; at most %d", len(s.Instructions), MaxInstructionsBytes)
	}
	if len(s.Tools) > MaxTools || len(s.Handoffs) > MaxHandoffs {
		return bad("at most %d tools and %d handoff targets", MaxTools, MaxHandoffs)
	}
	seen := map[string]bool{}
	for _, t := range s.Tools {
		switch {
		case !nameRe.MatchString(t.Name):
			return bad("tool %q: the name must be 1–64 lower-case letters, digits, '_' or '-'", t.Name)
		case Runtime(t.Name):
			return bad("tool %q: a runtime action's name", t.Name)
		case seen[t.Name]:
			return bad("tool %q declared twice", t.Name)
		case t.ResultKind != "" && t.ResultKind != "final" && t.ResultKind != "evidence" && !NonTerminalKinds[t.ResultKind]:
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
		if !nameRe.MatchString(h) || h == s.Name {
			return bad("handoff target %q is not another skill's name", h)
		}
	}
	return nil
}

// Parse reads a SKILL.md: front matter between "---" lines, then the
// instructions. The version defaults to "1".
func Parse(doc []byte) (Skill, error) {
	doc = bytes.TrimPrefix(doc, []byte("\ufeff"))
	rest, ok := bytes.CutPrefix(bytes.TrimLeft(doc, "\r\n"), []byte("---"))
	if !ok {
		return Skill{}, actionbus.Errorf(actionbus.CodeInvalidSkill, "SKILL.md must start with YAML front matter between --- lines")
	}
	front, body, ok := bytes.Cut(rest, []byte("\n---"))
	if !ok {
		return Skill{}, actionbus.Errorf(actionbus.CodeInvalidSkill, "SKILL.md front matter is not closed by a --- line")
	}
	// YAML to JSON, then the JSON field names: one set of names for the
	// front matter, the catalog and the wire (permission metadata
	// included), and unknown fields refused.
	var fields map[string]any
	if err := yaml.Unmarshal(front, &fields); err != nil {
		return Skill{}, actionbus.Errorf(actionbus.CodeInvalidSkill, "SKILL.md front matter: %v", err)
	}
	j, err := json.Marshal(fields)
	if err != nil {
		return Skill{}, actionbus.Errorf(actionbus.CodeInvalidSkill, "SKILL.md front matter: %v", err)
	}
	var s Skill
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return Skill{}, actionbus.Errorf(actionbus.CodeInvalidSkill, "SKILL.md front matter: %v", err)
	}
	if s.Instructions != "" || s.Pool != "" {
		return Skill{}, actionbus.Errorf(actionbus.CodeInvalidSkill, "SKILL.md front matter: instructions are the body and pool is the host's; neither is a field")
	}
	if _, after, ok := bytes.Cut(body, []byte("\n")); ok {
		body = after // the rest of the closing --- line
	} else {
		body = nil
	}
	s.Instructions = strings.TrimSpace(string(body))
	if s.Version == "" {
		s.Version = "1"
	}
	return s, s.Validate()
}

// Load reads dir/SKILL.md from fsys.
func Load(fsys fs.FS, dir string) (Skill, error) {
	b, err := fs.ReadFile(fsys, path.Join(dir, "SKILL.md"))
	if err != nil {
		return Skill{}, fmt.Errorf("skills: %w", err)
	}
	s, err := Parse(b)
	if err != nil {
		return Skill{}, fmt.Errorf("skills: %s: %w", dir, err)
	}
	return s, nil
}

// Summary is a skill as list_agent_skills shows it.
type Summary struct {
	Name        string   `json:"name"`
	Description string   `json:"description"`
	Version     string   `json:"version,omitempty"`
	Tools       []string `json:"tools,omitempty"`
	Handoffs    []string `json:"handoffs,omitempty"`
}

// Summarize returns the listing of a skill.
func (s *Skill) Summarize() Summary {
	out := Summary{Name: s.Name, Description: s.Description, Version: s.Version, Handoffs: s.Handoffs}
	for _, t := range s.Tools {
		out.Tools = append(out.Tools, t.Name)
	}
	return out
}

// keyMarker separates skills from actions in the catalog bucket.
const keyMarker = actions.SkillKeyMarker

// Key is the catalog bucket key of a skill hosted by pool.
func Key(pool, name string) string { return pool + "." + keyMarker + "." + name }

// ErrNotFound matches a skill that is not in the catalog.
var ErrNotFound = actionbus.ErrSkillNotFound
