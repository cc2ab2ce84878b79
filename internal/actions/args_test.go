package actions_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/internal/actions"
)

const docSchema = `{
  "type": "object",
  "properties": {
    "document_no": {"type": "string", "x-aliases": ["documentNo", "docNo"]},
    "pageSize": {"type": "integer"},
    "filter": {
      "type": "object",
      "properties": {"status": {"type": "string", "x-aliases": ["state"]}, "since": {"type": ["string", "null"]}},
      "required": ["status"]
    },
    "tenant": {"type": "string"}
  },
  "required": ["document_no"]
}`

func checker(t *testing.T, schema string, mutate ...func(*actions.Definition)) *actions.ArgsChecker {
	t.Helper()
	def := actions.Definition{Name: "docs.get", InputSchema: json.RawMessage(schema), HostOnlyKeys: []string{"tenant"}}
	for _, m := range mutate {
		m(&def)
	}
	require.NoError(t, def.Normalize())
	c, err := actions.NewArgsChecker(def)
	require.NoError(t, err)
	return c
}

func TestPrepareArgs(t *testing.T) {
	c := checker(t, docSchema)
	cases := []struct {
		name     string
		origin   string
		in       string
		want     string
		rewrites []actions.AliasRewrite
		stripped []string
		hostOnly []string
		nulls    []string
		issues   []string // keys with issues
		reasons  []string
	}{
		{name: "alias only", origin: "model", in: `{"documentNo":"D1"}`, want: `{"document_no":"D1"}`,
			rewrites: []actions.AliasRewrite{{Path: "", From: "documentNo", To: "document_no"}}},
		{name: "collision: canonical wins, alias dropped", origin: "model", in: `{"document_no":"D1","docNo":"D2"}`, want: `{"document_no":"D1"}`,
			rewrites: []actions.AliasRewrite{{Path: "", From: "docNo", To: "document_no", Collision: true}}},
		{name: "nested alias", origin: "model", in: `{"document_no":"D1","filter":{"state":"open"}}`, want: `{"document_no":"D1","filter":{"status":"open"}}`,
			rewrites: []actions.AliasRewrite{{Path: "/filter", From: "state", To: "status"}}},
		{name: "no global case fallback", origin: "host", in: `{"document_no":"D1","page_size":3}`, want: `{"document_no":"D1","page_size":3}`},
		{name: "model: undeclared keys stripped, nested too", origin: "model",
			in: `{"document_no":"D1","x":1,"filter":{"status":"a","y":2}}`, want: `{"document_no":"D1","filter":{"status":"a"}}`,
			stripped: []string{"/filter/y", "/x"}},
		{name: "host: undeclared keys kept", origin: "host", in: `{"document_no":"D1","x":1}`, want: `{"document_no":"D1","x":1}`},
		{name: "model: host-only key stripped", origin: "model", in: `{"document_no":"D1","tenant":"acme"}`, want: `{"document_no":"D1"}`,
			hostOnly: []string{"/tenant"}},
		{name: "host: host-only key kept", origin: "host", in: `{"document_no":"D1","tenant":"acme"}`, want: `{"document_no":"D1","tenant":"acme"}`},
		{name: "missing required", origin: "model", in: `{"pageSize":3}`, want: `{"pageSize":3}`,
			issues: []string{"/document_no"}, reasons: []string{"missing"}},
		{name: "wrong type", origin: "model", in: `{"document_no":"D1","pageSize":"three"}`, want: `{"document_no":"D1","pageSize":"three"}`,
			issues: []string{"/pageSize"}, reasons: []string{"type"}},
		{name: "nested required", origin: "model", in: `{"document_no":"D1","filter":{}}`, want: `{"document_no":"D1","filter":{}}`,
			issues: []string{"/filter/status"}, reasons: []string{"missing"}},
		{name: "null kept where allowed", origin: "model", in: `{"document_no":"D1","filter":{"status":"a","since":null}}`,
			want: `{"document_no":"D1","filter":{"status":"a","since":null}}`},
		{name: "seed 000: a required value given as null is missing", origin: "model", in: `{"document_no":null}`, want: `{"document_no":null}`,
			issues: []string{"/document_no"}, reasons: []string{"missing"}},
		{name: "seed 000: a required string of only whitespace is missing", origin: "model", in: `{"document_no":" \t\n"}`, want: `{"document_no":" \t\n"}`,
			issues: []string{"/document_no"}, reasons: []string{"missing"}},
		{name: "seed 000: an optional value given as null is absent", origin: "model", in: `{"document_no":"D1","pageSize":null}`, want: `{"document_no":"D1"}`,
			nulls: []string{"/pageSize"}},
		{name: "an optional null is absent for host input too", origin: "host", in: `{"document_no":"D1","pageSize":null,"x":null}`, want: `{"document_no":"D1"}`,
			nulls: []string{"/pageSize", "/x"}},
		{name: "a non-null value of the wrong type is still refused", origin: "model", in: `{"document_no":"D1","pageSize":false}`, want: `{"document_no":"D1","pageSize":false}`,
			issues: []string{"/pageSize"}, reasons: []string{"type"}},
		{name: "empty input", origin: "model", in: `null`, want: `{}`, issues: []string{"/document_no"}, reasons: []string{"missing"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var in map[string]any
			require.NoError(t, json.Unmarshal([]byte(tc.in), &in))
			before, _ := json.Marshal(in)
			out, rep, issues := c.Prepare(in, tc.origin)
			got, _ := json.Marshal(out)
			assert.JSONEq(t, tc.want, string(got))
			after, _ := json.Marshal(in)
			assert.Equal(t, string(before), string(after), "the caller's input is not modified")
			assert.Equal(t, tc.rewrites, rep.Rewrites)
			assert.Equal(t, tc.stripped, rep.Stripped)
			assert.Equal(t, tc.hostOnly, rep.HostOnlyStripped)
			assert.Equal(t, tc.nulls, rep.NullAbsent)
			var keys, reasons []string
			for _, is := range issues {
				keys = append(keys, is.Key)
				reasons = append(reasons, is.Reason)
				assert.Equal(t, "docs.get", is.ActionName)
				assert.NotEmpty(t, is.Error)
			}
			assert.Equal(t, tc.issues, keys)
			assert.Equal(t, tc.reasons, reasons)
		})
	}
}

