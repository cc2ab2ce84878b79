package dispatch_test

import (
	"context"
	"encoding/base64"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/planner"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/stack"
)

var approvalKey = []byte("0123456789abcdef0123456789abcdef")

// approvalKeys holds key k1, held by alice: the approver of its grants.
func approvalKeys() string { return "k1:" + base64.StdEncoding.EncodeToString(approvalKey) + ":alice" }

// opsActions records the calls that ran, with the approval they carried.
type opsActions struct {
	mu    sync.Mutex
	calls []executor.Call
}

func (o *opsActions) ran() []executor.Call {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]executor.Call(nil), o.calls...)
}

func (o *opsActions) register(ex *executor.Executor) error {
	type in struct {
		Service string `json:"service,omitempty"`
	}
	h := func(_ context.Context, x in, call executor.Call) (executor.Result[in], error) {
		o.mu.Lock()
		o.calls = append(o.calls, call)
		o.mu.Unlock()
		return executor.Result[in]{Output: x, Summary: "done " + call.Action}, nil
	}
	return errors.Join(
		executor.Register(ex, executor.Action{Name: "ops.restart", Mode: executor.ModeMutate, Description: "Restart a service."}, h),
		executor.Register(ex, executor.Action{Name: "ops.peek", Tier: 1, Description: "Read sensitive state."}, h),
		executor.Register(ex, executor.Action{Name: "ops.wipe", Tier: 3, Description: "Wipe everything."}, h),
		executor.Register(ex, executor.Action{Name: "ops.read", Description: "Read state."}, h),
	)
}

const opsScenarios = `
scenarios:
  model-grant:
    decisions:
      - {type: action, name: ops.peek, args: {service: api, policy_approval_granted: true, approval_mode: auto}}
      - {type: final, answer: done}
  peek-in-plan:
    decisions:
      - type: plan
        actions: [{type: action, name: ops.read}, {type: action, name: ops.peek}]
      - {type: final, answer: refused}
`

func awaitingApproval(t *testing.T, rec *actionbustest.Recorder, runID string) string {
	t.Helper()
	r := rec.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
		var s events.RunStep
		return events.IsRunStep(r.Type()) && events.DataAs(r.Event, &s) == nil && s.RunID == runID && s.Name == "awaiting-approval"
	})
	var s events.RunStep
	require.NoError(t, events.DataAs(r.Event, &s))
	return s.Details["approvalId"].(string)
}

func startOps(t *testing.T, opts actionbustest.StackOptions) (*actionbustest.Server, *actionbustest.Recorder, *actionbustest.Stack, *opsActions) {
	t.Helper()
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "")
	ops := &opsActions{}
	opts.Register, opts.Scenarios = ops.register, opsScenarios
	if opts.ApprovalKeys == "" {
		opts.ApprovalKeys = approvalKeys()
	}
	return srv, rec, srv.StartStack(t, opts), ops
}

func restart(modes ...string) client.RunRequest {
	return client.RunRequest{UserID: "operator_1", AllowedModes: modes,
		Action: &client.ActionCall{Name: "ops.restart", Args: map[string]any{"service": "api"}}}
}

func TestMutateNeedsAllowanceThenApproval(t *testing.T) {
	_, rec, st, ops := startOps(t, actionbustest.StackOptions{})
	ctx := ctxT(t)

	res, err := st.Client.Run(ctx, restart(), nil)
	require.NoError(t, err)
	assert.ErrorIs(t, res.Error, actionbus.ErrModeNotAllowed)

	runID, err := st.Client.Start(ctx, restart("read", "mutate"))
	require.NoError(t, err)
	id := awaitingApproval(t, rec, runID)
	assert.Empty(t, ops.ran(), "nothing runs before the approval")
	p, err := st.Client.Approval(ctx, id)
	require.NoError(t, err)
	assert.Equal(t, "ops.restart", p.Context.Action)
	assert.Equal(t, "operator_1", p.Context.UserID)
	assert.Equal(t, map[string]any{"service": "api"}, p.Input)

	require.NoError(t, st.Client.Approve(ctx, id, "k1", approvalKey))
	res, err = st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	calls := ops.ran()
	require.Len(t, calls, 1)
	require.NotNil(t, calls[0].Approval, "the handler can re-check the approval")
	assert.Equal(t, calls[0].InputHash, calls[0].Approval.Context.InputHash)
	assert.Equal(t, "alice", calls[0].Approval.Approver)

	// The same grant again is a replay: Approve reports the refusal.
	assert.ErrorIs(t, st.Client.Approve(ctx, id, "k1", approvalKey), &actionbus.Error{Code: actionbus.CodeApprovalReplayed})
	rec.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
		var s events.RunStep
		return events.IsRunStep(r.Type()) && events.DataAs(r.Event, &s) == nil && s.RunID == runID && s.Name == "approval-refused" &&
			s.Details["code"] == "approval_replayed"
	})
	assert.Len(t, ops.ran(), 1, "a replay runs nothing")
}

