package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/httpapi"
	"github.com/actionbus/actionbus/internal/policy"
)

var approvalKey = []byte("0123456789abcdef0123456789abcdef")

type skuIn struct {
	SKU string `json:"sku"`
}

// register hosts the test's actions: a read, a mutation (tier 2: asks for
// approval), one that outlives its timeout, and one that waits to be
// canceled.
func register(ex *executor.Executor) error {
	schema := json.RawMessage(`{"type":"object","properties":{"sku":{"type":"string"}},"required":["sku"],"additionalProperties":false}`)
	if err := executor.Register(ex, executor.Action{Name: "inv.stock", Description: "Units available for a SKU.", InputSchema: schema},
		func(_ context.Context, in skuIn, _ executor.Call) (executor.Result[map[string]any], error) {
			return executor.Result[map[string]any]{Output: map[string]any{"sku": in.SKU, "available": 12}}, nil
		}); err != nil {
		return err
	}
	if err := executor.Register(ex, executor.Action{Name: "inv.reorder", Description: "Reorder a SKU.", Mode: executor.ModeMutate, Tier: 2, InputSchema: schema},
		func(_ context.Context, in skuIn, _ executor.Call) (executor.Result[map[string]any], error) {
			return executor.Result[map[string]any]{Output: map[string]any{"reordered": in.SKU}}, nil
		}); err != nil {
		return err
	}
	if err := executor.Register(ex, executor.Action{Name: "inv.slow", Timeout: 300 * time.Millisecond},
		func(ctx context.Context, _ map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
			<-ctx.Done()
			return executor.Result[map[string]any]{}, ctx.Err()
		}); err != nil {
		return err
	}
	if err := executor.Register(ex, executor.Action{Name: "inv.writeoff", Description: "Write off a SKU (the policy requires role finance).", InputSchema: schema},
		func(_ context.Context, in skuIn, _ executor.Call) (executor.Result[map[string]any], error) {
			return executor.Result[map[string]any]{Output: map[string]any{"writtenOff": in.SKU}}, nil
		}); err != nil {
		return err
	}
	return executor.Register(ex, executor.Action{Name: "inv.wait", Timeout: time.Minute},
		func(ctx context.Context, _ map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
			<-ctx.Done()
			return executor.Result[map[string]any]{}, ctx.Err()
		})
}

// api is an HTTP API server over a real stack, connected to NATS as the
// deployed client and approver users of tenant default, with four
// callers: a reader, a runner, an approver and a runner whose token grants
// the policy role finance, which inv.writeoff requires. The server's key k1
// is a gateway's: it signs its callers' grants and approvals.
type api struct {
	t      *testing.T
	url    string
	srv    *actionbustest.Server
	tokens map[string]string // role name → bearer token
	// nc is the connection of the API's client.
	nc *nats.Conn
}

func newAPI(t *testing.T) *api {
	t.Helper()
	srv := actionbustest.NewServer(t, actionbustest.Options{Users: true, Tenants: []string{"acme"}})
	srv.StartStack(t, actionbustest.StackOptions{Register: register, ApprovalKeys: "k1:" + base64.StdEncoding.EncodeToString(approvalKey) + ":*",
		Policy: `{"requireRoles": {"inv.writeoff": "finance"}}`,
		Scenarios: `
scenarios:
  ask:
    decisions:
      - {type: clarify, question: "Which one?"}
      - {type: final, answer: "the blue one it is"}
`})
	nc := srv.TenantConnect(t, "client", "default")
	c, err := client.New(nc, client.Options{})
	require.NoError(t, err)
	ap, err := client.New(srv.TenantConnect(t, "approver", "default"), client.Options{})
	require.NoError(t, err)
	a := &api{t: t, srv: srv, tokens: map[string]string{}, nc: nc}
	var entries []httpapi.Token
	for name, roles := range map[string][]string{
		"reader": {httpapi.RoleRead}, "runner": {httpapi.RoleRun}, "approver": {httpapi.RoleApprove},
	} {
		tok, entry, err := httpapi.NewToken(name, roles...)
		require.NoError(t, err)
		a.tokens[name] = tok
		entries = append(entries, entry)
	}
	tok, entry, err := httpapi.NewToken("fin", httpapi.RoleRun)
	require.NoError(t, err)
	entry.Grants = policy.Grants{Roles: []string{"finance"}}
	a.tokens["finance"] = tok
	entries = append(entries, entry)
	s, err := httpapi.New(httpapi.Config{Client: c, Approver: ap, ApprovalKeyID: "k1", ApprovalKey: approvalKey,
		Tokens: httpapi.Tokens{Tokens: entries}, MaxWait: 20 * time.Second})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(func() { hs.Close(); cancel(); <-done })
	a.url = hs.URL
	return a
}

