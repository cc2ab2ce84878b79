package client_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/client"
)

func decodeJSON(t *testing.T, s string) any {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal([]byte(s), &v))
	return v
}

func TestFirstDifference(t *testing.T) {
	long := strings.Repeat("x", 400)
	for _, tc := range []struct {
		name, a, b               string
		path, recorded, replayed string
	}{
		{"equal", `{"a":[1,{"b":"c"}]}`, `{"a":[1,{"b":"c"}]}`, "", "", ""},
		{"a scalar", `1`, `2`, "", "1", "2"},
		{"a nested value", `{"a":[1,{"b":"c"}],"z":1}`, `{"a":[1,{"b":"d"}],"z":1}`, "/a/1/b", `"c"`, `"d"`},
		{"a key on one side", `{"a":1}`, `{"a":1,"b":2}`, "/b", "(absent)", "2"},
		{"a longer list", `[1,2]`, `[1,2,3]`, "/2", "(absent)", "3"},
		{"a key needing escapes", `{"a/b~":1}`, `{"a/b~":2}`, "/a~1b~0", "1", "2"},
		{"another type", `{"a":[1]}`, `{"a":{"0":1}}`, "/a", "[1]", `{"0":1}`},
		{"past character 300 of a long string", `"` + long + `A tail"`, `"` + long + `B tail"`, "",
			`…` + strings.Repeat("x", 120) + `A tail"`, `…` + strings.Repeat("x", 120) + `B tail"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, ok := client.FirstDifference(decodeJSON(t, tc.a), decodeJSON(t, tc.b))
			if tc.a == tc.b {
				assert.False(t, ok)
				return
			}
			require.True(t, ok)
			assert.Equal(t, tc.path, d.Path)
			assert.Equal(t, tc.recorded, d.Recorded)
			assert.Equal(t, tc.replayed, d.Replayed)
		})
	}
}

// TestADivergencePastCharacter300IsShown: two lists of observations
// equal for their first 300 characters of JSON and then different are
// reported at the first differing value, and the two printed values differ.
func TestADivergencePastCharacter300IsShown(t *testing.T) {
	var a, b []any
	for i := range 12 {
		a = append(a, map[string]any{"action": "t.read", "cycle": float64(i + 1), "output": "the same forty characters, every cycle"})
		b = append(b, map[string]any{"action": "t.read", "cycle": float64(i + 1), "output": "the same forty characters, every cycle"})
	}
	b[10] = map[string]any{"action": "t.read", "cycle": 11.0, "output": "another output, in cycle eleven only"}
	ja, _ := json.Marshal(a)
	require.Greater(t, strings.Index(string(ja), "cycle\":11"), 300, "the difference lies past character 300")
	d, ok := client.FirstDifference(a, b)
	require.True(t, ok)
	assert.Equal(t, "/10/output", d.Path)
	assert.Equal(t, `"the same forty characters, every cycle"`, d.Recorded)
	assert.Equal(t, `"another output, in cycle eleven only"`, d.Replayed)
	assert.NotEqual(t, d.Recorded, d.Replayed)
}

// FuzzFirstDifference: two JSON values differ exactly when a difference
// is reported, and the two values it shows then differ.
func FuzzFirstDifference(f *testing.F) {
	f.Add(`{"a":[1,{"b":"c"}]}`, `{"a":[1,{"b":"d"}]}`)
	f.Add(`"`+strings.Repeat("é", 300)+`a"`, `"`+strings.Repeat("é", 300)+`b"`)
	f.Add(`[1,2]`, `[1,2,null]`)
	f.Fuzz(func(t *testing.T, a, b string) {
		var x, y any
		if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
			return
		}
		ja, _ := json.Marshal(x)
		jb, _ := json.Marshal(y)
		d, ok := client.FirstDifference(x, y)
		if ok != (string(ja) != string(jb)) {
			t.Fatalf("reported %v for %s and %s", ok, ja, jb)
		}
		if ok && d.Recorded == d.Replayed {
			t.Fatalf("shows the same value %s for %s and %s", d.Recorded, ja, jb)
		}
	})
}
