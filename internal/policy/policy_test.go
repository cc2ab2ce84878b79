package policy_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/policy"
)

func TestCheckMode(t *testing.T) {
	cases := []struct {
		name      string
		requested []string
		mode      actions.Mode
		want      actionbus.Code
	}{
		{"read by default", nil, actions.ModeRead, ""},
		{"draft by default", nil, actions.ModeDraft, ""},
		{"dryRun by default", nil, actions.ModeDryRun, ""},
		{"mutate not by default", nil, actions.ModeMutate, actionbus.CodeModeNotAllowed},
		{"explicit list replaces the defaults", []string{"read"}, actions.ModeDryRun, actionbus.CodeModeNotAllowed},
		{"mutate when named", []string{"read", "mutate"}, actions.ModeMutate, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := policy.CheckMode(c.requested, "a.b", c.mode)
			if c.want == "" {
				assert.Nil(t, err)
				return
			}
			if assert.NotNil(t, err) {
				assert.Equal(t, c.want, err.Code)
				assert.Equal(t, "a.b", err.Details["action"])
			}
		})
	}
}

func readPerm(source string) actions.NormalizedPermission {
	p := (*actions.Permission)(nil).Normalize(actions.ModeRead)
	p.Source = source
	return p
}

func TestEvaluate(t *testing.T) {
	cfg, err := policy.ParseConfig([]byte(`{
	  "actions": {"ops.restart": "allow", "ops.wipe": {"action": "deny", "reason": "never from agents"}, "ops.peek": {"action": "ask", "reason": "sensitive"}},
	  "requireRoles": {"billing.refund": "finance"},
	  "requireScopes": {"*": "actions:run"},
	  "tenants": {"acme": {"scopes": ["actions:run"]}, "finco": {"roles": ["finance"], "scopes": ["actions:run"]}}
	}`))
	require.NoError(t, err)
	ev := &policy.Evaluator{Config: cfg}
	scoped := policy.Principal{Tenant: "acme"}
	gateway := func(g policy.Grants) policy.Principal {
		return policy.Principal{Tenant: "acme", Gateway: "console", User: "alice", Grants: g}
	}
	cases := []struct {
		name   string
		req    policy.Request
		effect string
		source string
	}{
		{"tier 0 allows", policy.Request{Action: "a", Tier: 0, Permission: readPerm("fallback"), Principal: scoped}, policy.Allow, "tier"},
		{"tier 1 asks", policy.Request{Action: "a", Tier: 1, Permission: readPerm("fallback"), Principal: scoped}, policy.Ask, "tier"},
		{"tier 2 asks", policy.Request{Action: "a", Tier: 2, Permission: readPerm("fallback"), Principal: scoped}, policy.Ask, "tier"},
		{"tier 3 denies", policy.Request{Action: "a", Tier: 3, Permission: readPerm("fallback"), Principal: scoped}, policy.Deny, "tier"},
		{"explicit string wins over tier", policy.Request{Action: "ops.restart", Tier: 2, Permission: readPerm("host_metadata"), Principal: scoped}, policy.Allow, "explicit"},
		{"explicit object with reason", policy.Request{Action: "ops.wipe", Tier: 0, Permission: readPerm("host_metadata"), Principal: scoped}, policy.Deny, "explicit"},
		{"explicit ask", policy.Request{Action: "ops.peek", Tier: 0, Permission: readPerm("host_metadata"), Principal: scoped}, policy.Ask, "explicit"},
		{"missing scope denies", policy.Request{Action: "a", Tier: 0, Permission: readPerm("fallback")}, policy.Deny, "policy"},
		{"role required and missing", policy.Request{Action: "billing.refund", Permission: readPerm("fallback"), Principal: scoped}, policy.Deny, "policy"},
		{"a tenant's grants hold for its NATS clients", policy.Request{Action: "billing.refund", Permission: readPerm("fallback"),
			Principal: policy.Principal{Tenant: "finco"}}, policy.Allow, "tier"},
		{"a gateway's user holds the grants it signed", policy.Request{Action: "billing.refund", Permission: readPerm("fallback"),
			Principal: gateway(policy.Grants{Roles: []string{"ops", "finance"}, Scopes: []string{"actions:run"}})}, policy.Allow, "tier"},
		{"a gateway's user does not inherit the tenant's grants", policy.Request{Action: "a", Permission: readPerm("fallback"),
			Principal: policy.Principal{Tenant: "finco", Gateway: "console", User: "bob"}}, policy.Deny, "policy"},
		{"roles the caller wrote into metadata grant nothing", policy.Request{Action: "billing.refund", Permission: readPerm("fallback"), Principal: scoped,
			Metadata: map[string]any{"scopes": "actions:run", "roles": []any{"ops", "finance"}}}, policy.Deny, "policy"},
		{"a principal's own unsigned roles grant nothing", policy.Request{Action: "billing.refund", Permission: readPerm("fallback"),
			Principal: policy.Principal{Tenant: "acme", Grants: policy.Grants{Roles: []string{"finance"}, Scopes: []string{"actions:run"}}}}, policy.Deny, "policy"},
		{"untrusted metadata fails closed to ask", policy.Request{Action: "mcp.tool", Permission: readPerm("dynamic"), Principal: scoped}, policy.Ask, "judge"},
		{"mutate always asks", policy.Request{Action: "ops.restart", Mode: actions.ModeMutate, Permission: (*actions.Permission)(nil).Normalize(actions.ModeMutate), Principal: scoped}, policy.Ask, "permission"},
		{"a deny beats mutate's ask", policy.Request{Action: "ops.wipe", Mode: actions.ModeMutate, Permission: (*actions.Permission)(nil).Normalize(actions.ModeMutate), Principal: scoped}, policy.Deny, "explicit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			snap := ev.Evaluate(context.Background(), c.req)
			assert.Equal(t, c.effect, snap.Action, snap.Reason)
			assert.Equal(t, c.source, snap.Source)
			assert.Equal(t, c.req.Action, snap.ActionName)
			assert.Equal(t, c.req.Tier, snap.Tier)
			assert.NotEmpty(t, snap.Reason)
		})
	}
}

