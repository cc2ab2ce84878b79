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
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/catalog"
	"github.com/actionbus/actionbus/internal/actions"
)

// The five runtime actions of skills (seed 000), defined in the public
// package catalog. The first four change planner state and run in the
// dispatcher; ExecuteTool runs one tool of the active skill on an
// executor.
const (
	ListSkills  = catalog.ActionListSkills
	ReadSkill   = catalog.ActionReadSkill
	UseSkill    = catalog.ActionUseSkill
	Handoff     = catalog.ActionHandoffToSkill
	ExecuteTool = catalog.ActionExecuteSkillTool
)

// Mutator reports whether name is one of the four skill actions that
// change planner state (refused inside plans).
func Mutator(name string) bool { return catalog.SkillStateAction(name) }

// Runtime reports whether name is a runtime action of skills, handled by
// the dispatcher (a tool may never be named so).
func Runtime(name string) bool { return catalog.SkillRuntimeAction(name) }

// Bounds of a skill (see package catalog): its instructions live in run
// state once read.
const (
	MaxInstructionsBytes = catalog.MaxSkillInstructionsBytes
	MaxTools             = catalog.MaxSkillTools
	MaxHandoffs          = catalog.MaxSkillHandoffs
)

// Skill is one bundled skill, Tool one tool it declares and Summary a
// skill as list_agent_skills shows it; defined in the public package
// catalog (as catalog.Skill, catalog.SkillTool and catalog.SkillSummary),
// whose documentation shows the fields.
type (
	Skill   = catalog.Skill
	Tool    = catalog.SkillTool
	Summary = catalog.SkillSummary
)

// NonTerminalKind reports whether a tool result of kind is a preparatory
// step, never the run's final evidence (seed 000).
func NonTerminalKind(kind string) bool { return catalog.NonTerminalKind(kind) }

// ValidName reports whether name may name a skill or a tool (see
// catalog.ValidSkillName).
func ValidName(name string) bool { return catalog.ValidSkillName(name) }

// ActionName is the catalog action that runs tool of skill.
func ActionName(skill, tool string) string { return "skill." + skill + "." + tool }

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

// keyMarker separates skills from actions in the catalog bucket.
const keyMarker = actions.SkillKeyMarker

// Key is the catalog bucket key of a skill hosted by pool.
func Key(pool, name string) string { return pool + "." + keyMarker + "." + name }

// ErrNotFound matches a skill that is not in the catalog.
var ErrNotFound = actionbus.ErrSkillNotFound
