package planner_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/planner"
)

const doc = `
scenarios:
  s:
    decisions:
      - {type: action, name: jobs.search, args: {status: [FAILED], note: 'for {{ .Prompt }}'}}
      - type: plan
        partial_ok: true
        synthesize_instruction: direct
        actions:
          - {type: action, name: jobs.get, args: {id: '{{ index (index .Results "jobs.search" "ids") 0 }}'}}
          - {type: action, name: jobs.retry, args: {ids: '{{ toJson (index .Results "jobs.search" "ids") }}'}}
      - {type: final, answer: '{{ len .Last }} results: {{ join ", " (index .Results "jobs.search" "ids") }}', citations: [a]}
`

func TestScriptDecidesOnePerCycleWithTemplates(t *testing.T) {
	sc, err := planner.ParseScenarios([]byte(doc))
	require.NoError(t, err)
	p, err := planner.NewScript(sc)
	require.NoError(t, err)
	ctx := context.Background()

	d1, err := p.Decide(ctx, planner.Input{Request: &events.DecisionRequested{RunID: "r", Cycle: 1, Prompt: "ops", Scenario: "s"}})
	require.NoError(t, err)
	assert.Equal(t, events.Decision{Type: "action", Name: "jobs.search", Args: map[string]any{"status": []any{"FAILED"}, "note": "for ops"}}, d1)

	obs := []events.Observation{{Cycle: 1, Action: "jobs.search", OK: true, Output: map[string]any{"ids": []any{"j1", "j2"}}}}
	d2, err := p.Decide(ctx, planner.Input{Request: &events.DecisionRequested{RunID: "r", Cycle: 2, Scenario: "s", Observations: obs}})
	require.NoError(t, err)
	assert.Equal(t, "plan", d2.Type)
	assert.True(t, d2.PartialOK)
	assert.Equal(t, "direct", d2.SynthesizeInstruction)
	assert.Equal(t, "j1", d2.Actions[0].Args["id"])
	assert.Equal(t, []any{"j1", "j2"}, d2.Actions[1].Args["ids"], "a lone toJson template becomes the JSON value")

	d3, err := p.Decide(ctx, planner.Input{Request: &events.DecisionRequested{RunID: "r", Cycle: 3, Scenario: "s", Observations: append(obs,
		events.Observation{Cycle: 2, Action: "jobs.get", OK: true}, events.Observation{Cycle: 2, Action: "jobs.retry", OK: true})}})
	require.NoError(t, err)
	assert.Equal(t, "2 results: j1, j2", d3.Answer)
	assert.Equal(t, []string{"a"}, d3.Citations)
}

func TestScriptErrorsAreCoded(t *testing.T) {
	sc, err := planner.ParseScenarios([]byte(doc))
	require.NoError(t, err)
	p, err := planner.NewScript(sc)
	require.NoError(t, err)
	ctx := context.Background()
	_, err = p.Decide(ctx, planner.Input{Request: &events.DecisionRequested{Cycle: 1, Scenario: "nope"}})
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeScenarioNotFound})
	_, err = p.Decide(ctx, planner.Input{Request: &events.DecisionRequested{Cycle: 9, Scenario: "s"}})
	assert.Equal(t, actionbus.CodeInvalidDecision, actionbus.CodeOf(err))
	_, err = p.Decide(ctx, planner.Input{Request: &events.DecisionRequested{Cycle: 2, Scenario: "s"}})
	assert.Equal(t, actionbus.CodeScenarioFailed, actionbus.CodeOf(err), "a template over a missing result fails clearly")
}

func TestScenarioFilesRejectTyposAndBadTemplates(t *testing.T) {
	_, err := planner.ParseScenarios([]byte(`scenarios: {s: {decisions: [{type: final, answr: x}]}}`))
	assert.ErrorContains(t, err, "answr")
	sc, err := planner.ParseScenarios([]byte(`scenarios: {s: {decisions: [{type: final, answer: '{{ .Nope'}]}}`))
	require.NoError(t, err)
	_, err = planner.NewScript(sc)
	assert.Error(t, err)
	sc, err = planner.ParseScenarios([]byte(`scenarios: {s: {decisions: []}}`))
	require.NoError(t, err)
	_, err = planner.NewScript(sc)
	assert.Error(t, err)
}

