// Package jsoncodec encodes and decodes the JSON of the hot path — event
// data and run state, which every service encodes and decodes for every
// event it handles — with go-json: what encoding/json writes and reads
// (tests in the packages that use it hold the two equal for event data
// and run state), three to five times faster.
package jsoncodec

import (
	"fmt"

	gojson "github.com/goccy/go-json"
)

// Marshal returns the JSON encoding of v, as encoding/json.Marshal does.
func Marshal(v any) ([]byte, error) { return gojson.Marshal(v) }

// Unmarshal decodes one JSON value into v, as encoding/json.Unmarshal
// does (trailing content is an error). A decoder panic on some input is
// returned as an error, never a crash.
func Unmarshal(data []byte, v any) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("jsoncodec: undecodable input: %v", r)
		}
	}()
	return gojson.Unmarshal(data, v)
}