// do sends a request as caller (no token when caller is "") and decodes
// the JSON answer.
func (a *api) do(method, path, caller string, body any) (int, map[string]any) {
	a.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(a.t, err)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, a.url+path, rd)
	require.NoError(a.t, err)
	if caller != "" {
		req.Header.Set("Authorization", "Bearer "+a.tokens[caller])
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(a.t, err)
	defer res.Body.Close()
	var out map[string]any
	data, _ := io.ReadAll(res.Body)
	require.NoError(a.t, json.Unmarshal(data, &out), "body %s", data)
	return res.StatusCode, out
}

// start starts a run as the runner without waiting for it, and returns
// its id (the answer must be 202).
func (a *api) start(body map[string]any) string {
	a.t.Helper()
	status, resp := a.do(http.MethodPost, "/v1/runs", "runner", body)
	require.Equal(a.t, http.StatusAccepted, status, resp)
	return resp["runId"].(string)
}

// reorder is the request of a mutation (it waits for an approval).
func reorder(sku string) map[string]any {
	return map[string]any{"action": map[string]any{"name": "inv.reorder", "args": map[string]any{"sku": sku}}, "allowedModes": []string{"read", "mutate"}}
}

// events reads the server-sent events of path as caller until until
// returns true (or the stream ends); every wait has a deadline.
func (a *api) events(path, caller string, until func(event string, data map[string]any) bool) []string {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.url+path, nil)
	require.NoError(a.t, err)
	req.Header.Set("Authorization", "Bearer "+a.tokens[caller])
	res, err := http.DefaultClient.Do(req)
	require.NoError(a.t, err)
	defer res.Body.Close()
	require.Equal(a.t, http.StatusOK, res.StatusCode)
	require.Equal(a.t, "text/event-stream", res.Header.Get("Content-Type"))
	var seen []string
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	event := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var data map[string]any
			require.NoError(a.t, json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &data))
			seen = append(seen, event)
			if until(event, data) {
				return seen
			}
		}
	}
	a.t.Fatalf("the event stream %s ended (%v) before the awaited event; saw %v", path, ctx.Err(), seen)
	return nil
}

// followToEnd follows a run's events to its end and returns the events'
// names and the result.
func (a *api) followToEnd(runID string) ([]string, map[string]any) {
	var result map[string]any
	seen := a.events("/v1/runs/"+runID+"/events", "reader", func(event string, data map[string]any) bool {
		if event == "end" {
			result = data
			return true
		}
		return false
	})
	return seen, result
}

// waitForRun follows the index's events until a run's view matches, and
// returns it; seen, when not nil, is called with every view on the way.
func (a *api) waitForRun(match func(r map[string]any) bool, seen func(r map[string]any)) map[string]any {
	var found map[string]any
	check := func(r map[string]any) bool {
		if seen != nil {
			seen(r)
		}
		if match(r) {
			found = r
			return true
		}
		return false
	}
	a.events("/v1/events", "reader", func(event string, data map[string]any) bool {
		switch event {
		case "snapshot":
			for _, r := range data["runs"].([]any) {
				if check(r.(map[string]any)) {
					return true
				}
			}
		case "run":
			return check(data)
		}
		return false
	})
	return found
}

// pendingApproval waits on the index's events for a pending approval of
// runID and returns it.
func (a *api) pendingApproval(runID string) map[string]any {
	var found map[string]any
	pick := func(list []any) bool {
		for _, x := range list {
			if ap := x.(map[string]any); ap["runId"] == runID {
				found = ap
				return true
			}
		}
		return false
	}
	a.events("/v1/events", "reader", func(event string, data map[string]any) bool {
		switch event {
		case "snapshot", "approvals":
			return pick(data["approvals"].([]any))
		}
		return false
	})
	return found
}

