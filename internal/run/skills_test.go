package run

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/skills"
)

var reportSkill = skills.Skill{Name: "report", Description: "Build a report.", Instructions: "Count rows, then render.",
	Handoffs: []string{"review"},
	Tools: []skills.Tool{
		{Name: "count_rows", Description: "Count rows of a table.", Parameters: map[string]any{"type": "object",
			"properties": map[string]any{"table": map[string]any{"type": "string"}}, "required": []any{"table"}, "additionalProperties": false}},
		{Name: "render", Description: "Render the report.", ResultKind: "final"},
		{Name: "lookup", Description: "Look something up.", ResultKind: "lookup"},
		{Name: "publish", Description: "Publish the report.", Mode: "mutate", Tier: 2},
	}}

var reviewSkill = skills.Skill{Name: "review", Description: "Review a report.", Instructions: "Check the figures.",
	Handoffs: []string{"report"}, Tools: []skills.Tool{{Name: "check", Description: "Check a report."}}}

// skillHarness is an agent run with the report and review skills in the
// catalog.
func skillHarness(t *testing.T) *harness {
	h := newHarness(t, events.RunLimits{})
	h.env.addSkill(t, reportSkill)
	h.env.addSkill(t, reviewSkill)
	return h.start(events.RunRequested{Prompt: "report", AllowedModes: allModes})
}

// activate reads and uses a skill.
func (h *harness) activate(name string) {
	h.t.Helper()
	h.decide(action(skills.ReadSkill, map[string]any{"skillName": name}))
	h.decide(action(skills.UseSkill, map[string]any{"skillName": name}))
	require.Equal(h.t, name, h.st.Agent.Skills.Active.Name)
}

// lastObs is the run's last observation.
func (h *harness) lastObs() events.Observation {
	obs := h.st.Agent.Observations
	require.NotEmpty(h.t, obs)
	return obs[len(obs)-1]
}

// decisionRequest renders the last decision request.
func (h *harness) decisionRequest() *events.DecisionRequested {
	h.t.Helper()
	for i := len(h.all) - 1; i >= 0; i-- {
		if h.all[i].Kind == EffectDecide {
			em, ok := Render(h.st, h.all[i])
			require.True(h.t, ok)
			return em.Data.(*events.DecisionRequested)
		}
	}
	h.t.Fatal("no decision request")
	return nil
}

func TestSkillActionsListReadUseAndRunATool(t *testing.T) {
	h := skillHarness(t)
	h.decide(action(skills.ListSkills, nil))
	obs := h.lastObs()
	assert.True(t, obs.OK)
	assert.Equal(t, skills.ListSkills, obs.Action)
	listed := obs.Output.(map[string]any)["skills"].([]any) // as stored: JSON
	require.Len(t, listed, 2)
	assert.Equal(t, []any{"count_rows", "render", "lookup", "publish"}, listed[0].(map[string]any)["tools"])
	assert.Nil(t, h.decisionRequest().Skill, "no skill is active yet")

	h.decide(action(skills.ReadSkill, map[string]any{"skillName": "report"}))
	assert.Equal(t, "Count rows, then render.", h.lastObs().Output.(map[string]any)["instructions"], "the document is loaded into run state")
	assert.Nil(t, h.st.Agent.Skills.Active, "reading does not activate")
	h.decide(action(skills.UseSkill, map[string]any{"skillName": "report"}))
	req := h.decisionRequest()
	require.NotNil(t, req.Skill, "the planner sees the active skill")
	assert.Equal(t, "Count rows, then render.", req.Skill.Instructions)
	assert.Len(t, req.Skill.Tools, 4)
	assert.Equal(t, []string{"review"}, req.Skill.Handoffs)

	h.decide(action(skills.ExecuteTool, map[string]any{"toolName": "count_rows", "args": map[string]any{"table": "jobs"}}))
	calls := h.dispatched()
	require.Len(t, calls, 1)
	assert.Equal(t, "skill.report.count_rows", calls[0].Action, "the tool runs as its hidden action")
	assert.Equal(t, map[string]any{"table": "jobs"}, calls[0].Args)
	h.succeed(calls[0].CallID, map[string]any{"rows": 3.0, "resultKind": "evidence", "_meta": map[string]any{"source": "db"}})
	obs = h.lastObs()
	assert.Equal(t, skills.ExecuteTool, obs.Action)
	assert.Equal(t, map[string]any{"kind": "skill_tool_result", "skill": "report", "tool": "count_rows", "resultKind": "evidence",
		"_meta": map[string]any{"source": "db"}, "result": map[string]any{"rows": 3.0, "resultKind": "evidence", "_meta": map[string]any{"source": "db"}}},
		obs.Output, "resultKind and _meta are hoisted onto the envelope")
}

