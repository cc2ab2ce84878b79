package jsoncodec

import (
	"bytes"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"
)

// Valid documents are decoded by go-json, not handed to the library.
func TestValidDocumentsTakeTheFastPath(t *testing.T) {
	for _, doc := range []string{`{"a":[1,"x",null,true]}`, ` [1.5e3] `, `"é"`} {
		_, ok := genericFast([]byte(doc))
		require.True(t, ok, doc)
	}
}

var benchDoc = []byte(`{"specversion":"1.0","run":"r1","index":3,"step":0,"data":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx","callId":"c-01","output":{"a":[1,2,3],"b":{"c":"d"}}}`)

func BenchmarkGeneric(b *testing.B) {
	b.Run("go-json", func(b *testing.B) {
		for b.Loop() {
			_, _ = Generic(benchDoc)
		}
	})
	b.Run("library", func(b *testing.B) {
		for b.Loop() {
			_, _ = jsonschema.UnmarshalJSON(bytes.NewReader(benchDoc))
		}
	})
}