func errorCode(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

func TestEveryRequestIsAuthenticated(t *testing.T) {
	a := newAPI(t)
	for _, path := range []string{"/v1/runs", "/v1/approvals", "/v1/catalog", "/v1/events", "/v1/runs/01JAAAAAAAAAAAAAAAAAAAAAAA"} {
		status, body := a.do(http.MethodGet, path, "", nil)
		assert.Equal(t, http.StatusUnauthorized, status, path)
		assert.Equal(t, "unauthenticated", errorCode(body), path)
	}
	a.tokens["stranger"] = "not-a-token"
	status, body := a.do(http.MethodPost, "/v1/runs", "stranger", map[string]any{"prompt": "hi"})
	assert.Equal(t, http.StatusUnauthorized, status)
	assert.Equal(t, "unauthenticated", errorCode(body))

	// Roles: a reader cannot start, a runner cannot approve.
	status, body = a.do(http.MethodPost, "/v1/runs", "reader", map[string]any{"action": map[string]any{"name": "inv.stock", "args": map[string]any{"sku": "A"}}})
	assert.Equal(t, http.StatusForbidden, status)
	assert.Equal(t, "forbidden", errorCode(body))
	status, body = a.do(http.MethodPost, "/v1/approvals/01JAAAAAAAAAAAAAAAAAAAAAAA-1-0/approve", "runner", nil)
	assert.Equal(t, http.StatusForbidden, status)
	assert.Equal(t, "forbidden", errorCode(body))
}

func TestARunIsStartedFollowedListedAndAudited(t *testing.T) {
	a := newAPI(t)
	// Waited for: the result in the answer.
	status, body := a.do(http.MethodPost, "/v1/runs?wait=20s", "runner", map[string]any{"action": map[string]any{"name": "inv.stock", "args": map[string]any{"sku": "A-1"}}})
	require.Equal(t, http.StatusOK, status, body)
	assert.Equal(t, "completed", body["status"])
	assert.Equal(t, map[string]any{"sku": "A-1", "available": float64(12)}, body["output"])

	// Not waited for: 202 with the run id, then followed to its end.
	runID := a.start(map[string]any{"action": map[string]any{"name": "inv.stock", "args": map[string]any{"sku": "B-2"}}})
	seen, result := a.followToEnd(runID)
	assert.Contains(t, seen, "action.completed")
	assert.Contains(t, seen, "run.completed")
	assert.Equal(t, "completed", result["status"])

	// The index has it (it follows the stream; wait on its events).
	view := a.waitForRun(func(r map[string]any) bool { return r["runId"] == runID && r["status"] == "completed" }, nil)
	assert.Equal(t, "exec", view["kind"])
	assert.Equal(t, "inv.stock", view["title"])
	status, got := a.do(http.MethodGet, "/v1/runs/"+runID, "reader", nil)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, "completed", got["status"])
	assert.Equal(t, "runner", got["userId"], "a run acts for the token's user")
	status, list := a.do(http.MethodGet, "/v1/runs?status=completed&kind=exec", "reader", nil)
	require.Equal(t, http.StatusOK, status)
	assert.GreaterOrEqual(t, len(list["runs"].([]any)), 1)
	status, list = a.do(http.MethodGet, "/v1/runs?status=failed", "reader", nil)
	require.Equal(t, http.StatusOK, status)
	assert.Empty(t, list["runs"])

	// The audit chain verifies (the records are appended within
	// FlushAfter: wait until the terminal record is there).
	var audit map[string]any
	require.Eventually(t, func() bool {
		var status int
		status, audit = a.do(http.MethodGet, "/v1/runs/"+runID+"/audit", "reader", nil)
		return status == http.StatusOK && audit["complete"] == true
	}, 10*time.Second, 20*time.Millisecond, "the run's audit chain never completed")
	assert.Equal(t, true, audit["verified"])
	assert.GreaterOrEqual(t, len(audit["records"].([]any)), 3)

	// The catalog, with schemas.
	status, cat := a.do(http.MethodGet, "/v1/catalog", "reader", nil)
	require.Equal(t, http.StatusOK, status)
	var names []string
	for _, x := range cat["actions"].([]any) {
		act := x.(map[string]any)
		names = append(names, act["name"].(string))
		if act["name"] == "inv.reorder" {
			assert.Equal(t, "mutate", act["mode"])
			assert.NotNil(t, act["inputSchema"])
		}
	}
	assert.Subset(t, names, []string{"inv.stock", "inv.reorder", "inv.slow"})
}