func TestExecuteSkillToolIsRefusedBeforeAnythingRuns(t *testing.T) {
	for _, tc := range []struct {
		name   string
		active bool
		args   map[string]any
		code   actionbus.Code
	}{
		{"no active skill", false, map[string]any{"toolName": "count_rows", "args": map[string]any{"table": "t"}}, actionbus.CodeSkillNotActive},
		{"skillName is not the active skill", true, map[string]any{"skillName": "review", "toolName": "check"}, actionbus.CodeSkillToolRefused},
		{"a tool the skill does not declare", true, map[string]any{"toolName": "drop_table"}, actionbus.CodeSkillToolRefused},
		{"a runtime action's name", true, map[string]any{"toolName": skills.ReadSkill}, actionbus.CodeSkillToolRefused},
		{"a catalog action's name", true, map[string]any{"toolName": "t.read"}, actionbus.CodeSkillToolRefused},
		{"args that are not an object", true, map[string]any{"toolName": "count_rows", "args": "jobs"}, actionbus.CodeSkillToolRefused},
		{"no toolName", true, map[string]any{}, actionbus.CodeSkillToolRefused},
		{"a missing required argument", true, map[string]any{"toolName": "count_rows", "args": map[string]any{"limit": 3.0}}, actionbus.CodeActionArgsInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := skillHarness(t)
			if tc.active {
				h.activate("report")
			}
			cycle := h.st.Cycle
			out := h.decide(action(skills.ExecuteTool, tc.args))
			assert.False(t, has(out, EffectAct), "nothing was dispatched")
			assert.Equal(t, tc.code, h.lastObs().Error.Code, "the planner sees why")
			assert.Equal(t, PhaseDeciding, h.st.Phase)
			assert.Equal(t, cycle+1, h.st.Cycle, "and is asked again")
			assert.False(t, h.st.IsTerminal())
		})
	}
}

// Tool arguments a model put beside toolName are lifted into the tool's
// arguments; when args is given and not empty, nothing is lifted.
func TestFlattenedToolArgsAreHealed(t *testing.T) {
	h := skillHarness(t)
	h.activate("report")
	out := h.decide(action(skills.ExecuteTool, map[string]any{"skillName": "report", "toolName": "count_rows", "table": "jobs", "reasoning": "count"}))
	require.Len(t, h.dispatched(), 1)
	assert.Equal(t, map[string]any{"table": "jobs"}, h.dispatched()[0].Args)
	assert.Contains(t, stepNames(out), string(StepActionArgsAutoHeal))

	h = skillHarness(t)
	h.activate("report")
	h.decide(action(skills.ExecuteTool, map[string]any{"toolName": "count_rows", "args": map[string]any{"table": "a"}, "table": "b"}))
	require.Len(t, h.dispatched(), 1)
	assert.Equal(t, "a", h.dispatched()[0].Args["table"], "args wins; nothing is lifted (the extra key is stripped)")
}

