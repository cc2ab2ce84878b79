package run

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/skills"
)

// Skills (seed 000). The four skill actions that change planner state —
// list_agent_skills, read_agent_skill, use_agent_skill, handoff_to_skill —
// run in the dispatcher: their result is an observation and the planner is
// asked again. execute_skill_tool is resolved against the active skill
// and becomes a call of the tool's hidden action (skill.<skill>.<tool>),
// admitted, judged by policy, dispatched and audited as any action; its
// result is wrapped in the seed's tool envelope.

// SkillState is an agent run's skill state.
type SkillState struct {
	// Listed names the skills list_agent_skills showed.
	Listed []string `json:"listed,omitempty"`
	// Read is the skill read_agent_skill loaded last; use_agent_skill
	// activates it.
	Read *skills.Skill `json:"read,omitempty"`
	// Active is the active skill: its instructions and tools go to the
	// planner, and execute_skill_tool runs its tools.
	Active *skills.Skill `json:"active,omitempty"`
	// HandoffChain names the skills the run moved through by handoffs, in
	// order, starting with the one first handed off from.
	HandoffChain []string `json:"handoffChain,omitempty"`
	// HandoffContext is what the last handoff told the next skill.
	HandoffContext string `json:"handoffContext,omitempty"`
}

// maxListedSkills bounds the skills list_agent_skills shows and run state
// remembers.
const maxListedSkills = 256

// skillsOf returns the run's skill state, created when missing.
func skillsOf(st *State) *SkillState {
	if st.Agent.Skills == nil {
		st.Agent.Skills = &SkillState{}
	}
	return st.Agent.Skills
}

// onSkillAction runs one of the four skill actions that change planner
// state, records its result as an observation and asks the planner again.
// A handoff to a skill already in the handoff chain halts the run.
func (m *Machine) onSkillAction(ctx context.Context, st *State, dec events.Decision) ([]Effect, error) {
	sk := skillsOf(st)
	name, _ := dec.Args["skillName"].(string)
	var out map[string]any
	var summary string
	var failed *actionbus.Error
	notFound := func(err error) (bool, error) {
		var abErr *actionbus.Error
		if errors.As(err, &abErr) && abErr.Code == actionbus.CodeSkillNotFound {
			failed = abErr
			return true, nil
		}
		return false, err
	}
	switch dec.Name {
	case skills.ListSkills:
		all, err := m.env.Skills(ctx)
		if err != nil {
			return nil, err
		}
		list := make([]skills.Summary, 0, len(all))
		sk.Listed = sk.Listed[:0]
		for _, s := range all {
			if len(sk.Listed) < maxListedSkills && !slices.Contains(sk.Listed, s.Name) {
				sk.Listed = append(sk.Listed, s.Name)
				list = append(list, s.Summarize())
			}
		}
		out, summary = map[string]any{"kind": "agent_skills", "skills": list}, fmt.Sprintf("%d skill(s)", len(list))
	case skills.ReadSkill:
		s, err := m.env.Skill(ctx, name)
		if err != nil {
			if ok, err := notFound(err); !ok {
				return nil, err
			}
			break
		}
		sk.Read = s
		out = map[string]any{"kind": "agent_skill", "skill": s.Summarize(), "instructions": s.Instructions}
		summary = "read skill " + s.Name
	case skills.UseSkill:
		switch {
		case sk.Read == nil:
			failed = actionbus.Errorf(actionbus.CodeSkillNotActive, "read a skill with read_agent_skill first; use_agent_skill activates the last-read skill")
		case name != "" && name != sk.Read.Name:
			failed = actionbus.Errorf(actionbus.CodeSkillNotActive, "use_agent_skill activates the last-read skill %q, not %q; read %q first", sk.Read.Name, name, name).
				WithDetail("skillName", name).WithDetail("lastRead", sk.Read.Name)
		default:
			sk.Active = sk.Read
			out = map[string]any{"kind": "agent_skill_activated", "skill": sk.Active.Summarize()}
			summary = "active skill " + sk.Active.Name
		}
	case skills.Handoff:
		if sk.Active == nil {
			failed = actionbus.Errorf(actionbus.CodeSkillNotActive, "handoff_to_skill moves on from the active skill; activate one first")
			break
		}
		chain := sk.HandoffChain
		if len(chain) == 0 {
			chain = []string{sk.Active.Name}
		}
		if slices.Contains(chain, name) {
			err := actionbus.Errorf(actionbus.CodeHandoffCycle, "handoff to %q would return to a skill already in the handoff chain %s", name, strings.Join(chain, " → ")).
				WithDetail("skillName", name).WithDetail("handoffChain", chain)
			return append([]Effect{step(st, StepActionFailed, nil, dec.Name, err.Message, "failed")}, m.fail(st, err)...), nil
		}
		if !sk.Active.AllowsHandoff(name) {
			failed = actionbus.Errorf(actionbus.CodeHandoffRefused, "skill %q does not hand off to %q (it may hand off to: %s)", sk.Active.Name, name, orNone(sk.Active.Handoffs)).
				WithDetail("skillName", name).WithDetail("from", sk.Active.Name)
			break
		}
		s, err := m.env.Skill(ctx, name)
		if err != nil {
			if ok, err := notFound(err); !ok {
				return nil, err
			}
			break
		}
		trimmed := trimHistory(st, dec.Args["inputFilter"])
		from := sk.Active.Name
		sk.HandoffChain = append(chain, name)
		sk.Active, sk.Read = s, nil
		sk.HandoffContext, _ = dec.Args["handoffContext"].(string)
		out = map[string]any{"kind": "agent_skill_handoff", "from": from, "to": name, "handoffChain": sk.HandoffChain,
			"handoffContext": sk.HandoffContext, "trimmed": trimmed, "skill": s.Summarize()}
		summary = "handed off from " + from + " to " + name
	}
	return append(m.observeRuntime(st, dec.Name, out, summary, failed), m.askPlanner(st)...), nil
}