func TestErrorsMapToHTTPStatuses(t *testing.T) {
	a := newAPI(t)
	run := func(action string, args map[string]any, modes ...string) (int, map[string]any) {
		body := map[string]any{"action": map[string]any{"name": action, "args": args}}
		if modes != nil {
			body["allowedModes"] = modes
		}
		return a.do(http.MethodPost, "/v1/runs?wait=20s", "runner", body)
	}
	for _, tc := range []struct {
		name   string
		status int
		code   string
		send   func() (int, map[string]any)
	}{
		{"an unknown action", 404, "action_not_found", func() (int, map[string]any) { return run("inv.nothing", map[string]any{}) }},
		{"input against the schema", 400, "action_args_invalid", func() (int, map[string]any) { return run("inv.stock", map[string]any{"sku": 7}) }},
		{"a timeout", 408, "timeout", func() (int, map[string]any) { return run("inv.slow", map[string]any{}) }},
		{"a mode the run does not allow", 403, "mode_not_allowed", func() (int, map[string]any) { return run("inv.reorder", map[string]any{"sku": "A"}) }},
		{"an idempotency key reused with other input", 409, "idempotency_key_conflict", func() (int, map[string]any) {
			keyed := func(sku string) (int, map[string]any) {
				return a.do(http.MethodPost, "/v1/runs?wait=20s", "runner", map[string]any{
					"action": map[string]any{"name": "inv.stock", "args": map[string]any{"sku": sku}, "idempotencyKey": "order-7"}})
			}
			if status, body := keyed("A"); status != http.StatusOK {
				return status, body
			}
			return keyed("B")
		}},
		{"a body over 4 MiB", 413, "payload_too_large", func() (int, map[string]any) {
			return a.do(http.MethodPost, "/v1/runs", "runner", map[string]any{"prompt": strings.Repeat("x", 5<<20)})
		}},
		{"a body that is not the documented JSON", 400, "bad_request", func() (int, map[string]any) {
			return a.do(http.MethodPost, "/v1/runs", "runner", map[string]any{"promt": "typo"})
		}},
		{"a run for another user", 403, "forbidden", func() (int, map[string]any) {
			return a.do(http.MethodPost, "/v1/runs", "runner", map[string]any{"prompt": "hi", "userId": "someone-else"})
		}},
		{"a run id that is not one", 400, "invalid_run_id", func() (int, map[string]any) { return a.do(http.MethodGet, "/v1/runs/nope", "reader", nil) }},
		{"an unknown run", 404, "run_not_found", func() (int, map[string]any) {
			return a.do(http.MethodGet, "/v1/runs/01JAAAAAAAAAAAAAAAAAAAAAAA", "reader", nil)
		}},
		{"the events of an unknown run", 404, "run_not_found", func() (int, map[string]any) {
			return a.do(http.MethodGet, "/v1/runs/01JAAAAAAAAAAAAAAAAAAAAAAA/events", "reader", nil)
		}},
		{"an unknown approval", 404, "approval_not_found", func() (int, map[string]any) {
			return a.do(http.MethodPost, "/v1/approvals/01JAAAAAAAAAAAAAAAAAAAAAAA-1-0/approve", "approver", nil)
		}},
		{"an unknown endpoint", 400, "bad_request", func() (int, map[string]any) { return a.do(http.MethodGet, "/v1/nothing", "reader", nil) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := tc.send()
			assert.Equal(t, tc.status, status, "%v", body)
			assert.Equal(t, tc.code, errorCode(body), "%v", body)
		})
	}
}

