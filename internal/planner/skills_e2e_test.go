package planner_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/llmtest"
)

var skillDocs = fstest.MapFS{
	"report/SKILL.md": {Data: []byte("---\nname: report\ndescription: Build a delivery report.\nhandoffs: [review]\ntools:\n" +
		"  - name: count_rows\n    description: Count the rows of a table.\n    resultKind: evidence\n" +
		"    parameters: {type: object, properties: {table: {type: string}}, required: [table], additionalProperties: false}\n" +
		"---\nCount the rows, then hand off to review.\n")},
	"review/SKILL.md": {Data: []byte("---\nname: review\ndescription: Review a report.\ntools:\n" +
		"  - name: approve_report\n    description: Approve the report.\n    resultKind: final\n---\nApprove it.\n")},
}

func toolNames(r llmtest.Request) []string {
	var out []string
	for _, t := range r.Tools {
		out = append(out, t.Function.Name)
	}
	return out
}

// A model through the chat-completions endpoint lists, reads and uses a
// skill, calls its tool natively (a function named after the tool), hands
// off, and the reviewing skill's final tool result is the answer.
func TestAModelUsesSkillsThroughNativeTools(t *testing.T) {
	llm := llmtest.New(t)
	llm.Script(
		llmtest.Reply{ToolCalls: []llmtest.ToolCall{llmtest.Call("list_agent_skills", map[string]any{})}},
		llmtest.Reply{ToolCalls: []llmtest.ToolCall{llmtest.Call("read_agent_skill", map[string]any{"skillName": "report"})}},
		llmtest.Reply{ToolCalls: []llmtest.ToolCall{llmtest.Call("use_agent_skill", map[string]any{"skillName": "report"})}},
		llmtest.Reply{ToolCalls: []llmtest.ToolCall{llmtest.Call("skill__count_rows", map[string]any{"table": "jobs"})}},
		llmtest.Reply{ToolCalls: []llmtest.ToolCall{llmtest.Call("handoff_to_skill", map[string]any{"skillName": "review",
			"handoffContext": "3 rows counted", "inputFilter": map[string]any{"actionHistory": map[string]any{"keepLast": 0}}})}},
		llmtest.Reply{ToolCalls: []llmtest.ToolCall{llmtest.Call("skill__approve_report", map[string]any{})}},
	)
	var table atomic.Value
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{OpenAI: &actionbustest.OpenAIOptions{BaseURL: llm.URL},
		Register: func(ex *executor.Executor) error {
			report, err := executor.LoadSkill(skillDocs, "report")
			if err != nil {
				return err
			}
			review, err := executor.LoadSkill(skillDocs, "review")
			if err != nil {
				return err
			}
			if err := executor.RegisterSkill(ex, report, map[string]executor.ToolFunc{
				"count_rows": func(_ context.Context, args map[string]any, _ executor.Call) (map[string]any, error) {
					table.Store(args["table"])
					return map[string]any{"rows": 3}, nil
				}}); err != nil {
				return err
			}
			return executor.RegisterSkill(ex, review, map[string]executor.ToolFunc{
				"approve_report": func(context.Context, map[string]any, executor.Call) (map[string]any, error) {
					return map[string]any{"markdown": "3 rows, approved."}, nil
				}})
		}})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Prompt: "Report on the jobs table."}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, "3 rows, approved.", res.Answer)
	assert.Equal(t, "jobs", table.Load(), "the native call's arguments reached the tool")

	reqs := llm.Requests()
	require.Len(t, reqs, 6)
	assert.Contains(t, toolNames(reqs[0]), "list_agent_skills", "skill actions are offered when skills exist")
	assert.NotContains(t, toolNames(reqs[0]), "skill__count_rows", "no skill is active yet")
	assert.Contains(t, toolNames(reqs[3]), "skill__count_rows", "the active skill's tools are native tools")
	assert.Contains(t, reqs[3].All(), "Count the rows, then hand off to review.", "the planner sees the active skill's instructions")
	assert.Contains(t, toolNames(reqs[5]), "skill__approve_report")
	assert.NotContains(t, toolNames(reqs[5]), "skill__count_rows", "after the handoff, the new skill's tools")
	assert.Contains(t, reqs[5].All(), "3 rows counted", "the handoff context")
	assert.Contains(t, reqs[5].All(), `"kind":"agent_skill_handoff"`, "the handoff's result is observed")
	assert.NotContains(t, reqs[5].All(), `"kind":"agent_skills"`, "actionHistory keepLast 0 trimmed the earlier results")
}
