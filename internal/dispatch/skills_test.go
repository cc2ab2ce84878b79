package dispatch_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
)

var skillFS = fstest.MapFS{
	"report/SKILL.md": {Data: []byte(`---
name: report
description: Build a delivery report.
handoffs: [review]
tools:
  - name: count_rows
    description: Count the rows of a table.
    parameters:
      type: object
      properties:
        table: {type: string}
      required: [table]
      additionalProperties: false
---
Count the rows, then hand off to review.
`)},
	"review/SKILL.md": {Data: []byte(`---
name: review
description: Review a report.
handoffs: [report]
tools:
  - name: approve_report
    description: Approve the report and write it.
    resultKind: final
---
Check the figures, then approve.
`)},
}

// registerSkills hosts the report and review skills; counted counts the
// count_rows calls.
func registerSkills(counted *atomic.Int32) func(*executor.Executor) error {
	return func(ex *executor.Executor) error {
		report, err := executor.LoadSkill(skillFS, "report")
		if err != nil {
			return err
		}
		review, err := executor.LoadSkill(skillFS, "review")
		if err != nil {
			return err
		}
		err = executor.RegisterSkill(ex, report, map[string]executor.ToolFunc{
			"count_rows": func(_ context.Context, args map[string]any, _ executor.Call) (map[string]any, error) {
				counted.Add(1)
				return map[string]any{"table": args["table"], "rows": 3, "resultKind": "evidence"}, nil
			},
		})
		if err != nil {
			return err
		}
		return executor.RegisterSkill(ex, review, map[string]executor.ToolFunc{
			"approve_report": func(context.Context, map[string]any, executor.Call) (map[string]any, error) {
				return map[string]any{"markdown": "# Report\n\n3 rows, approved."}, nil
			},
		})
	}
}