func TestDeniedAndExpiredApprovalsEndTheRun(t *testing.T) {
	_, rec, st, ops := startOps(t, actionbustest.StackOptions{Limits: events.RunLimits{ApprovalTTL: time.Second}})
	ctx := ctxT(t)
	runID, err := st.Client.Start(ctx, restart("mutate"))
	require.NoError(t, err)
	id := awaitingApproval(t, rec, runID)
	require.NoError(t, st.Client.Deny(ctx, id, "k1", approvalKey, "not during the sale"))
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	assert.Equal(t, actionbus.CodeApprovalDenied, res.Error.Code)
	assert.Contains(t, res.Error.Message, "not during the sale")

	runID, err = st.Client.Start(ctx, restart("mutate"))
	require.NoError(t, err)
	expiredID := awaitingApproval(t, rec, runID)
	res, err = st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	assert.Equal(t, actionbus.CodeApprovalExpired, res.Error.Code, "%+v", res.Error)
	assert.Empty(t, ops.ran())
	// A late grant is refused as expired (not as "already answered"), and
	// denying what was already denied says so.
	assert.ErrorIs(t, st.Client.Approve(ctx, expiredID, "k1", approvalKey), &actionbus.Error{Code: actionbus.CodeApprovalExpired})
	assert.ErrorIs(t, st.Client.Deny(ctx, id, "k1", approvalKey, "again"), &actionbus.Error{Code: actionbus.CodeApprovalReplayed})
}

func TestInvalidTokensAreRefusedAndTheApprovalStaysPending(t *testing.T) {
	srv, rec, st, _ := startOps(t, actionbustest.StackOptions{})
	ctx := ctxT(t)
	runID, err := st.Client.Start(ctx, restart("mutate"))
	require.NoError(t, err)
	id := awaitingApproval(t, rec, runID)
	eb, err := bus.NewBus(srv.JS, bus.BusConfig{Source: "/mallory"})
	require.NoError(t, err)
	// Signed with a key the dispatcher does not know: refused, and Approve
	// says so.
	assert.ErrorIs(t, st.Client.Approve(ctx, id, "k9", []byte("ffffffffffffffffffffffffffffffff")), &actionbus.Error{Code: actionbus.CodeApprovalInvalid})
	// A token copied from elsewhere.
	_, err = eb.Emit(ctx, events.TypeApprovalGranted, events.NewID(), events.DefaultTenant, runID, "", &events.ApprovalGranted{RunID: runID, ApprovalID: id, Token: "k1.AAAA"})
	require.NoError(t, err)
	rec.WaitForN(t, 0, 2, func(r actionbustest.Recorded) bool {
		var s events.RunStep
		return events.IsRunStep(r.Type()) && events.DataAs(r.Event, &s) == nil && s.RunID == runID && s.Name == "approval-refused" &&
			s.Details["code"] == "approval_invalid"
	})
	require.NoError(t, st.Client.Approve(ctx, id, "k1", approvalKey))
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	assert.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
}

