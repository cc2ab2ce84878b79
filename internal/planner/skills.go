package planner

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/skills"
)

// The skill actions as planner-visible entries: offered when the catalog
// holds skills, run by the dispatcher (the four that change planner state)
// or on the active skill's executor (execute_skill_tool).
var skillEntries = func() []actions.Entry {
	obj := func(props map[string]any, required ...string) json.RawMessage {
		return objectSchema(props, true, required...)
	}
	name := map[string]any{"type": "string", "description": "the skill's name"}
	keep := map[string]any{"type": "object", "properties": map[string]any{"keepLast": map[string]any{"type": "integer", "minimum": 0}}}
	defs := []actions.Definition{
		{Name: skills.ListSkills, Description: "List the bundled agent skills: name, description, tools, handoff targets.",
			InputSchema: obj(map[string]any{})},
		{Name: skills.ReadSkill, Description: "Read one skill's instructions into the run (then use_agent_skill activates it).",
			InputSchema: obj(map[string]any{"skillName": name}, "skillName")},
		{Name: skills.UseSkill, Description: "Activate the skill read last: its instructions and tools apply from the next step.",
			InputSchema: obj(map[string]any{"skillName": name})},
		{Name: skills.Handoff, Description: "Hand the task over to another skill the active one allows, with context; inputFilter trims the history it sees.",
			InputSchema: obj(map[string]any{"skillName": name, "handoffContext": map[string]any{"type": "string"},
				"inputFilter": map[string]any{"type": "object", "properties": map[string]any{"actionHistory": keep, "toolHistory": keep}}}, "skillName")},
		{Name: skills.ExecuteTool, Description: "Run one tool of the active skill with its arguments in args.",
			InputSchema: obj(map[string]any{"skillName": name, "toolName": map[string]any{"type": "string"},
				"args": map[string]any{"type": "object"}}, "toolName")},
	}
	out := make([]actions.Entry, 0, len(defs))
	for _, d := range defs {
		d.Mode, d.Version, d.Pool = actions.ModeRead, "1", "dispatcher"
		d.Planner = &actions.PlannerMeta{StateMutator: skills.Mutator(d.Name)}
		out = append(out, actions.Entry{Definition: d})
	}
	return out
}()

// withSkills adds the skill actions to the planner-visible actions when
// the catalog holds skills.
func withSkills(entries []actions.Entry, hasSkills bool) []actions.Entry {
	if !hasSkills {
		return entries
	}
	return append(append([]actions.Entry{}, entries...), skillEntries...)
}

// skillToolPrefix names the active skill's tools as native tools, so a
// model calls them directly; a call becomes execute_skill_tool.
const skillToolPrefix = "skill__"

// skillPrompt tells the planner about the active skill: its instructions,
// its tools (called with execute_skill_tool, or natively), its handoffs.
func skillPrompt(sk *events.SkillContext, native bool) string {
	if sk == nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Active skill: %s — %s\n", sk.Name, sk.Description)
	if sk.HandoffContext != "" {
		fmt.Fprintf(&b, "Handed over with this context: %s\n", sk.HandoffContext)
	}
	if sk.Instructions != "" {
		fmt.Fprintf(&b, "\nSkill instructions:\n%s\n", sk.Instructions)
	}
	if len(sk.Tools) > 0 {
		if native {
			fmt.Fprintf(&b, "\nThe skill's tools are the functions named %s<tool>; call them directly.\n", skillToolPrefix)
		} else {
			b.WriteString("\nThe skill's tools run with execute_skill_tool {\"toolName\": ..., \"args\": {...}}:\n")
		}
		for _, t := range sk.Tools {
			params, _ := json.Marshal(t.Parameters)
			fmt.Fprintf(&b, "- %s: %s", t.Name, t.Description)
			if t.Parameters != nil {
				fmt.Fprintf(&b, " parameters: %s", params)
			}
			if t.ResultKind != "" && t.ResultKind != "final" && t.ResultKind != "evidence" {
				fmt.Fprintf(&b, " (a %s step: continue with the next call afterwards, do not finish on it)", t.ResultKind)
			}
			b.WriteString("\n")
		}
	}
	if len(sk.Handoffs) > 0 {
		fmt.Fprintf(&b, "\nIt may hand off (handoff_to_skill) to: %s.\n", strings.Join(sk.Handoffs, ", "))
	}
	return b.String()
}

// skillTools are the active skill's tools as native function tools.
func skillTools(sk *events.SkillContext) []nativeTool {
	if sk == nil {
		return nil
	}
	out := make([]nativeTool, 0, len(sk.Tools))
	for _, t := range sk.Tools {
		params := t.Parameters
		if params == nil {
			params = map[string]any{"type": "object", "properties": map[string]any{}}
		}
		out = append(out, nativeTool{name: actions.ToolName(skillToolPrefix + t.Name), description: t.Description, params: params})
	}
	return out
}

// fromSkillTool maps a native call of an active skill's tool to the
// execute_skill_tool decision it stands for.
func fromSkillTool(sk *events.SkillContext, fn string, args map[string]any) (events.Decision, bool) {
	if sk == nil || !strings.HasPrefix(fn, skillToolPrefix) {
		return events.Decision{}, false
	}
	for _, t := range sk.Tools {
		if actions.ToolName(skillToolPrefix+t.Name) == fn {
			if args == nil {
				args = map[string]any{}
			}
			return events.Decision{Type: events.DecisionAction, Name: skills.ExecuteTool,
				Args: map[string]any{"skillName": sk.Name, "toolName": t.Name, "args": args}}, true
		}
	}
	return events.Decision{}, false
}

// objectSchema is the JSON Schema of an object with props, required keys
// and, when additional, other keys allowed.
func objectSchema(props map[string]any, additional bool, required ...string) json.RawMessage {
	s := map[string]any{"type": "object", "properties": props, "additionalProperties": additional}
	if len(required) > 0 {
		s["required"] = required
	}
	b, _ := json.Marshal(s)
	return b
}