func TestAutoHealOfFlattenedArgs(t *testing.T) {
	schema := `{"type":"object","properties":{"skillName":{"type":"string"},"toolName":{"type":"string"},"args":{"type":"object"}},"required":["toolName"]}`
	c := checker(t, schema, func(d *actions.Definition) { d.HealFlattenedInto = "args"; d.HostOnlyKeys = nil })
	cases := []struct{ name, in, want string }{
		{"flattened keys lifted", `{"toolName":"now","timezone":"Asia/Tokyo","reasoning":"r"}`, `{"toolName":"now","args":{"timezone":"Asia/Tokyo"},"reasoning":"r"}`},
		{"nested args win: nothing lifted", `{"toolName":"now","args":{"timezone":"UTC"},"timezone":"Asia/Tokyo"}`, `{"toolName":"now","args":{"timezone":"UTC"},"timezone":"Asia/Tokyo"}`},
		{"empty args filled", `{"toolName":"now","args":{},"limit":3}`, `{"toolName":"now","args":{"limit":3}}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var in map[string]any
			require.NoError(t, json.Unmarshal([]byte(tc.in), &in))
			// Host origin so that stripping does not hide what healing did.
			out, _, issues := c.Prepare(in, "host")
			assert.Empty(t, issues)
			got, _ := json.Marshal(out)
			assert.JSONEq(t, tc.want, string(got))
		})
	}
}

func TestDerivedSchemaRefsAreResolved(t *testing.T) {
	// What invopop/jsonschema derives for nested structs: $ref into $defs.
	schema := `{"$ref":"#/$defs/In","$defs":{"In":{"type":"object","properties":{"inner":{"$ref":"#/$defs/Inner"}}},
	  "Inner":{"type":"object","properties":{"a":{"type":"string","x-aliases":"alpha, first"}}}}}`
	c := checker(t, schema, func(d *actions.Definition) { d.HostOnlyKeys = nil })
	out, rep, issues := c.Prepare(map[string]any{"inner": map[string]any{"first": "x", "junk": 1}, "junk": 2}, "model")
	assert.Empty(t, issues)
	assert.Equal(t, map[string]any{"inner": map[string]any{"a": "x"}}, out)
	assert.Equal(t, []string{"/inner/junk", "/junk"}, rep.Stripped)
	assert.Len(t, rep.Rewrites, 1)
}

func TestANullOptionalKeyOfADerivedSchemaIsAbsentAndARequiredOneMissing(t *testing.T) {
	// The root is a $ref, as invopop/jsonschema derives it.
	schema := `{"$ref":"#/$defs/In","$defs":{"In":{"type":"object","properties":{"q":{"type":"string"},"limit":{"type":"integer"}},"required":["q"]}}}`
	c := checker(t, schema, func(d *actions.Definition) { d.HostOnlyKeys = nil })
	out, rep, issues := c.Prepare(map[string]any{"q": "x", "limit": nil}, "model")
	assert.Empty(t, issues)
	assert.Equal(t, map[string]any{"q": "x"}, out)
	assert.Equal(t, []string{"/limit"}, rep.NullAbsent)
	_, _, issues = c.Prepare(map[string]any{"q": nil}, "model")
	require.Len(t, issues, 1)
	assert.Equal(t, "/q", issues[0].Key)
	assert.Equal(t, "missing", issues[0].Reason)
}

func TestArgsErrorDetailsAreFlatAndListEveryIssue(t *testing.T) {
	pi := 2
	issues := []actions.ArgIssue{
		{ActionName: "docs.get", Key: "/document_no", Reason: "missing", Error: "required", PlanIndex: &pi},
		{ActionName: "docs.get", Key: "/pageSize", Reason: "type", Error: "want integer", PlanIndex: &pi},
	}
	err := actions.ArgsError("docs.get", issues)
	assert.Equal(t, map[string]any{"actionName": "docs.get", "key": "/document_no", "reason": "missing", "error": "required",
		"planIndex": 2, "issues": issues}, err.Details)
	// The single-action path: the same shape without planIndex.
	alone := []actions.ArgIssue{{ActionName: "docs.get", Key: "/pageSize", Reason: "type", Error: "want integer"}}
	assert.Equal(t, map[string]any{"actionName": "docs.get", "key": "/pageSize", "reason": "type", "error": "want integer", "issues": alone},
		actions.ArgsDetails("docs.get", alone))
}