func TestUnknownPolicyValuesAreRefused(t *testing.T) {
	for _, doc := range []string{
		`{"actions": {"a": "maybe"}}`,
		`{"actions": {"a": {"action": "allow", "because": "x"}}}`,
		`{"actions": {"a": 3}}`,
		`{"actionz": {}}`,
		`{"roleKey": "roles"}`,
	} {
		_, err := policy.ParseConfig([]byte(doc))
		assert.Error(t, err, doc)
	}
}

func TestComposeOrder(t *testing.T) {
	say := func(effect string) policy.Policy {
		return func(context.Context, policy.Request) policy.Verdict {
			return policy.Verdict{Effect: effect, Reason: effect}
		}
	}
	ctx := context.Background()
	cases := []struct {
		ps   []policy.Policy
		want string
	}{
		{[]policy.Policy{say(policy.Allow), say(policy.Ask)}, policy.Ask},
		{[]policy.Policy{say(policy.Ask), say(policy.Deny), say(policy.Allow)}, policy.Deny},
		{[]policy.Policy{say(policy.Allow), say("")}, policy.Allow},
		{[]policy.Policy{say(""), say("")}, ""},
		{nil, ""},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, policy.Compose(c.ps...)(ctx, policy.Request{}).Effect)
	}
	// A custom Go policy composes like the built-ins.
	businessHours := func(context.Context, policy.Request) policy.Verdict {
		return policy.Verdict{Effect: policy.Deny, Reason: "outside business hours"}
	}
	ev := &policy.Evaluator{Extra: []policy.Policy{businessHours}}
	snap := ev.Evaluate(ctx, policy.Request{Action: "a", Permission: readPerm("fallback")})
	assert.Equal(t, policy.Deny, snap.Action)
	assert.Equal(t, "outside business hours", snap.Reason)
}
