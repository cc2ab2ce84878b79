// Package canonical writes the RFC 8785 canonical JSON (JCS) of Go values
// without going through their JSON text: the input hashes of approvals,
// the audit chain's record hashes and catalog definition hashes are all
// SHA-256 over it, computed for every call and every audited event.
//
// The result is, byte for byte, what [jcs.Transform] makes of the value's
// [json.Marshal] encoding (the tests hold the two equal, fuzzed); this
// package only skips the text in between, which the profile showed costing
// a fifth of the auditor's CPU. Anything it does not write itself — a type
// with its own MarshalJSON, a json.Number, a string that is not valid
// UTF-8, an embedded struct — it hands to exactly that pair, for that part
// of the value.
package canonical

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// Marshal returns the RFC 8785 canonical JSON of v.
func Marshal(v any) ([]byte, error) {
	return Append(nil, v)
}

// Append appends the RFC 8785 canonical JSON of v to dst.
func Append(dst []byte, v any) ([]byte, error) {
	return appendValue(dst, reflect.ValueOf(v), 0)
}

// maxDepth is where the reference takes over: it reports a cycle (a
// pointer that leads back to itself) where recursing would not end.
const maxDepth = 1000

// Hash is SHA-256, as lower-case hex, over the canonical JSON of v.
func Hash(v any) (string, error) {
	b, err := Marshal(v)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// slow is the reference: the value's JSON encoding, canonicalized.
func slow(dst []byte, v reflect.Value) ([]byte, error) {
	b, err := json.Marshal(v.Interface())
	if err != nil {
		return dst, err
	}
	c, err := jcs.Transform(b)
	if err != nil {
		return dst, err
	}
	return append(dst, c...), nil
}

var (
	marshalerType = reflect.TypeFor[json.Marshaler]()
	timeType      = reflect.TypeFor[time.Time]()
	numberType    = reflect.TypeFor[json.Number]()
	rawType       = reflect.TypeFor[json.RawMessage]()
)

func appendValue(dst []byte, v reflect.Value, depth int) ([]byte, error) {
	if !v.IsValid() {
		return append(dst, "null"...), nil
	}
	t := v.Type()
	switch {
	case depth > maxDepth:
		return slow(dst, v)
	case t == timeType:
		// RFC 3339 with nanoseconds: only digits, letters and punctuation
		// that need no escaping.
		b, err := v.Interface().(time.Time).MarshalJSON()
		if err != nil {
			return dst, err
		}
		return append(dst, b...), nil
	case t == numberType || t == rawType || v.Kind() == reflect.Float32:
		// A float32 is written in its own shortest form first.
		return slow(dst, v)
	case t.Implements(marshalerType) || (v.CanAddr() && reflect.PointerTo(t).Implements(marshalerType)):
		return slow(dst, v)
	}
	switch v.Kind() {
	case reflect.Interface, reflect.Pointer:
		if v.IsNil() {
			return append(dst, "null"...), nil
		}
		return appendValue(dst, v.Elem(), depth+1)
	case reflect.Bool:
		return strconv.AppendBool(dst, v.Bool()), nil
	case reflect.String:
		return appendString(dst, v, v.String())
	case reflect.Float64:
		return appendFloat(dst, v.Float())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n := v.Int()
		if n >= -(1<<53) && n <= 1<<53 {
			return strconv.AppendInt(dst, n, 10), nil
		}
		return appendFloat(dst, float64(n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		n := v.Uint()
		if n <= 1<<53 {
			return strconv.AppendUint(dst, n, 10), nil
		}
		return appendFloat(dst, float64(n))
	case reflect.Slice:
		if v.IsNil() {
			return append(dst, "null"...), nil
		}
		if t.Elem().Kind() == reflect.Uint8 {
			return slow(dst, v) // base64
		}
		fallthrough
	case reflect.Array:
		dst = append(dst, '[')
		for i := range v.Len() {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = appendValue(dst, v.Index(i), depth+1); err != nil {
				return dst, err
			}
		}
		return append(dst, ']'), nil
	case reflect.Map:
		if t.Key().Kind() != reflect.String || t.Key() != reflect.TypeFor[string]() {
			return slow(dst, v) // keys through TextMarshaler or numbers
		}
		if v.IsNil() {
			return append(dst, "null"...), nil
		}
		keys := make([]string, 0, v.Len())
		for _, k := range v.MapKeys() {
			if !utf8.ValidString(k.String()) {
				return slow(dst, v) // keys coerced by json.Marshal
			}
			keys = append(keys, k.String())
		}
		sortKeys(keys)
		dst = append(dst, '{')
		for i, k := range keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendQuoted(dst, k)
			dst = append(dst, ':')
			var err error
			if dst, err = appendValue(dst, v.MapIndex(reflect.ValueOf(k)), depth+1); err != nil {
				return dst, err
			}
		}
		return append(dst, '}'), nil
	case reflect.Struct:
		return appendStruct(dst, v, depth)
	}
	return slow(dst, v) // channels, funcs, complex: json.Marshal's error
}

func appendFloat(dst []byte, f float64) ([]byte, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return dst, fmt.Errorf("canonical: unsupported value %v", f)
	}
	s, err := jcs.NumberToJSON(f)
	if err != nil {
		return dst, err
	}
	return append(dst, s...), nil
}

func appendString(dst []byte, v reflect.Value, s string) ([]byte, error) {
	if !utf8.ValidString(s) {
		return slow(dst, v) // json.Marshal replaces each invalid byte
	}
	return appendQuoted(dst, s), nil
}

// appendQuoted writes a valid UTF-8 string as RFC 8785 does: only the
// quote, the backslash and control characters are escaped, with the
// short forms where JSON has them and \u00xx otherwise.
func appendQuoted(dst []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\r':
			dst = append(dst, '\\', 'r')
		case '\t':
			dst = append(dst, '\\', 't')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// sortKeys orders object keys by their UTF-16 code units (RFC 8785 §3.2.3):
// the order of their bytes, unless a key holds a character beyond the
// Basic Multilingual Plane, whose surrogates sort before U+E000–U+FFFF.
func sortKeys(keys []string) {
	astral := false
	for _, k := range keys {
		for _, r := range k {
			if r > 0xFFFF {
				astral = true
			}
		}
	}
	if !astral {
		slices.Sort(keys)
		return
	}
	slices.SortFunc(keys, func(a, b string) int {
		return slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(b)))
	})
}