// A run through the real services with the script planner: the planner
// lists, reads and uses a skill, calls its tool on an executor (flattened
// arguments healed), hands off to a reviewing skill with its history
// trimmed, and that skill's final tool result is the run's answer.
func TestASkillRunListsReadsUsesCallsAndHandsOff(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "ab.>")
	var counted atomic.Int32
	st := srv.StartStack(t, actionbustest.StackOptions{Register: registerSkills(&counted), Scenarios: `
scenarios:
  skills:
    decisions:
      - {type: action, name: list_agent_skills, args: {}}
      - {type: action, name: read_agent_skill, args: {skillName: report}}
      - {type: action, name: use_agent_skill, args: {skillName: report}}
      - {type: action, name: execute_skill_tool, args: {toolName: count_rows, table: jobs}}
      - {type: action, name: handoff_to_skill, args: {skillName: review, handoffContext: "Counted.", inputFilter: {actionHistory: {keepLast: 0}, toolHistory: {keepLast: 1}}}}
      - {type: action, name: execute_skill_tool, args: {skillName: review, toolName: approve_report, args: {}}}
  cycle:
    decisions:
      - {type: action, name: read_agent_skill, args: {skillName: report}}
      - {type: action, name: use_agent_skill, args: {}}
      - {type: action, name: handoff_to_skill, args: {skillName: review}}
      - {type: action, name: handoff_to_skill, args: {skillName: report}}
  plan:
    decisions:
      - {type: action, name: read_agent_skill, args: {skillName: report}}
      - {type: action, name: use_agent_skill, args: {}}
      - {type: plan, actions: [{type: action, name: execute_skill_tool, args: {toolName: count_rows, args: {table: a}}}, {type: action, name: execute_skill_tool, args: {toolName: drop_table}}]}
      - {type: plan, actions: [{type: action, name: execute_skill_tool, args: {toolName: count_rows, args: {table: a}}}, {type: action, name: read_agent_skill, args: {skillName: review}}]}
      - {type: final, answer: "nothing ran"}
`})
	ctx := ctxT(t)
	res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "skills", Prompt: "report"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, "# Report\n\n3 rows, approved.", res.Answer, "the final tool result is the answer")
	assert.Equal(t, int32(1), counted.Load())

	// What the planner was shown, cycle by cycle.
	var reqs []events.DecisionRequested
	for _, r := range rec.All() {
		if r.Type() == events.TypeDecisionRequested && r.Event.Extensions()[events.ExtRunID] == res.RunID {
			var d events.DecisionRequested
			require.NoError(t, events.DataAs(r.Event, &d))
			reqs = append(reqs, d)
		}
	}
	require.Len(t, reqs, 6)
	assert.Nil(t, reqs[2].Skill, "read, not yet used")
	require.NotNil(t, reqs[3].Skill)
	assert.Equal(t, "Count the rows, then hand off to review.", reqs[3].Skill.Instructions)
	assert.Equal(t, "count_rows", reqs[3].Skill.Tools[0].Name)
	tool := reqs[4].Observations[len(reqs[4].Observations)-1]
	assert.Equal(t, "execute_skill_tool", tool.Action)
	out := tool.Output.(map[string]any)
	assert.Equal(t, "skill_tool_result", out["kind"])
	assert.Equal(t, "evidence", out["resultKind"])
	assert.Equal(t, "jobs", out["result"].(map[string]any)["table"], "the flattened argument reached the tool")
	require.NotNil(t, reqs[5].Skill)
	assert.Equal(t, "review", reqs[5].Skill.Name)
	assert.Equal(t, []string{"report", "review"}, reqs[5].Skill.HandoffChain)
	assert.Len(t, reqs[5].Observations, 2, "the tool result kept, the other history trimmed, then the handoff")

	// The tool ran as its hidden action, audited as any action.
	rec.WaitForAudit(t, 0, 1, func(a client.AuditRecord) bool {
		return a.RunID == res.RunID && a.Action == "skill.report.count_rows" && a.Status == "succeeded"
	})

	// A handoff back to a skill in the chain halts the run.
	res, err = st.Client.Run(ctx, client.RunRequest{Scenario: "cycle", Prompt: "p"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	assert.Equal(t, actionbus.CodeHandoffCycle, res.Error.Code)

	// A plan with an unknown tool, or with a skill state mutator, runs
	// nothing.
	before := counted.Load()
	res, err = st.Client.Run(ctx, client.RunRequest{Scenario: "plan", Prompt: "p"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, before, counted.Load(), "no plan action ran")
}

func TestSkillsAreListedFromTheCatalog(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	var counted atomic.Int32
	st := srv.StartStack(t, actionbustest.StackOptions{Register: registerSkills(&counted)})
	ctx := ctxT(t)
	list, err := st.Client.Skills(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	assert.Equal(t, "report", list[0].Name)
	assert.Equal(t, "default", list[0].Pool)
	s, err := st.Client.Skill(ctx, "review")
	require.NoError(t, err)
	assert.Equal(t, "Check the figures, then approve.", s.Instructions)
	_, err = st.Client.Skill(ctx, "nope")
	assert.ErrorIs(t, err, actionbus.ErrSkillNotFound)
	actions, err := st.Client.Actions(ctx)
	require.NoError(t, err)
	for _, a := range actions {
		if a.Name == "skill.report.count_rows" {
			assert.False(t, a.PlannerVisible, "tools are reached through execute_skill_tool")
		}
	}
}

// A model that names a skill tool's hidden action directly (a decision, or
// a plan of two) is refused at admission, with execute_skill_tool denied
// by policy: nothing runs, and the run ends with action_not_found
// (not_planner_visible). Security row 27.
func TestAHiddenSkillToolNamedByTheModelIsRefused(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	var counted atomic.Int32
	st := srv.StartStack(t, actionbustest.StackOptions{Register: registerSkills(&counted),
		Policy: `{"actions": {"execute_skill_tool": "deny"}}`, Scenarios: `
scenarios:
  decision:
    decisions:
      - {type: action, name: skill.report.count_rows, args: {table: jobs}}
      - {type: final, answer: "ran"}
  plan:
    decisions:
      - type: plan
        actions:
          - {type: action, name: skill.report.count_rows, args: {table: a}}
          - {type: action, name: skill.report.count_rows, args: {table: b}}
      - {type: final, answer: "ran"}
  active:
    decisions:
      - {type: action, name: read_agent_skill, args: {skillName: report}}
      - {type: action, name: use_agent_skill, args: {}}
      - {type: action, name: skill.report.count_rows, args: {table: jobs}}
      - {type: final, answer: "ran"}
`})
	ctx := ctxT(t)
	for _, scenario := range []string{"decision", "plan", "active"} {
		t.Run(scenario, func(t *testing.T) {
			res, err := st.Client.Run(ctx, client.RunRequest{Scenario: scenario, Prompt: "count"}, nil)
			require.NoError(t, err)
			require.Equal(t, client.StatusFailed, res.Status, "answer %q", res.Answer)
			assert.ErrorIs(t, res.Error, actionbus.ErrActionNotFound)
			assert.Equal(t, "not_planner_visible", res.Error.Details["reason"])
			assert.Equal(t, "skill.report.count_rows", res.Error.Details["action"])
			assert.Zero(t, counted.Load(), "the hidden tool never ran")
		})
	}
}
