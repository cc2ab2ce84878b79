package audit_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/audit"
	"github.com/actionbus/actionbus/internal/policy"
)

func input() map[string]any {
	return map[string]any{
		"user":     "ada",
		"password": "hunter2",
		"profile":  map[string]any{"email": "ada@example.com", "name": "Ada"},
		"items":    []any{map[string]any{"token": "t0"}, map[string]any{"token": "t1"}},
		"a/b":      "slash key",
		"m~n":      "tilde key",
	}
}

func TestRedactPaths(t *testing.T) {
	tests := []struct {
		name  string
		paths []string
		check func(t *testing.T, got any)
	}{
		{"top-level key", []string{"/password"}, func(t *testing.T, got any) {
			m := got.(map[string]any)
			assert.Equal(t, audit.Redacted, m["password"])
			assert.Equal(t, "ada", m["user"])
		}},
		{"nested key", []string{"/profile/email"}, func(t *testing.T, got any) {
			p := got.(map[string]any)["profile"].(map[string]any)
			assert.Equal(t, audit.Redacted, p["email"])
			assert.Equal(t, "Ada", p["name"])
		}},
		{"array index", []string{"/items/1/token"}, func(t *testing.T, got any) {
			items := got.(map[string]any)["items"].([]any)
			assert.Equal(t, "t0", items[0].(map[string]any)["token"])
			assert.Equal(t, audit.Redacted, items[1].(map[string]any)["token"])
		}},
		{"~1 escapes a slash", []string{"/a~1b"}, func(t *testing.T, got any) {
			assert.Equal(t, audit.Redacted, got.(map[string]any)["a/b"])
		}},
		{"~0 escapes a tilde", []string{"/m~0n"}, func(t *testing.T, got any) {
			assert.Equal(t, audit.Redacted, got.(map[string]any)["m~n"])
		}},
		{"missing paths are ignored", []string{"/nope", "/profile/nope/deeper", "/items/9/token", "/items/01/token"}, func(t *testing.T, got any) {
			assert.Equal(t, input(), got)
		}},
		{"empty path redacts the whole payload", []string{"/user", ""}, func(t *testing.T, got any) {
			assert.Equal(t, audit.Redacted, got)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := input()
			tt.check(t, audit.Redact(in, tt.paths))
			assert.Equal(t, input(), in, "the original is not changed")
		})
	}
}

