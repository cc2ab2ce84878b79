package canonical_test

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/gowebpki/jcs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/canonical"
	"github.com/actionbus/actionbus/internal/policy"
)

// reference is what canonical.Marshal must equal: the value's JSON,
// canonicalized by the RFC 8785 library.
func reference(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	c, err := jcs.Transform(b)
	require.NoError(t, err)
	return c
}

func TestMarshalIsTheCanonicalFormOfTheJSON(t *testing.T) {
	type inner struct {
		B string `json:"b"`
		A int    `json:"a,omitempty"`
	}
	type withOptions struct {
		Z        string `json:"z"`
		Skipped  string `json:"-"`
		NoTag    string
		Empty    string            `json:"empty,omitempty"`
		Zero     time.Time         `json:"zero,omitzero"`
		When     time.Time         `json:"when"`
		Ptr      *inner            `json:"ptr,omitempty"`
		Nested   inner             `json:"nested"`
		Map      map[string]string `json:"map,omitempty"`
		Any      any               `json:"any"`
		Raw      json.RawMessage   `json:"raw,omitempty"`
		Bytes    []byte            `json:"bytes"`
		F32      float32           `json:"f32"`
		Big      int64             `json:"big"`
		unexport string
	}
	for _, tc := range []struct {
		name string
		v    any
		want string // the RFC's expected text, where it is worth writing down
	}{
		{"nil", nil, "null"},
		{"literals", []any{true, false, nil}, "[true,false,null]"},
		// RFC 8785 §3.2.2.3 and Appendix B numbers.
		{"numbers", []any{333333333.33333329, 1e30, 4.50, 2e-3, 0.000000000000000000000000001, 1e21, 1e20, 1e-7, 1e-6, math.Copysign(0, -1), 5e-324, 1.7976931348623157e308},
			"[333333333.3333333,1e+30,4.5,0.002,1e-27,1e+21,100000000000000000000,1e-7,0.000001,0,5e-324,1.7976931348623157e+308]"},
		{"integers beyond 2^53 round like floats", []any{int64(1) << 60, uint64(math.MaxUint64), int64(9007199254740993)}, ""},
		// RFC 8785 §3.2.3: sorted by UTF-16 code units (the emoji's
		// surrogates sort before U+FB33).
		{"key order", map[string]any{"\u20ac": "Euro Sign", "\r": "Carriage Return", "\ufb33": "Hebrew Letter Dalet With Dagesh",
			"1": "One", "\U0001F600": "Emoji: Grinning Face", "\u0080": "Control", "\u00f6": "Latin Small Letter O With Diaeresis"},
			"{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"\u00f6\":\"Latin Small Letter O With Diaeresis\",\"\u20ac\":\"Euro Sign\",\"\U0001F600\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}"},
		{"string escapes", "\u20ac$\u000f\nA'B\"\\\\\"/<>&\u2028\x7f\t\b\f", "\"\u20ac$\\u000f\\nA'B\\\"\\\\\\\\\\\"/<>&\u2028\x7f\\t\\b\\f\""},
		{"invalid UTF-8", map[string]any{"k\xff": "v\xfe\xfd", "ok": "x"}, ""},
		{"nested", map[string]any{"b": []any{map[string]any{"z": 1.0, "a": "x"}}, "a": map[string]any{}}, `{"a":{},"b":[{"a":"x","z":1}]}`},
		{"struct options", withOptions{Z: "z", Skipped: "no", NoTag: "t", When: time.Date(2026, 12, 1, 10, 0, 0, 123, time.FixedZone("x", 3600)),
			Nested: inner{B: "b"}, Any: map[string]any{"q": []any{1.5}}, Raw: json.RawMessage(` { "b" : 1, "a":2 } `), Bytes: []byte("hi"),
			F32: 0.1, Big: 1 << 62, unexport: "not written"}, ""},
		{"struct with a pointer and a map", withOptions{Ptr: &inner{B: "p", A: 3}, Map: map[string]string{"y": "1", "x": "2"}}, ""},
		{"an error with MarshalJSON-free fields", &actionbus.Error{Code: "timeout", Message: "no answer\n", Details: map[string]any{"ms": 30000.0}}, ""},
		{"json.Number", []any{json.Number("1.50"), json.Number("-0")}, "[1.5,0]"},
		{"audit record", events.AuditRecorded{RunID: "R", EventID: "E", EventType: events.TypeActionCompleted, EventTime: time.Now(), Kind: "action",
			Attempt: 2, Input: map[string]any{"card": "[REDACTED]", "n": 1.0}, PayloadModes: map[string]string{"input": "redacted"},
			Policy: policy.Snapshot{}, PayloadHash: "h", PrevHash: ""}, ""},
		{"approval context", policy.ApprovalContext{ApprovalID: "a", RunID: "r", Action: "x", InputHash: "h", ExpiresAt: time.Unix(1700000000, 0).UTC()}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := canonical.Marshal(tc.v)
			require.NoError(t, err)
			assert.Equal(t, string(reference(t, tc.v)), string(got), "the library's canonical form")
			if tc.want != "" {
				assert.Equal(t, tc.want, string(got))
			}
		})
	}
}

