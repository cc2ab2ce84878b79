package catalog_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/catalog"
)

func bp(b bool) *bool { return &b }

func TestPermissionNormalization(t *testing.T) {
	cases := []struct {
		name string
		mode catalog.Mode
		in   *catalog.Permission
		want catalog.NormalizedPermission
	}{
		{"read without metadata", catalog.ModeRead, nil,
			catalog.NormalizedPermission{Effect: "read_state", InterruptBehavior: "block", ConcurrencySafe: true, ReadOnly: true, Source: "fallback"}},
		{"mutate without metadata", catalog.ModeMutate, nil,
			catalog.NormalizedPermission{Effect: "write_state", InterruptBehavior: "block", Destructive: true, NeedsApproval: true, Source: "fallback"}},
		{"draft without metadata is not read-only", catalog.ModeDraft, nil,
			catalog.NormalizedPermission{Effect: "draft", InterruptBehavior: "block", Source: "fallback"}},
		{"partial metadata keeps declared fields", catalog.ModeRead, &catalog.Permission{Effect: "external_network", InterruptBehavior: "abort_safe"},
			catalog.NormalizedPermission{Effect: "external_network", InterruptBehavior: "abort_safe", ConcurrencySafe: true, ReadOnly: true, Source: "fallback"}},
		{"complete metadata is host metadata", catalog.ModeRead, &catalog.Permission{Effect: "external_network", InterruptBehavior: "abort_safe",
			ConcurrencySafe: bp(true), Destructive: bp(false), ReadOnly: bp(true), NeedsApproval: bp(true)},
			catalog.NormalizedPermission{Effect: "external_network", InterruptBehavior: "abort_safe", ConcurrencySafe: true, ReadOnly: true, NeedsApproval: true, Source: "host_metadata"}},
		{"a mutate action cannot declare itself safe", catalog.ModeMutate, &catalog.Permission{ReadOnly: bp(true), NeedsApproval: bp(false), Source: "built_in_metadata"},
			catalog.NormalizedPermission{Effect: "write_state", InterruptBehavior: "block", Destructive: true, NeedsApproval: true, Source: "built_in_metadata"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, c.in.Normalize(c.mode))
		})
	}
}

func TestKeysRenderFromTheCall(t *testing.T) {
	call := catalog.LimitCall{Tenant: "acme", UserID: "u1", Action: "crm.update",
		Metadata: map[string]any{"plan": "gold"}, Input: map[string]any{"customerId": "c-9"}}
	for _, c := range []struct {
		expr, want string
	}{
		{"", "crm.update"},
		{"{{.tenant}}", "crm.update|acme"},
		{"{{.tenant}}/{{.input.customerId}}", "crm.update|acme/c-9"},
		{"{{.metadata.plan}}-{{.user}}", "crm.update|gold-u1"},
		{"{{.input.missing}}", "crm.update|"},
	} {
		got, err := catalog.Limits{Key: c.expr}.RenderKey(call)
		require.NoError(t, err, c.expr)
		assert.Equal(t, c.want, got, c.expr)
	}
}

func TestLimitsValidate(t *testing.T) {
	for _, c := range []struct {
		spec catalog.Limits
		ok   bool
	}{
		{catalog.Limits{}, true},
		{catalog.Limits{MaxInFlight: 2, Key: "{{.tenant}}"}, true},
		{catalog.Limits{Rate: &catalog.Rate{Limit: 1, PerMs: 1000}}, true},
		{catalog.Limits{MaxInFlight: -1}, false},
		{catalog.Limits{Rate: &catalog.Rate{Limit: 0, PerMs: 1000}}, false},
		{catalog.Limits{Rate: &catalog.Rate{Limit: 1}}, false},
		{catalog.Limits{Key: "{{.tenant"}, false},
	} {
		assert.Equal(t, c.ok, c.spec.Validate() == nil, "%+v", c.spec)
	}
}

func TestAuditPolicyValidate(t *testing.T) {
	for _, c := range []struct {
		name   string
		policy *catalog.AuditPolicy
		path   string // of the refused field; "" when accepted
	}{
		{"nil", nil, ""},
		{"every mode", &catalog.AuditPolicy{Input: catalog.PayloadHash, Output: catalog.PayloadSummary, Error: catalog.PayloadRedacted,
			RedactPaths: []string{"", "/card", "/a~1b/~0c"}}, ""},
		{"summary of an input", &catalog.AuditPolicy{Input: catalog.PayloadSummary}, "/auditPolicy/input"},
		{"hash of an error", &catalog.AuditPolicy{Error: catalog.PayloadHash}, "/auditPolicy/error"},
		{"unknown output mode", &catalog.AuditPolicy{Output: "some"}, "/auditPolicy/output"},
		{"a path that is no pointer", &catalog.AuditPolicy{RedactPaths: []string{"/ok", "card"}}, "/auditPolicy/redactPaths/1"},
		{"a bad escape", &catalog.AuditPolicy{RedactPaths: []string{"/a~2"}}, "/auditPolicy/redactPaths/0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.policy.Validate()
			if c.path == "" {
				require.NoError(t, err)
				return
			}
			var e *actionbus.Error
			require.ErrorAs(t, err, &e)
			assert.Equal(t, actionbus.CodeInvalidAuditPolicy, e.Code)
			assert.Equal(t, c.path, e.Details["path"])
		})
	}
}

// FuzzValidate: what an executor announces, decoded into each declared
// type, is accepted or refused with a coded error; never a panic.
func FuzzValidate(f *testing.F) {
	for _, seed := range []string{`{}`, `{"name":"a","description":"A.","tools":[{"name":"t","mode":"read","tier":4}]}`,
		`{"input":"hash","redactPaths":["/a~1"]}`, `{"key":"{{.tenant","maxInFlight":-1,"rate":{"limit":0}}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		var s catalog.Skill
		if json.Unmarshal(doc, &s) == nil {
			if err := s.Validate(); err != nil {
				var e *actionbus.Error
				require.ErrorAs(t, err, &e)
				require.Equal(t, actionbus.CodeInvalidSkill, e.Code)
			}
		}
		var a catalog.AuditPolicy
		if json.Unmarshal(doc, &a) == nil {
			if err := a.Validate(); err != nil {
				var e *actionbus.Error
				require.ErrorAs(t, err, &e)
				require.Equal(t, actionbus.CodeInvalidAuditPolicy, e.Code)
			}
		}
		var l catalog.Limits
		if json.Unmarshal(doc, &l) == nil && l.Validate() == nil {
			_, _ = l.RenderKey(catalog.LimitCall{Action: "a", Input: map[string]any{"x": string(doc)}})
		}
	})
}