func TestApprovalsAreListedApprovedAndDenied(t *testing.T) {
	a := newAPI(t)
	approved := a.start(reorder("A-1"))
	ap := a.pendingApproval(approved)
	require.NotNil(t, ap)
	assert.Equal(t, "inv.reorder", ap["action"])
	assert.Equal(t, map[string]any{"sku": "A-1"}, ap["input"])
	assert.Len(t, ap["inputHash"], 64)
	status, list := a.do(http.MethodGet, "/v1/approvals", "reader", nil)
	require.Equal(t, http.StatusOK, status)
	assert.NotEmpty(t, list["approvals"])
	status, view := a.do(http.MethodGet, "/v1/runs/"+approved, "reader", nil)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, "awaiting_approval", view["status"])

	status, body := a.do(http.MethodPost, "/v1/approvals/"+ap["approvalId"].(string)+"/approve", "approver", nil)
	require.Equal(t, http.StatusOK, status, body)
	_, result := a.followToEnd(approved)
	assert.Equal(t, "completed", result["status"])
	assert.Equal(t, map[string]any{"reordered": "A-1"}, result["output"])
	// Answered twice: the dispatcher refuses the replay.
	status, body = a.do(http.MethodPost, "/v1/approvals/"+ap["approvalId"].(string)+"/approve", "approver", nil)
	assert.Equal(t, http.StatusForbidden, status, body)

	denied := a.start(reorder("B-2"))
	ap = a.pendingApproval(denied)
	require.NotNil(t, ap)
	status, body = a.do(http.MethodPost, "/v1/approvals/"+ap["approvalId"].(string)+"/deny", "approver", map[string]any{"reason": "not now"})
	require.Equal(t, http.StatusOK, status, body)
	_, result = a.followToEnd(denied)
	assert.Equal(t, "failed", result["status"])
	assert.Equal(t, string(actionbus.CodeApprovalDenied), result["error"].(map[string]any)["code"])
}

// TestRolesComeFromTheTokenNotTheRequest: a run-only token that writes
// the role a policy requires into its run's metadata is still refused; a
// token whose entry grants the role runs the action, as its own user.
func TestRolesComeFromTheTokenNotTheRequest(t *testing.T) {
	a := newAPI(t)
	refund := func(caller string, metadata map[string]any) map[string]any {
		status, resp := a.do(http.MethodPost, "/v1/runs?wait=20s", caller, map[string]any{
			"action": map[string]any{"name": "inv.writeoff", "args": map[string]any{"sku": "A-1"}}, "metadata": metadata})
		require.Contains(t, []int{http.StatusOK, http.StatusForbidden}, status, resp)
		return resp
	}
	forged := refund("runner", map[string]any{"roles": "finance", "scopes": []any{"finance"}})
	assert.Equal(t, "failed", forged["status"], forged)
	assert.Equal(t, string(actionbus.CodePolicyRejected), forged["error"].(map[string]any)["code"], "roles the caller wrote granted the action")

	granted := refund("finance", nil)
	assert.Equal(t, "completed", granted["status"], granted)
	status, view := a.do(http.MethodGet, "/v1/runs/"+granted["runId"].(string), "reader", nil)
	require.Equal(t, http.StatusOK, status)
	assert.Equal(t, "fin", view["userId"], "the run acts for the token's user")
}

// TestAnApprovalNamesTheTokensUserInTheAudit: a grant through the API is
// recorded, by the dispatcher's answer and in the audit, with the user of
// the token that approved.
func TestAnApprovalNamesTheTokensUserInTheAudit(t *testing.T) {
	a := newAPI(t)
	runID := a.start(reorder("A-1"))
	ap := a.pendingApproval(runID)
	require.NotNil(t, ap)
	status, body := a.do(http.MethodPost, "/v1/approvals/"+ap["approvalId"].(string)+"/approve", "approver", nil)
	require.Equal(t, http.StatusOK, status, body)
	_, result := a.followToEnd(runID)
	require.Equal(t, "completed", result["status"])
	var answers []map[string]any
	require.Eventually(t, func() bool {
		_, audit := a.do(http.MethodGet, "/v1/runs/"+runID+"/audit", "reader", nil)
		answers = nil
		recs, _ := audit["records"].([]any)
		for _, r := range recs {
			rec := r.(map[string]any)
			if rec["kind"] == "approval" && (rec["status"] == "granted" || rec["status"] == "answer_granted") {
				answers = append(answers, rec)
			}
		}
		return len(answers) == 2
	}, 10*time.Second, 50*time.Millisecond)
	for _, rec := range answers {
		assert.Equal(t, "approver", rec["userId"], "%s names its approver", rec["status"])
	}
}