// observeRuntime records the result of an action the dispatcher ran
// itself (a skill or workspace action) as an observation, and its step;
// a failure is also the planner's feedback.
func (m *Machine) observeRuntime(st *State, name string, out any, summary string, failed *actionbus.Error) []Effect {
	obs := events.Observation{Cycle: st.Cycle, Action: name, OK: failed == nil, Summary: summary}
	var steps []Effect
	if failed != nil {
		obs.Error = failed.WithDetail("action", name)
		st.Agent.Feedback = failed
		steps = append(steps, step(st, StepActionFailed, nil, name, string(failed.Code)+": "+failed.Message, "failed"))
	} else {
		obs.Output = digest(jsonValue(out), m.lim.ObservationBytes)
		steps = append(steps, step(st, StepActionCompleted, nil, name, summary+" (dispatcher)", "ok"))
	}
	st.Agent.Observations = append(st.Agent.Observations, obs)
	return steps
}

// trimHistory applies a handoff's inputFilter to the run's observations:
// toolHistory.keepLast keeps that many of the last skill tool results,
// actionHistory.keepLast that many of the other observations; a filter
// left out keeps everything. It returns how many of each it dropped.
func trimHistory(st *State, filter any) map[string]int {
	f, _ := filter.(map[string]any)
	keep := func(key string) int {
		h, _ := f[key].(map[string]any)
		switch n := h["keepLast"].(type) {
		case float64:
			return max(int(n), 0)
		case int:
			return max(n, 0)
		}
		return -1 // no limit
	}
	keepTools, keepActions := keep("toolHistory"), keep("actionHistory")
	isTool := func(o events.Observation) bool { return o.Action == skills.ExecuteTool }
	count := func(tool bool) int {
		n := 0
		for _, o := range st.Agent.Observations {
			if isTool(o) == tool {
				n++
			}
		}
		return n
	}
	tools, others := count(true), count(false)
	dropTools, dropOthers := 0, 0
	if keepTools >= 0 && tools > keepTools {
		dropTools = tools - keepTools
	}
	if keepActions >= 0 && others > keepActions {
		dropOthers = others - keepActions
	}
	kept := st.Agent.Observations[:0]
	seenTools, seenOthers := 0, 0
	for _, o := range st.Agent.Observations {
		if isTool(o) {
			if seenTools++; seenTools <= dropTools {
				continue
			}
		} else if seenOthers++; seenOthers <= dropOthers {
			continue
		}
		kept = append(kept, o)
	}
	st.Agent.Observations = kept
	return map[string]int{"toolHistory": dropTools, "actionHistory": dropOthers}
}