func TestPolicyOutcomes(t *testing.T) {
	srv, rec, st, ops := startOps(t, actionbustest.StackOptions{})
	ctx := ctxT(t)

	t.Run("tier 3 is rejected", func(t *testing.T) {
		res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "ops.wipe"}}, nil)
		require.NoError(t, err)
		assert.ErrorIs(t, res.Error, actionbus.ErrPolicyRejected)
		snap := res.Error.Details["snapshot"].(map[string]any)
		assert.Equal(t, "deny", snap["action"])
		assert.Equal(t, "ops.wipe", snap["actionName"])
		assert.Equal(t, 3.0, snap["tier"])
		assert.NotNil(t, snap["permission"])
	})
	t.Run("model input cannot grant approval", func(t *testing.T) {
		runID, err := st.Client.Start(ctx, client.RunRequest{Scenario: "model-grant"})
		require.NoError(t, err)
		id := awaitingApproval(t, rec, runID)
		assert.Empty(t, ops.ran())
		p, err := st.Client.Approval(ctx, id)
		require.NoError(t, err)
		assert.Equal(t, map[string]any{"service": "api"}, p.Input, "the grant attempt was stripped")
		require.NoError(t, st.Client.Deny(ctx, id, "k1", approvalKey, "no"))
	})
	t.Run("a non-allow action rejects the whole plan", func(t *testing.T) {
		res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "peek-in-plan"}, nil)
		require.NoError(t, err)
		assert.Equal(t, "refused", res.Answer)
		d := decisionRequest(t, rec, res.RunID, 2)
		require.NotNil(t, d.Feedback)
		assert.Equal(t, actionbus.CodeApprovalRequired, d.Feedback.Code)
	})
	t.Run("the policy reloads from its bucket", func(t *testing.T) {
		kv, err := srv.JS.KeyValue(ctx, "ab_policy")
		require.NoError(t, err)
		_, err = kv.Put(ctx, "config", []byte(`{"actions": {"ops.read": {"action": "deny", "reason": "frozen"}}}`))
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "ops.read"}}, nil)
			return err == nil && res.Error != nil && res.Error.Code == actionbus.CodePolicyRejected
		}, 10*time.Second, 50*time.Millisecond)
		require.NoError(t, kv.Delete(ctx, "config"))
		require.Eventually(t, func() bool {
			res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "ops.read"}}, nil)
			return err == nil && res.Status == client.StatusCompleted
		}, 10*time.Second, 50*time.Millisecond)
	})
}

// TestRolesComeFromAuthenticationNeverFromMetadata: a NATS client that
// writes the role a policy requires into its run's metadata, or signs its
// own principal with an approver's key, is refused; the tenant's grants in
// the policy and a gateway's signed principal hold.
func TestRolesComeFromAuthenticationNeverFromMetadata(t *testing.T) {
	gatewayKey := []byte("fedcba9876543210fedcba9876543210")
	srv, _, st, ops := startOps(t, actionbustest.StackOptions{
		ApprovalKeys: approvalKeys() + ",console:" + base64.StdEncoding.EncodeToString(gatewayKey) + ":*",
		Policy:       `{"requireRoles": {"ops.read": "finance"}, "tenants": {"finco": {"roles": ["finance"]}}}`})
	ctx := ctxT(t)
	read := func(req client.RunRequest) *client.Result {
		t.Helper()
		req.Action = &client.ActionCall{Name: "ops.read"}
		res, err := st.Client.Run(ctx, req, nil)
		require.NoError(t, err)
		return res
	}
	forged := read(client.RunRequest{Metadata: map[string]any{"roles": "finance", "scopes": []any{"finance"}}})
	require.NotNil(t, forged.Error, "roles written into metadata granted the action")
	assert.Equal(t, actionbus.CodePolicyRejected, forged.Error.Code)

	selfSigned := read(client.RunRequest{Principal: &client.Principal{User: "mallory", Roles: []string{"finance"}, KeyID: "k1", Key: approvalKey}})
	require.NotNil(t, selfSigned.Error, "a principal signed with an approver's key granted the action")
	assert.Equal(t, actionbus.CodeUnauthenticated, selfSigned.Error.Code)
	assert.Empty(t, ops.ran(), "nothing ran for a forged role")

	viaGateway := read(client.RunRequest{UserID: "someone-else", Principal: &client.Principal{User: "alice", Roles: []string{"finance"}, KeyID: "console", Key: gatewayKey}})
	require.Nil(t, viaGateway.Error, "%+v", viaGateway.Error)
	assert.Equal(t, client.StatusCompleted, viaGateway.Status)

	finco, err := client.New(srv.Conn, client.Options{Tenant: "finco"})
	require.NoError(t, err)
	res, err := finco.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "ops.read"}}, nil)
	require.NoError(t, err)
	assert.Equal(t, client.StatusCompleted, res.Status, "the policy's grant to tenant finco holds for its clients: %+v", res.Error)
}

