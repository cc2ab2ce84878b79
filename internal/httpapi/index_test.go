package httpapi

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
)

const runA, runB = "01JAAAAAAAAAAAAAAAAAAAAAAA", "01JBBBBBBBBBBBBBBBBBBBBBBB"

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func ev(runID, typ string, at int, data any) client.Event {
	b, _ := json.Marshal(data)
	return client.Event{RunID: runID, Type: typ, Time: t0.Add(time.Duration(at) * time.Second), Data: b}
}

func approvalOf(runID, id string) events.ApprovalRequested {
	return events.ApprovalRequested{RunID: runID, Input: map[string]any{"sku": "A"},
		Context: events.ApprovalContext{ApprovalID: id, RunID: runID, Action: "inv.reorder", InputHash: "h", ExpiresAt: t0.Add(time.Hour)}}
}

func TestTheIndexFollowsARunsEvents(t *testing.T) {
	for _, tc := range []struct {
		name      string
		events    []client.Event
		status    string
		waiting   string
		approvals int
	}{
		{"started", []client.Event{ev(runA, events.TypeRunStarted, 0, events.RunStarted{RunID: runA, Kind: "agent"})}, StatusRunning, "", 0},
		{"asking the planner", []client.Event{ev(runA, events.TypeDecisionRequested, 0, events.DecisionRequested{RunID: runA, Cycle: 2})},
			StatusRunning, "planner decision (cycle 2)", 0},
		// The planner's clarify decision is not yet a wait: an answer sent
		// then would reach the dispatcher before it applied the decision.
		{"a clarify decision alone", []client.Event{ev(runA, events.TypeDecisionMade, 0, events.DecisionMade{RunID: runA, Decision: events.Decision{Type: "clarify", Question: "which?"}})},
			StatusRunning, "", 0},
		{"the dispatcher's awaiting-input step waits for input", []client.Event{
			ev(runA, events.TypeDecisionMade, 0, events.DecisionMade{RunID: runA, Decision: events.Decision{Type: "clarify", Question: "which?"}}),
			ev(runA, events.TypeRunProgress, 1, events.RunStep{RunID: runA, Name: "awaiting-input", Message: "which?"}),
		}, StatusAwaitingInput, "input: which?", 0},
		{"an approval pending", []client.Event{ev(runA, events.TypeApprovalRequested, 0, approvalOf(runA, runA+"-1-0"))},
			StatusAwaitingApproval, "approval " + runA + "-1-0", 1},
		{"an approval granted", []client.Event{
			ev(runA, events.TypeApprovalRequested, 0, approvalOf(runA, runA+"-1-0")),
			ev(runA, events.TypeApprovalResolved, 1, events.ApprovalResolved{RunID: runA, ApprovalID: runA + "-1-0", Outcome: events.ApprovalOutcomeGranted}),
		}, StatusRunning, "", 0},
		{"a refused answer leaves it pending", []client.Event{
			ev(runA, events.TypeApprovalRequested, 0, approvalOf(runA, runA+"-1-0")),
			ev(runA, events.TypeApprovalResolved, 1, events.ApprovalResolved{RunID: runA, ApprovalID: runA + "-1-0", Outcome: events.ApprovalOutcomeRefused}),
		}, StatusAwaitingApproval, "approval " + runA + "-1-0", 1},
		{"the end drops pending approvals", []client.Event{
			ev(runA, events.TypeApprovalRequested, 0, approvalOf(runA, runA+"-1-0")),
			ev(runA, events.TypeRunFailed, 1, events.RunFailed{RunID: runA, Error: actionbus.Error{Code: actionbus.CodeApprovalExpired}}),
		}, client.StatusFailed, "", 0},
		{"nothing after the end changes the status", []client.Event{
			ev(runA, events.TypeRunCompleted, 0, events.RunCompleted{RunID: runA, Answer: "done"}),
			ev(runA, events.TypeDecisionRequested, 1, events.DecisionRequested{RunID: runA, Cycle: 3}),
			ev(runA, events.TypeApprovalRequested, 2, approvalOf(runA, runA+"-3-0")),
		}, client.StatusCompleted, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := NewIndex("default", 0)
			for _, e := range tc.events {
				x.Apply(e)
			}
			v, ok := x.Run(runA)
			require.True(t, ok)
			assert.Equal(t, tc.status, v.Status)
			assert.Equal(t, tc.waiting, v.Waiting)
			assert.Len(t, x.Approvals(), tc.approvals)
			assert.Len(t, v.Approvals, tc.approvals)
		})
	}
}