func TestMarshalRefusesWhatJSONCannotHold(t *testing.T) {
	for _, v := range []any{math.NaN(), math.Inf(1), map[string]any{"f": func() {}}, make(chan int)} {
		_, err := canonical.Marshal(v)
		assert.Error(t, err, "%T", v)
	}
	type loop struct{ Next *loop }
	l := &loop{}
	l.Next = l
	_, err := canonical.Marshal(l)
	assert.Error(t, err, "a cycle is reported, not followed forever")
}

func TestHashIsSHA256OfTheCanonicalForm(t *testing.T) {
	// docs/approvals.md's worked example.
	h, err := canonical.Hash(map[string]any{"sku": "A-1", "qty": 3.0})
	require.NoError(t, err)
	want, err := policy.InputHash(map[string]any{"qty": 3.0, "sku": "A-1"})
	require.NoError(t, err)
	assert.Equal(t, want, h)
}

// FuzzMarshalMatchesTheReference: any JSON document, decoded, and any
// string as a key and a value, canonicalize as the reference does.
func FuzzMarshalMatchesTheReference(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":[true,null,"x"]}`, `[1e21,1e-7,-0,0.1]`, `"\u2028<>&"`, `{"\ud83d\ude00":1,"\ufb33":2}`, `12345678901234567890`} {
		f.Add([]byte(s), "k\x00\x7f\u2028", 1.5)
	}
	f.Fuzz(func(t *testing.T, doc []byte, s string, x float64) {
		var v any
		if json.Unmarshal(doc, &v) == nil {
			got, err := canonical.Marshal(v)
			require.NoError(t, err)
			assert.Equal(t, string(reference(t, v)), string(got))
		}
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return
		}
		w := map[string]any{s: []any{s, x}, "k": s}
		got, err := canonical.Marshal(w)
		b, jerr := json.Marshal(w)
		require.NoError(t, jerr)
		ref, rerr := jcs.Transform(b)
		if rerr != nil {
			// Keys that collide once json.Marshal coerced them to valid
			// UTF-8: the reference refuses them, and so does Marshal.
			assert.Error(t, err)
			return
		}
		require.NoError(t, err)
		assert.Equal(t, string(ref), string(got))
	})
}

func BenchmarkHashOfAnAuditRecord(b *testing.B) {
	rec := events.AuditRecorded{RunID: events.NewID(), EventID: events.NewID(), EventType: events.TypeActionCompleted,
		EventSubject: "ab.run.default.x.result", EventSource: "/actionbus/executor/default", EventTime: time.Now(), Kind: "action",
		ExecutionID: "call-1", Action: "echo", Mode: "read", Status: "succeeded", Attempt: 1,
		Output:       map[string]any{"run": "r0w1-17", "index": 3.0, "step": 0.0, "data": string(make([]byte, 150))},
		PayloadModes: map[string]string{"output": "full"}, PayloadHash: "ab12", PrevHash: "cd34"}
	b.Run("canonical", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := canonical.Hash(rec); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Marshal+jcs.Transform", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			reference(b, rec)
		}
	})
}