func TestARunIsCanceled(t *testing.T) {
	a := newAPI(t)
	runID := a.start(map[string]any{"action": map[string]any{"name": "inv.wait", "args": map[string]any{}}})
	status, body := a.do(http.MethodPost, "/v1/runs/"+runID+"/cancel", "reader", map[string]any{"reason": "x"})
	assert.Equal(t, http.StatusForbidden, status, "a reader cannot cancel: %v", body)
	status, body = a.do(http.MethodPost, "/v1/runs/"+runID+"/cancel", "runner", map[string]any{"reason": "changed my mind"})
	require.Equal(t, http.StatusAccepted, status, body)
	_, result := a.followToEnd(runID)
	assert.Equal(t, "canceled", result["status"])
	assert.Equal(t, "changed my mind", result["reason"])
}

func TestAClarifyIsAnsweredThroughTheAPI(t *testing.T) {
	a := newAPI(t)
	runID := a.start(map[string]any{"prompt": "paint it", "scenario": "ask"})
	a.waitForRun(func(r map[string]any) bool {
		return r["runId"] == runID && r["status"] == "awaiting_input" && r["waiting"] == "input: Which one?"
	}, nil)
	status, body := a.do(http.MethodPost, "/v1/runs/"+runID+"/input", "reader", map[string]any{"answer": "blue"})
	assert.Equal(t, http.StatusForbidden, status, "a reader answers nothing: %v", body)
	status, body = a.do(http.MethodPost, "/v1/runs/"+runID+"/input", "runner", map[string]any{"answer": "blue"})
	require.Equal(t, http.StatusAccepted, status, body)
	_, result := a.followToEnd(runID)
	assert.Equal(t, "completed", result["status"])
	assert.Equal(t, "the blue one it is", result["answer"])
}

// TestAnotherTenantsRunsAreOutOfReach: the server's NATS users are tenant
// default's, so a run of tenant acme is neither listed, read, followed nor
// canceled through it, whatever the caller's token.
func TestAnotherTenantsRunsAreOutOfReach(t *testing.T) {
	a := newAPI(t)
	acme, err := client.New(a.srv.TenantConnect(t, "client-acme", "acme"), client.Options{Tenant: "acme"})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := acme.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "inv.stock", Args: map[string]any{"sku": "S"}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status)
	for _, path := range []string{"/v1/runs/" + res.RunID, "/v1/runs/" + res.RunID + "/events", "/v1/runs/" + res.RunID + "/audit"} {
		status, body := a.do(http.MethodGet, path, "reader", nil)
		assert.Equal(t, http.StatusNotFound, status, "%s: %v", path, body)
		assert.Equal(t, "run_not_found", errorCode(body))
	}
	status, body := a.do(http.MethodPost, "/v1/runs/"+res.RunID+"/cancel", "runner", map[string]any{})
	assert.Equal(t, http.StatusNotFound, status, body)
	// Started through the API after acme's: once the index shows it, acme's
	// run is not among the listed.
	status, body = a.do(http.MethodPost, "/v1/runs?wait=20s", "runner", map[string]any{"action": map[string]any{"name": "inv.stock", "args": map[string]any{"sku": "D"}}})
	require.Equal(t, http.StatusOK, status, body)
	mine := body["runId"].(string)
	a.waitForRun(func(r map[string]any) bool { return r["runId"] == mine },
		func(r map[string]any) { assert.NotEqual(t, res.RunID, r["runId"], "another tenant's run listed") })
}

// consumers counts the consumers of every stream.
func (a *api) consumers() int {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := 0
	for name := range a.srv.JS.StreamNames(ctx).Name() {
		st, err := a.srv.JS.Stream(ctx, name)
		require.NoError(a.t, err)
		info, err := st.Info(ctx)
		require.NoError(a.t, err)
		n += info.State.Consumers
	}
	return n
}

