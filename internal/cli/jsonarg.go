package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// decodeObject decodes JSON a user gave (a flag's value, a file) that
// must be an object. source names where it came from in the error
// ("--input", a file name); a syntax or type error names its line and
// column (from 1), and a value of another kind says which kind it is.
func decodeObject(source string, data []byte) (map[string]any, error) {
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		var syntax *json.SyntaxError
		var typ *json.UnmarshalTypeError
		switch {
		case errors.As(err, &syntax):
			line, col := position(data, syntax.Offset)
			return nil, fmt.Errorf("%s: invalid JSON at line %d, column %d: %w", source, line, col, err)
		case errors.As(err, &typ):
			line, col := position(data, typ.Offset)
			return nil, fmt.Errorf("%s: invalid JSON at line %d, column %d: %w", source, line, col, err)
		}
		return nil, fmt.Errorf("%s: invalid JSON: %w", source, err)
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: must be a JSON object, not %s", source, kindOf(v))
	}
	return obj, nil
}

// position is the line and column (from 1) of the byte a JSON decoder
// stopped at after reading offset bytes (the offending byte is the last
// one read; at the end of the input, the last byte).
func position(data []byte, offset int64) (line, col int) {
	i := int(min(max(offset-1, 0), int64(len(data))))
	before := data[:i]
	line = 1 + bytes.Count(before, []byte("\n"))
	col = i - bytes.LastIndexByte(before, '\n')
	return line, col
}

// kindOf names the JSON kind of a decoded value.
func kindOf(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case []any:
		return "an array"
	case string:
		return "a string"
	case float64:
		return "a number"
	case bool:
		return "a boolean"
	}
	return "an object"
}