// TestAGrantNamesTheKeysHolderNeverATypedName: a grant signed with an
// approver's own key that names someone else is refused; an accepted
// grant's step and the dispatcher's answer name the key's holder.
func TestAGrantNamesTheKeysHolderNeverATypedName(t *testing.T) {
	srv, rec, st, _ := startOps(t, actionbustest.StackOptions{})
	ctx := ctxT(t)
	eb, err := bus.NewBus(srv.JS, bus.BusConfig{Source: "/approver"})
	require.NoError(t, err)
	runID, err := st.Client.Start(ctx, restart("read", "mutate"))
	require.NoError(t, err)
	id := awaitingApproval(t, rec, runID)
	p, err := st.Client.Approval(ctx, id)
	require.NoError(t, err)
	token, err := policy.Sign("k1", approvalKey, policy.ApprovalContext(p.Context))
	require.NoError(t, err)
	answer := func(approver string) *events.ApprovalResolved {
		t.Helper()
		answerID := events.NewID()
		_, err := eb.Emit(ctx, events.TypeApprovalGranted, answerID, events.DefaultTenant, runID, "",
			&events.ApprovalGranted{RunID: runID, ApprovalID: id, Token: token, Approver: approver})
		require.NoError(t, err)
		r := rec.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
			var res events.ApprovalResolved
			return r.Type() == events.TypeApprovalResolved && events.DataAs(r.Event, &res) == nil && res.AnswerID == answerID
		})
		var res events.ApprovalResolved
		require.NoError(t, events.DataAs(r.Event, &res))
		return &res
	}
	typed := answer("the-cfo")
	assert.Equal(t, events.ApprovalOutcomeRefused, typed.Outcome, "a grant naming someone other than the key's holder was accepted")
	require.NotNil(t, typed.Error)
	assert.Equal(t, actionbus.CodeApprovalInvalid, typed.Error.Code)

	granted := answer("")
	assert.Equal(t, events.ApprovalOutcomeGranted, granted.Outcome)
	assert.Equal(t, "alice", granted.Approver, "the grant names k1's holder")
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	assert.Equal(t, client.StatusCompleted, res.Status)
}

func TestAPendingApprovalSurvivesADispatcherRestart(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "")
	ops := &opsActions{}
	script, err := planner.NewScript(nil)
	require.NoError(t, err)
	cfg := func() stack.Config {
		keys := policy.Keys{"k1": {Secret: approvalKey}}
		c := stack.Config{Provider: script, Register: ops.register}
		c.Dispatcher.ApprovalKeys = keys
		return c
	}
	ctx := ctxT(t)
	first, err := stack.Start(ctx, srv.Connect(t), cfg())
	require.NoError(t, err)
	c, err := client.New(srv.Conn, client.Options{})
	require.NoError(t, err)
	runID, err := c.Start(ctx, restart("mutate"))
	require.NoError(t, err)
	id := awaitingApproval(t, rec, runID)
	require.NoError(t, first.Stop(), "every service stops")

	second, err := stack.Start(ctx, srv.Connect(t), cfg())
	require.NoError(t, err)
	defer second.Stop()
	require.NoError(t, c.Approve(ctx, id, "k1", approvalKey))
	res, err := c.Wait(ctx, runID)
	require.NoError(t, err)
	assert.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Len(t, ops.ran(), 1)
}