func TestLoadScenariosFromJSONAndYAMLFiles(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.json"), []byte(`{"scenarios":{"a":{"decisions":[{"type":"final","answer":"A"}]}}}`), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "b.yaml"), []byte("scenarios:\n  b:\n    decisions:\n      - {type: final, answer: B}\n"), 0o600))
	all, err := planner.LoadScenarios(dir)
	require.NoError(t, err)
	assert.Len(t, all, 2)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "c.yml"), []byte("scenarios:\n  a:\n    decisions:\n      - {type: final}\n"), 0o600))
	_, err = planner.LoadScenarios(dir)
	assert.ErrorContains(t, err, "defined twice")
}

const eachDoc = `
scenarios:
  each:
    decisions:
      - type: plan
        actions:
          - {type: action, name: jobs.get, forEach: '{{ toJson (index .Results "jobs.search" "ids") }}', args: {id: '{{ .Item }}'}}
          - {type: action, name: jobs.check, args: {ids: '{{ toJson (index .Results "jobs.search" "ids") }}'}}
  past:
    decisions:
      - type: plan
        actions:
          - {type: action, name: jobs.get, args: {id: '{{ index (index .Results "jobs.search" "ids") 0 }}'}}
          - {type: action, name: jobs.get, args: {id: '{{ index (index .Results "jobs.search" "ids") 1 }}'}}
  notalist:
    decisions:
      - type: plan
        actions:
          - {type: action, name: jobs.get, forEach: '{{ index .Results "jobs.search" "count" }}', args: {id: '{{ .Item }}'}}
`

func decide(t *testing.T, p *planner.Script, scenario string, ids ...any) (events.Decision, error) {
	t.Helper()
	obs := []events.Observation{{Cycle: 1, Action: "jobs.search", OK: true, Output: map[string]any{"ids": ids, "count": float64(len(ids))}}}
	return p.Decide(context.Background(), planner.Input{Request: &events.DecisionRequested{RunID: "r", Cycle: 1, Scenario: scenario, Observations: obs}})
}

func TestAForEachPlanActionIsRepeatedOncePerItemOfItsList(t *testing.T) {
	sc, err := planner.ParseScenarios([]byte(eachDoc))
	require.NoError(t, err)
	p, err := planner.NewScript(sc)
	require.NoError(t, err)
	for _, ids := range [][]any{{"j1", "j2", "j3"}, {"j2"}, {}} {
		d, err := decide(t, p, "each", ids...)
		require.NoError(t, err)
		require.Len(t, d.Actions, len(ids)+1, "one jobs.get per id, then jobs.check")
		for i, id := range ids {
			assert.Equal(t, events.Decision{Type: "action", Name: "jobs.get", Args: map[string]any{"id": id}}, d.Actions[i])
		}
		assert.Equal(t, "jobs.check", d.Actions[len(ids)].Name, "the action after the forEach keeps its place")
	}
}

func TestATemplatePastTheEndOfAListIsScenarioFailedNamingItsLine(t *testing.T) {
	sc, err := planner.ParseScenarios([]byte(eachDoc))
	require.NoError(t, err)
	p, err := planner.NewScript(sc)
	require.NoError(t, err)
	_, err = decide(t, p, "past", "j1")
	var abErr *actionbus.Error
	require.ErrorAs(t, err, &abErr)
	assert.Equal(t, actionbus.CodeScenarioFailed, abErr.Code)
	assert.Contains(t, abErr.Message, `scenario "past" cycle 1, decisions[0].actions[1].args.id (line 14)`)
	assert.Contains(t, abErr.Message, "index 1 out of range: the list has 1 item(s)")
	assert.NotContains(t, abErr.Message, "reflect")
	assert.Equal(t, 14, abErr.Details["line"])
	assert.Equal(t, `{{ index (index .Results "jobs.search" "ids") 1 }}`, abErr.Details["template"])

	_, err = decide(t, p, "notalist", "j1")
	require.ErrorAs(t, err, &abErr)
	assert.Equal(t, actionbus.CodeScenarioFailed, abErr.Code)
	assert.Contains(t, abErr.Message, "decisions[0].actions[0].forEach (line 19)")
	assert.Contains(t, abErr.Message, "not a JSON list")
}
