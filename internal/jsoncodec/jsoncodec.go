// Package jsoncodec encodes and decodes the JSON of the hot path — event
// data and run state, which every service encodes and decodes for every
// event it handles — and the generic form schema validation walks, with
// go-json: what encoding/json writes and reads (tests in the packages that
// use it hold the two equal for event data and run state; a fuzz target
// here for the generic form), 1.8 to 5 times faster.
package jsoncodec

import (
	"bytes"
	"fmt"
	"unicode/utf8"

	gojson "github.com/goccy/go-json"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Marshal returns the JSON encoding of v, as encoding/json.Marshal does.
func Marshal(v any) ([]byte, error) { return gojson.Marshal(v) }

// Unmarshal decodes one JSON value into v, as encoding/json.Unmarshal
// does (trailing content is an error). A decoder panic on some input is
// returned as an error, never a crash.
func Unmarshal(data []byte, v any) error { return unmarshal(data, v) }

// unmarshal is go-json's Unmarshal with opts, a decoder panic returned as
// an error.
func unmarshal(data []byte, v any, opts ...gojson.DecodeOptionFunc) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("jsoncodec: undecodable input: %v", r)
		}
	}()
	return gojson.UnmarshalWithOption(data, v, opts...)
}

// Generic decodes one JSON document into the generic form a JSON Schema
// validator takes — map[string]any, []any, string, bool, nil and
// json.Number for every number — exactly as
// jsonschema.UnmarshalJSON (encoding/json with UseNumber, nothing but
// white space after the value) does, a few times faster. go-json decides
// only documents it accepts that are valid UTF-8; everything else, and
// every error, is left to encoding/json, so an error is always the
// library's. FuzzGenericMatchesTheLibrary holds the two equal.
func Generic(doc []byte) (any, error) {
	if v, ok := genericFast(doc); ok {
		return v, nil
	}
	return jsonschema.UnmarshalJSON(bytes.NewReader(doc))
}

// useNumber is go-json's UseNumberOption (internal/decoder), which its
// Decoder sets but Unmarshal has no option for; Unmarshal is the fast
// path, three times the stream decoder. Should the bit mean anything else
// in another go-json, numbers would come back as float64 and
// TestGenericKeepsNumbersAsTheirLiteral fails.
func useNumber(o *gojson.DecodeOption) { o.Flags |= 1 << 3 }

// genericFast is go-json's decoding of doc, ok only when it succeeds.
func genericFast(doc []byte) (v any, ok bool) {
	if !utf8.Valid(doc) {
		return nil, false // encoding/json replaces invalid bytes: left to it
	}
	if err := unmarshal(doc, &v, useNumber); err != nil {
		return nil, false
	}
	return v, true
}