// field is one JSON member of a struct type.
type field struct {
	name      string
	index     int
	omitEmpty bool
	omitZero  bool
}

// structInfo is a struct type's members in canonical order, or nil when
// the type is left to the reference (embedded fields, string options).
type structInfo struct{ fields []field }

var structs sync.Map // reflect.Type -> *structInfo

func infoOf(t reflect.Type) *structInfo {
	if si, ok := structs.Load(t); ok {
		return si.(*structInfo)
	}
	si := &structInfo{}
	for i := range t.NumField() {
		sf := t.Field(i)
		if sf.Anonymous {
			si = nil // embedding's promotion rules: the reference decides
			break
		}
		if !sf.IsExported() {
			continue
		}
		tag := sf.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			name = sf.Name
		}
		f := field{name: name, index: i}
		for _, o := range strings.Split(opts, ",") {
			switch o {
			case "omitempty":
				f.omitEmpty = true
			case "omitzero":
				f.omitZero = true
			case "string":
				si = nil
			}
		}
		if si == nil || !validTag(name) {
			si = nil
			break
		}
		si.fields = append(si.fields, f)
	}
	if si != nil {
		names := make([]string, len(si.fields))
		for i, f := range si.fields {
			names[i] = f.name
		}
		sortKeys(names)
		order := make(map[string]int, len(names))
		for i, n := range names {
			order[n] = i
		}
		if len(order) != len(names) {
			si = nil // duplicate names: the reference's rules
		} else {
			slices.SortFunc(si.fields, func(a, b field) int { return order[a.name] - order[b.name] })
		}
	}
	structs.Store(t, si)
	return si
}

func appendStruct(dst []byte, v reflect.Value, depth int) ([]byte, error) {
	si := infoOf(v.Type())
	if si == nil {
		return slow(dst, v)
	}
	dst = append(dst, '{')
	first := true
	for _, f := range si.fields {
		fv := v.Field(f.index)
		if (f.omitEmpty && isEmpty(fv)) || (f.omitZero && isZero(fv)) {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = appendQuoted(dst, f.name)
		dst = append(dst, ':')
		var err error
		if dst, err = appendValue(dst, fv, depth+1); err != nil {
			return dst, err
		}
	}
	return append(dst, '}'), nil
}

// isEmpty is encoding/json's omitempty test.
func isEmpty(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() == 0
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Interface, reflect.Pointer:
		return v.IsZero()
	}
	return false
}

type isZeroer interface{ IsZero() bool }

var isZeroerType = reflect.TypeFor[isZeroer]()

// isZero is encoding/json's omitzero test: the IsZero method of the
// field's declared type when it has one, else the zero value.
func isZero(v reflect.Value) bool {
	t := v.Type()
	switch {
	case t.Kind() == reflect.Interface && t.Implements(isZeroerType):
		return v.IsNil() || (v.Elem().Kind() == reflect.Pointer && v.Elem().IsNil()) || v.Interface().(isZeroer).IsZero()
	case t.Kind() == reflect.Pointer && t.Implements(isZeroerType):
		return v.IsNil() || v.Interface().(isZeroer).IsZero()
	case t.Implements(isZeroerType):
		return v.Interface().(isZeroer).IsZero()
	case reflect.PointerTo(t).Implements(isZeroerType):
		if !v.CanAddr() {
			v2 := reflect.New(t).Elem()
			v2.Set(v)
			v = v2
		}
		return v.Addr().Interface().(isZeroer).IsZero()
	}
	return v.IsZero()
}

// validTag is encoding/json's test of a tag's name (one it refuses names
// the member after the Go field; the reference handles that).
func validTag(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		switch {
		case strings.ContainsRune("!#$%&()*+-./:;<=>?@[]^_{|}~ ", c):
		case !unicode.IsLetter(c) && !unicode.IsDigit(c):
			return false
		}
	}
	return true
}