// A plan is preflighted whole: one unknown tool, or one skill state
// mutator, and nothing of the plan runs.
func TestAPlanOfSkillToolsIsPreflightedWhole(t *testing.T) {
	h := skillHarness(t)
	h.activate("report")
	out := h.decide(plan(
		action(skills.ExecuteTool, map[string]any{"toolName": "count_rows", "args": map[string]any{"table": "a"}}),
		action(skills.ExecuteTool, map[string]any{"toolName": "nope"})))
	assert.False(t, has(out, EffectAct), "no plan action ran")
	assert.Equal(t, actionbus.CodeSkillToolRefused, h.st.Agent.Feedback.Code)
	assert.Contains(t, stepNames(out), string(StepPlanValidationFailed))

	for _, m := range []string{skills.ListSkills, skills.ReadSkill, skills.UseSkill, skills.Handoff} {
		out = h.decide(plan(action("t.read", nil), action(m, map[string]any{"skillName": "report"})))
		assert.False(t, has(out, EffectAct), "%s in a plan: nothing ran", m)
		assert.Equal(t, actionbus.CodePlanRejected, h.st.Agent.Feedback.Code, m)
	}

	out = h.decide(plan(
		action(skills.ExecuteTool, map[string]any{"toolName": "count_rows", "args": map[string]any{"table": "a"}}),
		action(skills.ExecuteTool, map[string]any{"toolName": "lookup"})))
	assert.True(t, has(out, EffectAct))
	assert.Len(t, h.dispatched(), 2, "a valid plan of tools runs")
}

// A tool result of kind final with markdown ends the run with it; a
// non-terminal kind is never the run's end, even marked complete.
func TestToolResultKindsDecideWhetherTheRunEnds(t *testing.T) {
	h := skillHarness(t)
	h.activate("report")
	h.decide(action(skills.ExecuteTool, map[string]any{"toolName": "lookup"}))
	h.apply(&events.ActionCompleted{RunID: testRunID, CallID: h.dispatched()[0].CallID, Output: map[string]any{"id": "x"}, Complete: true, Executor: "x1"})
	assert.False(t, h.st.IsTerminal(), "a lookup is a preparatory step")
	assert.Equal(t, "lookup", h.lastObs().Output.(map[string]any)["resultKind"], "the tool's declared kind")

	h.decide(action(skills.ExecuteTool, map[string]any{"toolName": "render"}))
	h.succeed(h.dispatched()[0].CallID, map[string]any{"markdown": "# Report\n\n3 rows."})
	require.True(t, h.st.IsTerminal())
	assert.Equal(t, StatusCompleted, h.st.Status)
	assert.Equal(t, "# Report\n\n3 rows.", h.st.Terminal.Answer, "the direct-final path")
}

func TestHandoffTrimsHistoryAndHaltsOnACycle(t *testing.T) {
	h := skillHarness(t)
	h.decide(action(skills.Handoff, map[string]any{"skillName": "review"}))
	assert.Equal(t, actionbus.CodeSkillNotActive, h.lastObs().Error.Code, "a handoff needs an active skill")
	h.activate("report")
	for range 2 {
		h.decide(action(skills.ExecuteTool, map[string]any{"toolName": "lookup"}))
		h.succeed(h.dispatched()[0].CallID, map[string]any{"id": "x"})
	}
	h.decide(action("t.read", nil))
	h.succeed(h.dispatched()[0].CallID, nil)

	h.decide(action(skills.Handoff, map[string]any{"skillName": "report"}))
	assert.Equal(t, actionbus.CodeHandoffCycle, h.code(), "handing off to the active skill is a cycle")

	h = skillHarness(t)
	h.activate("report")
	for range 2 {
		h.decide(action(skills.ExecuteTool, map[string]any{"toolName": "lookup"}))
		h.succeed(h.dispatched()[0].CallID, map[string]any{"id": "x"})
	}
	require.Len(t, h.st.Agent.Observations, 4, "read, use, two tool results")
	h.decide(action(skills.Handoff, map[string]any{"skillName": "review", "handoffContext": "Counted. Review it.",
		"inputFilter": map[string]any{"toolHistory": map[string]any{"keepLast": 1.0}, "actionHistory": map[string]any{"keepLast": 0.0}}}))
	obs := h.st.Agent.Observations
	require.Len(t, obs, 2, "one tool result kept, no other history, then the handoff")
	assert.Equal(t, skills.ExecuteTool, obs[0].Action)
	assert.Equal(t, skills.Handoff, obs[1].Action)
	assert.Equal(t, map[string]any{"toolHistory": 1.0, "actionHistory": 2.0}, obs[1].Output.(map[string]any)["trimmed"])
	sk := h.st.Agent.Skills
	assert.Equal(t, "review", sk.Active.Name)
	assert.Equal(t, []string{"report", "review"}, sk.HandoffChain)
	req := h.decisionRequest()
	assert.Equal(t, "review", req.Skill.Name)
	assert.Equal(t, "Counted. Review it.", req.Skill.HandoffContext)

	h.decide(action(skills.Handoff, map[string]any{"skillName": "report"}))
	assert.Equal(t, actionbus.CodeHandoffCycle, h.code(), "report is already in the chain")
	assert.Equal(t, StatusFailed, h.st.Status)
}

