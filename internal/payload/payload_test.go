package payload_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/audit"
	"github.com/actionbus/actionbus/internal/payload"
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
			assert.Equal(t, payload.Redacted, m["password"])
			assert.Equal(t, "ada", m["user"])
		}},
		{"nested key", []string{"/profile/email"}, func(t *testing.T, got any) {
			p := got.(map[string]any)["profile"].(map[string]any)
			assert.Equal(t, payload.Redacted, p["email"])
			assert.Equal(t, "Ada", p["name"])
		}},
		{"array index", []string{"/items/1/token"}, func(t *testing.T, got any) {
			items := got.(map[string]any)["items"].([]any)
			assert.Equal(t, "t0", items[0].(map[string]any)["token"])
			assert.Equal(t, payload.Redacted, items[1].(map[string]any)["token"])
		}},
		{"~1 escapes a slash", []string{"/a~1b"}, func(t *testing.T, got any) {
			assert.Equal(t, payload.Redacted, got.(map[string]any)["a/b"])
		}},
		{"~0 escapes a tilde", []string{"/m~0n"}, func(t *testing.T, got any) {
			assert.Equal(t, payload.Redacted, got.(map[string]any)["m~n"])
		}},
		{"missing paths are ignored", []string{"/nope", "/profile/nope/deeper", "/items/9/token", "/items/01/token"}, func(t *testing.T, got any) {
			assert.Equal(t, input(), got)
		}},
		{"empty path redacts the whole payload", []string{"/user", ""}, func(t *testing.T, got any) {
			assert.Equal(t, payload.Redacted, got)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := input()
			tt.check(t, payload.Redact(in, tt.paths))
			assert.Equal(t, input(), in, "the original is not changed")
		})
	}
}

func TestPayloadModes(t *testing.T) {
	redactedHash, _ := policy.InputHash(map[string]any{"user": "ada", "password": payload.Redacted, "profile": map[string]any{"email": "ada@example.com", "name": "Ada"},
		"items": []any{map[string]any{"token": "t0"}, map[string]any{"token": "t1"}}, "a/b": "slash key", "m~n": "tilde key"})
	paths := []string{"/password"}
	t.Run("input", func(t *testing.T) {
		for _, tc := range []struct {
			mode string
			want any
		}{
			{"full", payload.Redact(input(), paths)}, // redaction applies in every mode that keeps a payload
			{"redacted", payload.Redact(input(), paths)},
			{"hash", map[string]any{"hash": redactedHash}},
			{"omit", nil},
		} {
			got := payload.ApplyInput(payload.Policy{Input: tc.mode, RedactPaths: paths}, input())
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
			{"full", "", []any{1.0, payload.Redacted, 3.0}, ""},
			{"redacted", "", []any{1.0, payload.Redacted, 3.0}, ""},
			{"hash", "", nil, ""},
			{"summary", "", nil, "array(length=3)"},
			{"summary", "three numbers", nil, "three numbers"},
			{"omit", "three numbers", nil, ""},
		} {
			got, sum := payload.ApplyOutput(payload.Policy{Output: tc.mode, RedactPaths: []string{"/1"}}, out, tc.summary)
			if tc.mode == "hash" {
				h, _ := policy.InputHash([]any{1.0, payload.Redacted, 3.0})
				tc.want = map[string]any{"hash": h}
			}
			assert.Equal(t, tc.want, got, tc.mode)
			assert.Equal(t, tc.wantSummary, sum, tc.mode)
		}
	})
	t.Run("shape summaries", func(t *testing.T) {
		for v, want := range map[any]string{"s": "string", 1.5: "number", true: "boolean"} {
			assert.Equal(t, want, payload.Shape(v))
		}
		assert.Equal(t, "null", payload.Shape(nil))
		assert.Equal(t, "object", payload.Shape(map[string]any{"a": 1}))
		assert.Equal(t, "array(length=0)", payload.Shape([]any{}))
	})
	t.Run("error", func(t *testing.T) {
		e := actionbus.Errorf(actionbus.CodeHandlerFailed, "db password hunter2 refused").WithDetail("password", "hunter2").WithDetail("host", "db1")
		assert.Equal(t, map[string]any{"code": "handler_failed", "message": "db password hunter2 refused"},
			payload.ApplyError(payload.Policy{Error: "summary"}, e))
		assert.Nil(t, payload.ApplyError(payload.Policy{Error: "omit"}, e))
		full := payload.ApplyError(payload.Policy{Error: "full"}, e).(map[string]any)
		assert.Equal(t, "hunter2", full["details"].(map[string]any)["password"])
		red := payload.ApplyError(payload.Policy{Error: "redacted", RedactPaths: []string{"/details/password", "/message"}}, e).(map[string]any)
		assert.Equal(t, payload.Redacted, red["details"].(map[string]any)["password"])
		assert.Equal(t, payload.Redacted, red["message"])
		assert.Equal(t, "db1", red["details"].(map[string]any)["host"])
	})
}

func TestActionOverridesFieldByFieldAndRedactPathsAdd(t *testing.T) {
	def := payload.Policy{Input: "redacted", Output: "summary", Error: "summary", RedactPaths: []string{"/password"}}
	eff := payload.Effective(def, &actions.AuditPolicy{Output: "full", RedactPaths: []string{"/profile/email", "/password"}})
	assert.Equal(t, payload.Policy{Input: "redacted", Output: "full", Error: "summary", RedactPaths: []string{"/password", "/profile/email"}}, eff)
	assert.Equal(t, def, payload.Effective(def, nil))
	got := payload.ApplyInput(eff, input()).(map[string]any)
	assert.Equal(t, payload.Redacted, got["password"])
	assert.Equal(t, payload.Redacted, got["profile"].(map[string]any)["email"])
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
	_, err := audit.New(nil, audit.Config{Payload: payload.Policy{RedactPaths: []string{"token"}}})
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeInvalidAuditPolicy}, "refused at configuration time")
}