// resolveSkillTool turns an execute_skill_tool decision into a call of the
// active skill's tool: the tool must be one the active skill declares
// (skillName, when given, must name the active skill), never a runtime or
// catalog action's name; arguments a model flattened beside toolName are
// lifted into the tool's arguments (auto-heal, reported as healed). The
// tool's arguments are then checked against its parameters by admission.
func (m *Machine) resolveSkillTool(ctx context.Context, st *State, dec events.Decision) (events.Decision, *skills.Tool, []string, *actionbus.Error, error) {
	refuse := func(format string, a ...any) *actionbus.Error {
		return actionbus.Errorf(actionbus.CodeSkillToolRefused, format, a...).WithDetail("action", skills.ExecuteTool)
	}
	var active *skills.Skill
	if st.Agent != nil && st.Agent.Skills != nil {
		active = st.Agent.Skills.Active
	}
	if active == nil {
		return dec, nil, nil, actionbus.Errorf(actionbus.CodeSkillNotActive,
			"execute_skill_tool runs a tool of the active skill; read and activate a skill first (read_agent_skill, use_agent_skill)").
			WithDetail("action", skills.ExecuteTool), nil
	}
	toolName, _ := dec.Args["toolName"].(string)
	if skillName, _ := dec.Args["skillName"].(string); skillName != "" && skillName != active.Name {
		return dec, nil, nil, refuse("skillName %q is not the active skill %q", skillName, active.Name).WithDetail("skillName", skillName), nil
	}
	if toolName == "" {
		return dec, nil, nil, refuse("execute_skill_tool needs a toolName (tools of %s: %s)", active.Name, orNone(toolNames(active))), nil
	}
	if skills.Runtime(toolName) {
		return dec, nil, nil, refuse("%s is a runtime action, not a tool; call it directly", toolName).WithDetail("toolName", toolName), nil
	}
	if _, err := m.env.Action(ctx, toolName); err == nil {
		return dec, nil, nil, refuse("%s is an action, not a tool of skill %s; call it directly", toolName, active.Name).WithDetail("toolName", toolName), nil
	} else if !errors.Is(err, actionbus.ErrActionNotFound) {
		if ctx.Err() != nil {
			return dec, nil, nil, nil, err
		}
		return dec, nil, nil, lookupRefusal(toolName, err), nil
	}
	tool, ok := active.Tool(toolName)
	if !ok {
		return dec, nil, nil, refuse("skill %s has no tool %q (its tools: %s)", active.Name, toolName, orNone(toolNames(active))).WithDetail("toolName", toolName), nil
	}
	args := map[string]any{}
	var healed []string
	switch given := dec.Args["args"].(type) {
	case nil:
	case map[string]any:
		args = given
	default:
		return dec, nil, nil, refuse("execute_skill_tool args must be an object"), nil
	}
	if len(args) == 0 {
		// Auto-heal: a model that put the tool's arguments beside
		// toolName meant them as the tool's.
		for k, v := range dec.Args {
			switch k {
			case "skillName", "toolName", "args", "reasoning":
				continue
			}
			args[k] = v
			healed = append(healed, k)
		}
		slices.Sort(healed)
	}
	dec.Name, dec.Args = skills.ActionName(active.Name, tool.Name), args
	return dec, tool, healed, nil, nil
}

// toolEnvelope wraps a skill tool's output as the seed's envelope: the
// tool's result, with resultKind (the result's own, else the tool's
// default) and _meta hoisted beside it, and a final result's markdown.
func toolEnvelope(c CallState, tool *skills.Tool, output any) map[string]any {
	env := map[string]any{"kind": "skill_tool_result", "skill": c.Skill, "tool": c.Tool, "result": output}
	res, _ := output.(map[string]any)
	kind, _ := res["resultKind"].(string)
	if kind == "" && tool != nil {
		kind = tool.ResultKind
	}
	if kind != "" {
		env["resultKind"] = kind
	}
	if meta, ok := res["_meta"]; ok {
		env["_meta"] = meta
	}
	if kind == "final" {
		if md, ok := res["markdown"].(string); ok {
			env["markdown"] = md
		}
	}
	return env
}

// activeTool returns the declaration of call c's tool in the run's active
// skill (nil when the skill is no longer active).
func activeTool(st *State, c CallState) *skills.Tool {
	if st.Agent == nil || st.Agent.Skills == nil || st.Agent.Skills.Active == nil || st.Agent.Skills.Active.Name != c.Skill {
		return nil
	}
	t, _ := st.Agent.Skills.Active.Tool(c.Tool)
	return t
}

func toolNames(s *skills.Skill) []string {
	out := make([]string, 0, len(s.Tools))
	for _, t := range s.Tools {
		out = append(out, t.Name)
	}
	return out
}

func orNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// skillContext is the active skill as the planner sees it (nil when none).
func skillContext(sk *SkillState) *events.SkillContext {
	if sk == nil || sk.Active == nil {
		return nil
	}
	a := sk.Active
	out := &events.SkillContext{Name: a.Name, Description: a.Description, Version: a.Version, Instructions: a.Instructions,
		Handoffs: a.Handoffs, HandoffChain: sk.HandoffChain, HandoffContext: sk.HandoffContext}
	for _, t := range a.Tools {
		out.Tools = append(out.Tools, events.SkillTool{Name: t.Name, Description: t.Description, Parameters: t.Parameters, ResultKind: t.ResultKind})
	}
	return out
}

// activeSkill names the run's active skill, or is empty.
func (st *State) activeSkill() string {
	if st.Agent == nil || st.Agent.Skills == nil || st.Agent.Skills.Active == nil {
		return ""
	}
	return st.Agent.Skills.Active.Name
}