func TestTheIndexKeepsRequestsFiltersAndBounds(t *testing.T) {
	x := NewIndex("default", 1)
	x.Apply(ev(runA, events.TypeDecisionRequested, 0, events.DecisionRequested{RunID: runA, Cycle: 1}))
	require.True(t, x.NeedsRequest(runA))
	v := x.ApplyRequest(runA, &client.RunRequest{Action: &client.ActionCall{Name: "inv.stock"}, UserID: "u1"}, t0.Add(-time.Second))
	require.NotNil(t, v)
	assert.Equal(t, "exec", v.Kind)
	assert.Equal(t, "inv.stock", v.Title)
	assert.False(t, x.NeedsRequest(runA))
	wx := NewIndex("default", 0)
	wx.Apply(ev(runB, events.TypeRunStarted, 0, events.RunStarted{Kind: "workflow"}))
	wf := wx.ApplyRequest(runB, &client.RunRequest{Workflow: client.NewWorkflow("nightly-retry").Step("a", "x.y", nil).Build()}, t0)
	require.NotNil(t, wf)
	assert.Equal(t, []string{"workflow", "nightly-retry"}, []string{wf.Kind, wf.Title}, "a workflow run is titled with its workflowName")

	x.Apply(ev(runB, events.TypeDecisionRequested, 1, events.DecisionRequested{RunID: runB, Cycle: 1}))
	assert.Len(t, x.Runs(RunFilter{}), 2, "runs that have not ended are kept beyond the bound")
	assert.Len(t, x.Runs(RunFilter{UserID: "u1"}), 1)
	assert.Len(t, x.Runs(RunFilter{Kinds: []string{"agent"}}), 0)
	assert.Equal(t, runB, x.Runs(RunFilter{})[0].RunID, "youngest first")

	x.Apply(ev(runA, events.TypeRunCompleted, 2, events.RunCompleted{RunID: runA}))
	x.Apply(ev(runB, events.TypeRunCompleted, 3, events.RunCompleted{RunID: runB}))
	x.Apply(ev("01JCCCCCCCCCCCCCCCCCCCCCCC", events.TypeRunStarted, 4, events.RunStarted{Kind: "agent"}))
	_, ok := x.Run(runA)
	assert.False(t, ok, "the oldest ended run goes first")
	assert.Nil(t, x.Apply(client.Event{RunID: "not-a-run", Type: events.TypeRunStarted}))
}

func TestStatusOfFollowsTheSeedsMapping(t *testing.T) {
	for code, status := range map[actionbus.Code]int{
		actionbus.CodeActionNotFound: http.StatusNotFound, actionbus.CodeRunNotFound: http.StatusNotFound,
		actionbus.CodeSchemaValidation: http.StatusBadRequest, actionbus.CodeActionArgsInvalid: http.StatusBadRequest,
		actionbus.CodeTimeout: http.StatusRequestTimeout, actionbus.CodeModeNotAllowed: http.StatusForbidden,
		actionbus.CodePolicyRejected: http.StatusForbidden, actionbus.CodeApprovalRequired: http.StatusForbidden,
		actionbus.CodeApprovalDenied: http.StatusForbidden, actionbus.CodeUnauthenticated: http.StatusUnauthorized,
		actionbus.CodeIdempotencyConflict: http.StatusConflict, actionbus.CodeCanceled: http.StatusConflict,
		actionbus.CodePayloadTooLarge: http.StatusRequestEntityTooLarge, actionbus.CodeForbidden: http.StatusForbidden,
		actionbus.CodeHandlerFailed: http.StatusInternalServerError,
	} {
		assert.Equal(t, status, StatusOf(code), code)
	}
}

func TestTokensAreParsedAndChecked(t *testing.T) {
	tok, entry, err := NewToken("alice", RoleRun)
	require.NoError(t, err)
	doc, _ := json.Marshal(Tokens{Tokens: []Token{entry}})
	parsed, err := ParseTokens(doc)
	require.NoError(t, err)
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("Authorization", "Bearer "+tok)
	got, err := parsed.authenticate(r)
	require.NoError(t, err)
	assert.Equal(t, "alice", got.User)
	assert.True(t, got.May(RoleRead))
	assert.False(t, got.May(RoleApprove))
	for _, bad := range []string{
		`{"tokens":[{"sha256":"abc","user":"a","roles":["read"]}]}`,
		`{"tokens":[{"sha256":"` + entry.SHA256 + `","user":"","roles":["read"]}]}`,
		`{"tokens":[{"sha256":"` + entry.SHA256 + `","user":"a","roles":["admin"]}]}`,
		`{"tokens":[{"token":"plain","user":"a"}]}`,
	} {
		_, err := ParseTokens([]byte(bad))
		assert.Error(t, err, bad)
	}
}

func FuzzParseTokens(f *testing.F) {
	f.Add([]byte(`{"tokens":[{"sha256":"00","user":"a","roles":["read"]}]}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tokens, err := ParseTokens(data)
		if err == nil {
			require.NoError(t, tokens.Validate())
		}
	})
}

// TestTheIndexKeepsARunsUsageFromItsEnd: the run the API serves carries
// the usage of its terminal event, whichever end it had.
func TestTheIndexKeepsARunsUsageFromItsEnd(t *testing.T) {
	u := &events.RunUsage{Calls: 2, InputTokens: 900, OutputTokens: 40, CostUSD: 0.0021}
	for name, end := range map[string]client.Event{
		"completed": ev(runA, events.TypeRunCompleted, 0, events.RunCompleted{RunID: runA, Answer: "done", Usage: u}),
		"failed":    ev(runA, events.TypeRunFailed, 0, events.RunFailed{RunID: runA, Error: actionbus.Error{Code: actionbus.CodeBudgetExceeded}, Usage: u}),
		"canceled":  ev(runA, events.TypeRunCanceled, 0, events.RunCanceled{RunID: runA, Usage: u}),
	} {
		t.Run(name, func(t *testing.T) {
			x := NewIndex("default", 0)
			x.Apply(end)
			v, ok := x.Run(runA)
			require.True(t, ok)
			assert.Equal(t, u, v.Usage)
		})
	}
}