func TestHandoffOnlyToAnAllowedTarget(t *testing.T) {
	h := newHarness(t, events.RunLimits{})
	h.env.addSkill(t, reportSkill)
	h.env.addSkill(t, reviewSkill)
	h.env.addSkill(t, skills.Skill{Name: "other", Description: "Other."})
	h.start(events.RunRequested{Prompt: "p"})
	h.activate("report")
	h.decide(action(skills.Handoff, map[string]any{"skillName": "other"}))
	assert.Equal(t, actionbus.CodeHandoffRefused, h.lastObs().Error.Code)
	assert.Equal(t, "report", h.st.Agent.Skills.Active.Name)
	h.decide(action(skills.Handoff, map[string]any{"skillName": "missing"}))
	assert.Equal(t, actionbus.CodeHandoffRefused, h.lastObs().Error.Code, "not a target, whether it exists or not")
}

func TestUseActivatesOnlyTheLastReadSkill(t *testing.T) {
	h := skillHarness(t)
	h.decide(action(skills.UseSkill, map[string]any{"skillName": "report"}))
	assert.Equal(t, actionbus.CodeSkillNotActive, h.lastObs().Error.Code, "read first")
	h.decide(action(skills.ReadSkill, map[string]any{"skillName": "nope"}))
	assert.Equal(t, actionbus.CodeSkillNotFound, h.lastObs().Error.Code)
	h.decide(action(skills.ReadSkill, map[string]any{"skillName": "report"}))
	h.decide(action(skills.UseSkill, map[string]any{"skillName": "review"}))
	assert.Equal(t, actionbus.CodeSkillNotActive, h.lastObs().Error.Code, "review was not the last read")
	h.decide(action(skills.UseSkill, nil))
	assert.Equal(t, "report", h.st.Agent.Skills.Active.Name, "without a name: the last read")
}

// A skill tool goes through the same policy as any action: a mutating
// tool of tier 2 waits for an approval.
func TestASkillToolGoesThroughPolicy(t *testing.T) {
	h := skillHarness(t)
	h.activate("report")
	out := h.decide(action(skills.ExecuteTool, map[string]any{"toolName": "publish"}))
	assert.True(t, has(out, EffectApproval), "the approval is requested")
	assert.False(t, has(out, EffectAct))
	assert.Equal(t, "skill.report.publish", h.st.Calls[0].Action)
}

// The host may override execute_skill_tool's policy (tier 0, allow, by
// default) for every skill tool; a tool's own explicit policy wins.
func TestTheHostOverridesExecuteSkillToolPolicy(t *testing.T) {
	h := skillHarness(t)
	h.env.policy = &policy.Evaluator{Config: &policy.Config{Actions: policy.Explicit{
		skills.ExecuteTool:        {Effect: policy.Deny, Reason: "no skill tools here"},
		"skill.report.count_rows": {Effect: policy.Allow, Reason: "counting is fine"},
	}}}
	h.activate("report")
	h.decide(action(skills.ExecuteTool, map[string]any{"toolName": "lookup"}))
	assert.Equal(t, actionbus.CodePolicyRejected, h.code(), "the generic override applies to the tool")

	h = skillHarness(t)
	h.env.policy = &policy.Evaluator{Config: &policy.Config{Actions: policy.Explicit{
		skills.ExecuteTool:        {Effect: policy.Deny, Reason: "no skill tools here"},
		"skill.report.count_rows": {Effect: policy.Allow, Reason: "counting is fine"},
	}}}
	h.activate("report")
	h.decide(action(skills.ExecuteTool, map[string]any{"toolName": "count_rows", "args": map[string]any{"table": "t"}}))
	assert.Len(t, h.dispatched(), 1, "the tool's own policy wins")
}
