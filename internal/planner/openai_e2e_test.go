package planner_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/llmtest"
)

type page struct {
	URL   string `json:"url"`
	Title string `json:"title"`
	Text  string `json:"text"`
}

type topic struct {
	Topic string `json:"topic"`
}

type count struct {
	Topic string `json:"topic"`
	Count int    `json:"count"`
}

// registerTestActions registers a stand-in read_url (pages from a map) and
// two notes actions. edition changes what notes.count returns, to make a
// replay diverge.
func registerTestActions(edition *atomic.Int32) func(*executor.Executor) error {
	pages := map[string]page{
		"https://a.example/nats": {URL: "https://a.example/nats", Title: "NATS", Text: "NATS is a messaging system."},
		"https://b.example/js":   {URL: "https://b.example/js", Title: "JetStream", Text: "JetStream adds persistence."},
	}
	return func(ex *executor.Executor) error {
		err := executor.Register(ex, executor.Action{Name: "read_url", Description: "Read one public web page."},
			func(_ context.Context, in struct {
				URL string `json:"url"`
			}, _ executor.Call) (executor.Result[page], error) {
				p, ok := pages[in.URL]
				if !ok {
					return executor.Result[page]{}, context.DeadlineExceeded
				}
				return executor.Result[page]{Output: p, Summary: p.Title}, nil
			})
		if err != nil {
			return err
		}
		err = executor.Register(ex, executor.Action{Name: "notes.count", Description: "Count notes on a topic."},
			func(_ context.Context, in topic, _ executor.Call) (executor.Result[count], error) {
				n := len(in.Topic) + int(edition.Load())
				return executor.Result[count]{Output: count{Topic: in.Topic, Count: n}}, nil
			})
		if err != nil {
			return err
		}
		return executor.Register(ex, executor.Action{Name: "notes.report", Description: "A ready-made report section."},
			func(_ context.Context, in topic, _ executor.Call) (executor.Result[map[string]any], error) {
				return executor.Result[map[string]any]{Output: map[string]any{"resultKind": "final",
					"markdown": "Direct body for " + in.Topic + ".\n\n```g3-drill-hints\n[{\"label\":\"dropped\"}]\n```\n"}}, nil
			})
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func hasResults(r llmtest.Request) bool {
	return strings.Contains(r.All(), "Results of the actions run so far")
}

func TestOpenAIRunToolCallsToActionsToFinalWithCitationsThenReplay(t *testing.T) {
	llm := llmtest.New(t)
	var edition atomic.Int32
	llm.Respond(func(r llmtest.Request) llmtest.Reply {
		if !hasResults(r) {
			// Two independent reads in one reply: one plan.
			return llmtest.Reply{ToolCalls: []llmtest.ToolCall{
				llmtest.Call("read_url", map[string]any{"url": "https://a.example/nats"}),
				llmtest.Call("read_url", map[string]any{"url": "https://b.example/js"}),
			}}
		}
		return llmtest.Reply{ToolCalls: []llmtest.ToolCall{llmtest.Call("final_answer", map[string]any{
			"answer": "NATS is a messaging system; JetStream adds persistence."})}}
	})
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{OpenAI: &actionbustest.OpenAIOptions{BaseURL: llm.URL}, Register: registerTestActions(&edition)})
	ctx := ctxT(t)

	res, err := st.Client.Run(ctx, client.RunRequest{Prompt: "What are NATS and JetStream?"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, "NATS is a messaging system; JetStream adds persistence.\n\nSources:\n1. [NATS](https://a.example/nats)\n2. [JetStream](https://b.example/js)", res.Answer)
	assert.Equal(t, []string{"https://a.example/nats", "https://b.example/js"}, res.Citations)
	assert.Equal(t, 2, res.Cycles)
	reqs := llm.Requests()
	require.Len(t, reqs, 2)
	assert.Contains(t, reqs[1].All(), "JetStream adds persistence.", "the planner saw the pages it read")
	assert.Contains(t, reqs[1].All(), `"planIndex":1`)

	// Replay: the recorded decisions drive a new run; no LLM call.
	rep, err := st.Client.Replay(ctx, res.RunID)
	require.NoError(t, err)
	assert.Empty(t, rep.Divergences)
	assert.NotEqual(t, res.RunID, rep.ReplayRunID)
	assert.Equal(t, res.Answer, rep.Replayed.Result.Answer)
	assert.Len(t, rep.Replayed.Decisions, 2)
	assert.Len(t, llm.Requests(), 2, "a replay asks no LLM")
}

func TestReplayReportsDivergence(t *testing.T) {
	var edition atomic.Int32
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Register: registerTestActions(&edition), Scenarios: `
scenarios:
  count:
    decisions:
      - {type: action, name: notes.count, args: {topic: nats}}
      - {type: final, answer: "{{ (index .Last 0).Output.count }} notes"}
`})
	ctx := ctxT(t)
	res, err := st.Client.Run(ctx, client.RunRequest{Prompt: "count", Scenario: "count"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, "4 notes", res.Answer)

	edition.Store(10) // the action now answers differently
	rep, err := st.Client.Replay(ctx, res.RunID)
	require.NoError(t, err)
	require.Len(t, rep.Divergences, 1, "%+v", rep.Divergences)
	d := rep.Divergences[0]
	assert.Equal(t, 2, d.Cycle)
	assert.Equal(t, "observations before the decision", d.What)
	assert.Equal(t, "/0/output/count", d.Path, "the first value that differs")
	assert.Equal(t, "4", d.Recorded)
	assert.Equal(t, "14", d.Replayed)
	assert.Equal(t, "4 notes", rep.Replayed.Result.Answer, "the recorded decision is replayed as recorded")
}

func TestOpenAIPerActionSynthesisStitchesTheExactLayout(t *testing.T) {
	llm := llmtest.New(t)
	var edition atomic.Int32
	plan := `{"type":"plan","synthesize_per_action":true,"actions":[
	  {"type":"action","name":"notes.count","args":{"topic":"alpha"},"section":{"title":"## Alpha","prompt":"Write about alpha."}},
	  {"type":"action","name":"notes.report","args":{"topic":"beta"},"section":{"title":"## Beta","prompt":"Unused: direct final."}},
	  {"type":"action","name":"notes.count","args":{"topic":"gamma"},"section":{"prompt":"Write about gamma."}},
	  {"type":"action","name":"notes.count","args":{"topic":"delta"},"section":{"title":"## Delta","prompt":"Write about delta."}}],
	 "stitch":{"intro_prompt":"Introduce the report.","outro_prompt":"Close the report.","provenance":"_Source: notes service._",
	  "followups":["What changed last week?"],"drill_hints":[{"match_header":"## Alpha","label":"More alpha","prompt":"Drill into alpha"}]}}`
	llm.Respond(func(r llmtest.Request) llmtest.Reply {
		all := r.All()
		switch {
		case strings.Contains(all, "Write about alpha."):
			return llmtest.Reply{Content: "Alpha has 5 notes.\n\n```g3-followups\n[\"from a section\"]\n```", Delay: 50 * time.Millisecond}
		case strings.Contains(all, "Write about gamma."):
			return llmtest.Reply{Status: http.StatusInternalServerError, ErrorMessage: "boom", Delay: 50 * time.Millisecond}
		case strings.Contains(all, "Write about delta."):
			return llmtest.Reply{Content: "   ", Delay: 50 * time.Millisecond}
		case strings.Contains(all, "Introduce the report."):
			return llmtest.Reply{Content: "# Notes report", Delay: 50 * time.Millisecond}
		case strings.Contains(all, "Close the report."):
			return llmtest.Reply{Content: "That is all.", Delay: 50 * time.Millisecond}
		}
		return llmtest.Reply{Content: plan}
	})
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "")
	st := srv.StartStack(t, actionbustest.StackOptions{OpenAI: &actionbustest.OpenAIOptions{BaseURL: llm.URL, Mode: "envelope"},
		Register: registerTestActions(&edition), Limits: events.RunLimits{MaxSectionParallel: 2}})
	ctx := ctxT(t)
	res, err := st.Client.Run(ctx, client.RunRequest{Prompt: "Report on the notes."}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	want := "# Notes report\n\n" +
		"## Alpha\n\nAlpha has 5 notes.\n\n" +
		"## Beta\n\nDirect body for beta.\n\n" +
		"## Section 3\n\n<!-- section failed: provider_error: the LLM endpoint answered HTTP 500: boom -->\n\n" +
		"## Delta\n\n<!-- section failed: empty synthesis output -->\n\n" +
		"That is all.\n\n" +
		"_Source: notes service._\n\n" +
		"```g3-followups\n[\"What changed last week?\"]\n```\n\n" +
		"```g3-drill-hints\n[{\"match_header\":\"## Alpha\",\"label\":\"More alpha\",\"prompt\":\"Drill into alpha\"}]\n```"
	assert.Equal(t, want, res.Answer)
	assert.Equal(t, 1, res.Cycles, "no second planner cycle")
	// One planning call, three section calls (beta was direct), intro, outro.
	assert.Len(t, llm.Requests(), 6)
	assert.LessOrEqual(t, llm.MaxInFlight(), 2, "maxSectionParallel bounds the synthesis calls")

	// The section call saw only the request, its action's result and its prompt.
	for _, r := range llm.Requests() {
		if all := r.All(); strings.Contains(all, "Write about alpha.") {
			assert.Contains(t, all, "Report on the notes.")
			assert.Contains(t, all, `"topic":"alpha"`)
			assert.NotContains(t, all, `"topic":"gamma"`)
		}
	}
	// The recorder has its own connection: wait for the last step.
	rec.WaitForStep(t, 10*time.Second, func(s events.RunStep) bool {
		return s.RunID == res.RunID && s.Name == "synthesize-stitch-done"
	})
	var steps []string
	for _, e := range rec.All() {
		for _, s := range e.Steps() {
			if s.RunID == res.RunID && strings.HasPrefix(s.Name, "synthesize-") {
				steps = append(steps, s.Name)
			}
		}
	}
	require.NotEmpty(t, steps)
	assert.Equal(t, "synthesize-per-action-start", steps[0])
	assert.Equal(t, "synthesize-stitch-done", steps[len(steps)-1])
	assert.Len(t, steps, 2+3+2, "start, three sections, intro, outro, stitch")
}

func TestOpenAIPlanFinalizeStreamsTheAnswer(t *testing.T) {
	llm := llmtest.New(t)
	var edition atomic.Int32
	llm.Respond(func(r llmtest.Request) llmtest.Reply {
		if r.Stream {
			return llmtest.Reply{Content: "Alpha has 5 notes and beta has 4."}
		}
		return llmtest.Reply{Content: `{"type":"plan","synthesize_instruction":"Compare the counts.","actions":[
		  {"type":"action","name":"notes.count","args":{"topic":"alpha"}},{"type":"action","name":"notes.count","args":{"topic":"beta"}}]}`}
	})
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{OpenAI: &actionbustest.OpenAIOptions{BaseURL: llm.URL, Mode: "envelope"}, Register: registerTestActions(&edition)})
	ctx := ctxT(t)

	runID := events.NewID()
	var mu sync.Mutex
	var deltas []string
	ended := make(chan struct{})
	stop, err := st.Client.StreamAnswer(runID, func(delta string, end bool) {
		mu.Lock()
		defer mu.Unlock()
		if end {
			close(ended)
			return
		}
		deltas = append(deltas, delta)
	})
	require.NoError(t, err)
	defer func() { _ = stop() }()
	res, err := st.Client.Run(ctx, client.RunRequest{RunID: runID, Prompt: "Compare alpha and beta."}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, "Alpha has 5 notes and beta has 4.", res.Answer)
	select {
	case <-ended:
	case <-ctx.Done():
		t.Fatal("the stream never ended")
	}
	mu.Lock()
	defer mu.Unlock()
	assert.Greater(t, len(deltas), 3)
	assert.Equal(t, res.Answer, strings.Join(deltas, ""))
	assert.Contains(t, llm.Requests()[1].All(), "Compare the counts.")
}

func TestASynthesisThatNeverAnswersStallsTheRun(t *testing.T) {
	llm := llmtest.New(t)
	var edition atomic.Int32
	llm.Respond(func(r llmtest.Request) llmtest.Reply {
		if strings.Contains(r.All(), "Write about alpha.") {
			return llmtest.Reply{Content: "too late", Delay: time.Minute}
		}
		return llmtest.Reply{Content: `{"type":"plan","synthesize_per_action":true,"actions":[
		  {"type":"action","name":"notes.count","args":{"topic":"alpha"},"section":{"prompt":"Write about alpha."}}]}`}
	})
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{OpenAI: &actionbustest.OpenAIOptions{BaseURL: llm.URL, Mode: "envelope"},
		Register: registerTestActions(&edition), Limits: events.RunLimits{DecisionTimeout: time.Second}})
	res, err := st.Client.Run(ctxT(t), client.RunRequest{Prompt: "Report."}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status)
	assert.Equal(t, "stage_stalled", string(res.Error.Code))
	assert.Equal(t, "synthesis", res.Error.Details["stage"])
}