func TestPayloadModes(t *testing.T) {
	redactedHash, _ := policy.InputHash(map[string]any{"user": "ada", "password": audit.Redacted, "profile": map[string]any{"email": "ada@example.com", "name": "Ada"},
		"items": []any{map[string]any{"token": "t0"}, map[string]any{"token": "t1"}}, "a/b": "slash key", "m~n": "tilde key"})
	paths := []string{"/password"}
	t.Run("input", func(t *testing.T) {
		for _, tc := range []struct {
			mode string
			want any
		}{
			{"full", audit.Redact(input(), paths)}, // redaction applies in every mode that keeps a payload
			{"redacted", audit.Redact(input(), paths)},
			{"hash", map[string]any{"hash": redactedHash}},
			{"omit", nil},
		} {
			got := audit.ApplyInput(audit.PayloadPolicy{Input: tc.mode, RedactPaths: paths}, input())
			assert.Equal(t, tc.want, got, tc.mode)
		}
	})
	t.Run("output", func(t *testing.T) {
		out := []any{1.0, 2.0, 3.0}
		for _, tc := range []struct {
			mode, summary string
			want          any
			wantSummary   string
		}{
			{"full", "", []any{1.0, audit.Redacted, 3.0}, ""},
			{"redacted", "", []any{1.0, audit.Redacted, 3.0}, ""},
			{"hash", "", nil, ""},
			{"summary", "", nil, "array(length=3)"},
			{"summary", "three numbers", nil, "three numbers"},
			{"omit", "three numbers", nil, ""},
		} {
			got, sum := audit.ApplyOutput(audit.PayloadPolicy{Output: tc.mode, RedactPaths: []string{"/1"}}, out, tc.summary)
			if tc.mode == "hash" {
				h, _ := policy.InputHash([]any{1.0, audit.Redacted, 3.0})
				tc.want = map[string]any{"hash": h}
			}
			assert.Equal(t, tc.want, got, tc.mode)
			assert.Equal(t, tc.wantSummary, sum, tc.mode)
		}
	})
	t.Run("shape summaries", func(t *testing.T) {
		for v, want := range map[any]string{"s": "string", 1.5: "number", true: "boolean"} {
			assert.Equal(t, want, audit.Shape(v))
		}
		assert.Equal(t, "null", audit.Shape(nil))
		assert.Equal(t, "object", audit.Shape(map[string]any{"a": 1}))
		assert.Equal(t, "array(length=0)", audit.Shape([]any{}))
	})
	t.Run("error", func(t *testing.T) {
		e := actionbus.Errorf(actionbus.CodeHandlerFailed, "db password hunter2 refused").WithDetail("password", "hunter2").WithDetail("host", "db1")
		assert.Equal(t, map[string]any{"code": "handler_failed", "message": "db password hunter2 refused"},
			audit.ApplyError(audit.PayloadPolicy{Error: "summary"}, e))
		assert.Nil(t, audit.ApplyError(audit.PayloadPolicy{Error: "omit"}, e))
		full := audit.ApplyError(audit.PayloadPolicy{Error: "full"}, e).(map[string]any)
		assert.Equal(t, "hunter2", full["details"].(map[string]any)["password"])
		red := audit.ApplyError(audit.PayloadPolicy{Error: "redacted", RedactPaths: []string{"/details/password", "/message"}}, e).(map[string]any)
		assert.Equal(t, audit.Redacted, red["details"].(map[string]any)["password"])
		assert.Equal(t, audit.Redacted, red["message"])
		assert.Equal(t, "db1", red["details"].(map[string]any)["host"])
	})
}

func TestActionOverridesFieldByFieldAndRedactPathsAdd(t *testing.T) {
	def := audit.PayloadPolicy{Input: "redacted", Output: "summary", Error: "summary", RedactPaths: []string{"/password"}}
	eff := audit.Effective(def, &actions.AuditPolicy{Output: "full", RedactPaths: []string{"/profile/email", "/password"}})
	assert.Equal(t, audit.PayloadPolicy{Input: "redacted", Output: "full", Error: "summary", RedactPaths: []string{"/password", "/profile/email"}}, eff)
	assert.Equal(t, def, audit.Effective(def, nil))
	got := audit.ApplyInput(eff, input()).(map[string]any)
	assert.Equal(t, audit.Redacted, got["password"])
	assert.Equal(t, audit.Redacted, got["profile"].(map[string]any)["email"])
	assert.Equal(t, []string{"/password"}, def.RedactPaths, "the default is not changed")
}

func TestInvalidAuditPolicies(t *testing.T) {
	for _, tc := range []struct {
		name string
		pol  actions.AuditPolicy
		want string
	}{
		{"path without a leading slash", actions.AuditPolicy{RedactPaths: []string{"/ok", "password"}}, `redactPaths[1] "password" is not a JSON Pointer`},
		{"bad escape", actions.AuditPolicy{RedactPaths: []string{"/a~2b"}}, `has a "~" that is not "~0" or "~1"`},
		{"summary is not an input mode", actions.AuditPolicy{Input: "summary"}, `audit policy input mode "summary" (want full, redacted, hash, omit)`},
		{"hash is not an error mode", actions.AuditPolicy{Error: "hash"}, `audit policy error mode "hash"`},
		{"unknown output mode", actions.AuditPolicy{Output: "everything"}, `audit policy output mode "everything"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.pol.Validate()
			assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeInvalidAuditPolicy})
			assert.ErrorContains(t, err, tc.want)
		})
	}
	assert.NoError(t, (&actions.AuditPolicy{Input: "hash", Output: "summary", Error: "summary", RedactPaths: []string{"", "/a~0~1"}}).Validate())
	_, err := audit.New(nil, audit.Config{Payload: audit.PayloadPolicy{RedactPaths: []string{"token"}}})
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeInvalidAuditPolicy}, "refused at configuration time")
}
