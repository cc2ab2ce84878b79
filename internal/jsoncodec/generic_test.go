package jsoncodec_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/internal/jsoncodec"
)

var genericCases = []string{
	`{"a":1,"b":[true,false,null,"x"],"c":{"d":-1.5e10}}`,
	`  {"n":123456789012345678901234567890, "f": 1.0, "e": 1E+2, "z": -0}  `,
	`"\u00e9\ud83d\ude00\n\t\"\\\/"`,
	`{"dup":1,"dup":2}`,
	`[]`, `{}`, `null`, `0`, `"\ud800"`, `"\udc00x"`,
	`{"a":1} x`, `{"a":1}{"b":2}`, `{"a":}`, `[1,]`, `{"a" 1}`, `01`, `1.`, `-`, `"\x"`, `"a` + "\x00" + `"`,
	"\"\xff\"", `{"a":"b"` + "\xc3", ``, `   `, `nul`, `[` + "\n" + `1` + "\r\n]",
	`{"a":[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]}`,
	`{"run":"r","index":3,"step":0,"data":"xxxxxxxxxx"}`,
}

// TestGenericDecodesAsTheLibrary checks Generic against
// jsonschema.UnmarshalJSON on documents valid and not.
func TestGenericDecodesAsTheLibrary(t *testing.T) {
	for _, doc := range genericCases {
		t.Run(doc, func(t *testing.T) { sameAsLibrary(t, []byte(doc)) })
	}
}

// The generic form keeps every number as the library's json.Number (its
// literal text), so validation of large integers is exact.
func TestGenericKeepsNumbersAsTheirLiteral(t *testing.T) {
	v, err := jsoncodec.Generic([]byte(`{"n":9007199254740993,"f":1.50}`))
	require.NoError(t, err)
	require.Equal(t, map[string]any{"n": json.Number("9007199254740993"), "f": json.Number("1.50")}, v)
}

func FuzzGenericMatchesTheLibrary(f *testing.F) {
	for _, doc := range genericCases {
		f.Add([]byte(doc))
	}
	f.Fuzz(sameAsLibrary)
}

func sameAsLibrary(t *testing.T, doc []byte) {
	want, wantErr := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	got, err := jsoncodec.Generic(doc)
	if wantErr != nil {
		require.EqualError(t, err, wantErr.Error(), "%q", doc)
		return
	}
	require.NoError(t, err, "%q", doc)
	require.Equal(t, want, got, "%q", doc)
}