// TestFollowersReleaseTheirSubscriptionsWhenTheirClientsGoAway: many SSE
// follows of a waiting run hold no JetStream consumer, and once their
// HTTP clients disconnect, the API's connection is back to the
// subscriptions it had before them.
func TestFollowersReleaseTheirSubscriptionsWhenTheirClientsGoAway(t *testing.T) {
	a := newAPI(t)
	runID := a.start(map[string]any{"prompt": "paint it", "scenario": "ask"})
	baseline := a.nc.NumSubscriptions()
	a.events("/v1/runs/"+runID+"/events", "reader", func(event string, _ map[string]any) bool { return event == "run.step" })
	// That follow's subscription goes once its client has gone; counted
	// in the baseline, it made the count short of baseline+n below.
	require.Eventually(t, func() bool { return a.nc.NumSubscriptions() == baseline }, 10*time.Second, 10*time.Millisecond,
		"the first follow released its subscription: %d, baseline %d", a.nc.NumSubscriptions(), baseline)
	durables := a.consumers()
	const n = 40
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opened := make(chan error, n)
	for range n {
		go func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.url+"/v1/runs/"+runID+"/events", nil)
			if err != nil {
				opened <- err
				return
			}
			req.Header.Set("Authorization", "Bearer "+a.tokens["reader"])
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				opened <- err
				return
			}
			defer res.Body.Close()
			// The first event: the follow is under way.
			_, err = bufio.NewReader(res.Body).ReadString('\n')
			opened <- err
			<-ctx.Done()
		}()
	}
	for range n {
		require.NoError(t, <-opened)
	}
	require.Eventually(t, func() bool { return a.nc.NumSubscriptions() >= baseline+n }, 10*time.Second, 10*time.Millisecond,
		"every follow subscribed: %d, baseline %d", a.nc.NumSubscriptions(), baseline)
	assert.Equal(t, durables, a.consumers(), "followers hold JetStream consumers")
	cancel() // the HTTP clients go away
	require.Eventually(t, func() bool { return a.nc.NumSubscriptions() == baseline }, 10*time.Second, 10*time.Millisecond,
		"subscriptions left: %d, baseline %d", a.nc.NumSubscriptions(), baseline)
	assert.Equal(t, durables, a.consumers(), "consumers left behind")
}

// TestARunIsRetriedThroughTheAPI: POST /v1/runs/{id}/retry starts the
// retry of the token's user's failed run (its request again, signed by
// the gateway for that user): it runs (here it fails again, timing out as
// the first did, under its own run id), and a second retry of the same run
// is refused, naming the first. A reader retries nothing.
func TestARunIsRetriedThroughTheAPI(t *testing.T) {
	a := newAPI(t)
	status, first := a.do(http.MethodPost, "/v1/runs?wait=20s", "runner", map[string]any{"action": map[string]any{"name": "inv.slow", "args": map[string]any{}}})
	require.Equal(t, httpapi.StatusOf(actionbus.CodeTimeout), status, first)
	runID := first["runId"].(string)

	status, body := a.do(http.MethodPost, "/v1/runs/"+runID+"/retry", "reader", nil)
	assert.Equal(t, http.StatusForbidden, status, "a reader retries nothing: %v", body)

	status, retry := a.do(http.MethodPost, "/v1/runs/"+runID+"/retry?wait=20s", "runner", nil)
	require.NotEmpty(t, retry["runId"], "%d %v", status, retry)
	assert.NotEqual(t, runID, retry["runId"])
	assert.Equal(t, string(actionbus.CodeTimeout), errorCode(retry), "the retry ran the action again: %v", retry)

	status, again := a.do(http.MethodPost, "/v1/runs/"+runID+"/retry?wait=20s", "runner", nil)
	assert.Equal(t, httpapi.StatusOf(actionbus.CodeRetryRefused), status, again)
	assert.Equal(t, string(actionbus.CodeRetryRefused), errorCode(again))
	assert.Contains(t, again["error"].(map[string]any)["message"], retry["runId"], "the refusal names the retry")
}
