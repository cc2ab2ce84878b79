// Package schema validates JSON documents against JSON Schemas (draft
// 2020-12, via github.com/santhosh-tekuri/jsonschema/v6) and reports every
// violation as a JSON-Pointer path with a readable reason.
//
// It is shared by the event layer (data schemas of event types) and the
// action layer (input and output schemas of actions). It knows nothing about
// events or actions.
package schema

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/jsoncodec"
)

// Issue is one schema violation.
type Issue struct {
	// Path is the JSON Pointer of the offending value ("" is the root).
	// For a missing required property it is the pointer of the property
	// that should be there.
	Path string `json:"path"`
	// Keyword is the schema keyword that failed ("required", "type",
	// "minLength", "additionalProperties", ...).
	Keyword string `json:"keyword"`
	// Reason says what is wrong, e.g. "missing property 'runId'".
	Reason string `json:"reason"`
}

// Compiled is a compiled schema. It is safe for concurrent use.
type Compiled struct {
	s *jsonschema.Schema
}

// Set is a set of schema documents that may reference each other.
type Set struct {
	c      *jsonschema.Compiler
	loaded map[string]bool
}

// NewSet returns an empty set. Schemas may not load anything from the
// network or the file system: only documents added with Add are known.
func NewSet() *Set {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(denyLoader{})
	c.UseRegexpEngine(compileRegexp)
	return &Set{c: c, loaded: map[string]bool{}}
}

type denyLoader struct{}

func (denyLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("schema: %s is not a known schema (remote loading is disabled)", url)
}

// Add adds a schema document under url.
func (s *Set) Add(url string, doc []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return fmt.Errorf("schema: parse %s: %w", url, err)
	}
	if err := s.c.AddResource(url, v); err != nil {
		return fmt.Errorf("schema: add %s: %w", url, err)
	}
	s.loaded[url] = true
	return nil
}

// AddFS adds every *.json file of fsys under baseURL+name.
func (s *Set) AddFS(fsys fs.FS, baseURL string) error {
	names, err := fs.Glob(fsys, "*.json")
	if err != nil {
		return err
	}
	for _, n := range names {
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return err
		}
		if err := s.Add(baseURL+n, b); err != nil {
			return err
		}
	}
	return nil
}

// Compile compiles the schema at url (added before).
func (s *Set) Compile(url string) (*Compiled, error) {
	sc, err := s.c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("schema: compile %s: %w", url, err)
	}
	return &Compiled{s: sc}, nil
}

// CompileDocument compiles one standalone schema document.
func CompileDocument(url string, doc []byte) (*Compiled, error) {
	s := NewSet()
	if err := s.Add(url, doc); err != nil {
		return nil, err
	}
	return s.Compile(url)
}

// ValidateJSON validates a JSON document. It returns nil, or an
// *actionbus.Error with code schema_validation whose details hold "issues"
// ([]Issue, sorted by path).
func (c *Compiled) ValidateJSON(doc []byte) error {
	v, err := jsoncodec.Generic(doc)
	if err != nil {
		return actionbus.Errorf(actionbus.CodeSchemaValidation, "not a JSON document: %w", err)
	}
	return c.Validate(v)
}

// Validate validates a value produced by jsonschema.UnmarshalJSON (or any
// value made of map[string]any, []any, string, bool, nil, json.Number and
// float64). Errors are as for ValidateJSON.
func (c *Compiled) Validate(v any) error {
	err := c.s.Validate(v)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return actionbus.Errorf(actionbus.CodeSchemaValidation, "%w", err)
	}
	issues := Issues(ve)
	msgs := make([]string, 0, len(issues))
	for _, is := range issues {
		p := is.Path
		if p == "" {
			p = "/"
		}
		msgs = append(msgs, p+": "+is.Reason)
	}
	return (&actionbus.Error{
		Code:    actionbus.CodeSchemaValidation,
		Message: strings.Join(msgs, "; "),
	}).WithDetail("issues", issues)
}

// Issues flattens a validation error into its leaf violations.
func Issues(ve *jsonschema.ValidationError) []Issue { return leaves(ve, false) }

// Violations validates v (as [Compiled.Validate]) and returns its leaf
// violations, nil when it is valid, with one issue per property that
// additionalProperties refuses (its path the property's, keyword
// "additionalProperties"): for callers that answer each field by its
// path. A failure that is no violation is one issue at the root.
func (c *Compiled) Violations(v any) []Issue {
	err := c.s.Validate(v)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return []Issue{{Keyword: "", Reason: err.Error()}}
	}
	return leaves(ve, true)
}

// leaves flattens a validation error; with splitExtra each property
// additionalProperties refuses is an issue of its own.
func leaves(ve *jsonschema.ValidationError, splitExtra bool) []Issue {
	var out []Issue
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			kw := ""
			if kp := e.ErrorKind.KeywordPath(); len(kp) > 0 {
				kw = kp[len(kp)-1]
			}
			reason := Reason(e.ErrorKind)
			if extra, ok := e.ErrorKind.(*kind.AdditionalProperties); ok && splitExtra {
				for _, p := range extra.Properties {
					out = append(out, Issue{Path: Pointer(append(append([]string{}, e.InstanceLocation...), p)), Keyword: kw, Reason: "not allowed"})
				}
				return
			}
			if req, ok := e.ErrorKind.(*kind.Required); ok {
				for _, m := range req.Missing {
					out = append(out, Issue{Path: Pointer(append(append([]string{}, e.InstanceLocation...), m)), Keyword: kw, Reason: "missing required property"})
				}
				return
			}
			out = append(out, Issue{Path: Pointer(e.InstanceLocation), Keyword: kw, Reason: reason})
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// Tokens splits a JSON Pointer (RFC 6901) into its unescaped tokens, the
// inverse of [Pointer]; "" (the whole document) has none.
func Tokens(ptr string) []string {
	if ptr == "" {
		return nil
	}
	tok := strings.Split(ptr[1:], "/")
	for i, t := range tok {
		tok[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return tok
}

// Pointer renders path tokens as a JSON Pointer (RFC 6901).
func Pointer(tokens []string) string {
	if len(tokens) == 0 {
		return ""
	}
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		t = strings.ReplaceAll(t, "~", "~0")
		b.WriteString(strings.ReplaceAll(t, "/", "~1"))
	}
	return b.String()
}

// Reason words a violation by its rule, never by the rejected value: the
// value may be a secret (a password that fails a pattern) and reasons
// travel in events, audit records and logs. Only the rule's own side —
// the pattern, the bound, the expected type, property names — is shown.
func Reason(k jsonschema.ErrorKind) string {
	switch k := k.(type) {
	case *kind.Type:
		return "must be of type " + strings.Join(k.Want, " or ") + ", got " + k.Got
	case *kind.Enum:
		return "must be one of the allowed values"
	case *kind.Const:
		return "must equal the constant value"
	case *kind.Format:
		return "must be a valid " + k.Want
	case *kind.Pattern:
		return "must match pattern " + k.Want
	case *kind.MinLength, *kind.MaxLength, *kind.Minimum, *kind.Maximum, *kind.ExclusiveMinimum,
		*kind.ExclusiveMaximum, *kind.MultipleOf, *kind.MinItems, *kind.MaxItems, *kind.MinProperties, *kind.MaxProperties:
		// Their messages state the bound and the size or number
		// got; a number's value is the input itself, so the bound only.
		kw := k.KeywordPath()
		return "violates " + strings.Join(kw, "/") + " " + bound(k)
	case *kind.AdditionalProperties:
		return "additional properties not allowed: " + strings.Join(k.Properties, ", ")
	case *kind.Required:
		return "missing properties: " + strings.Join(k.Missing, ", ")
	case *kind.PropertyNames:
		return "has a property name that violates propertyNames"
	case *kind.UniqueItems:
		return fmt.Sprintf("items at %d and %d are equal", k.Duplicates[0], k.Duplicates[1])
	case *kind.FalseSchema:
		return "not allowed"
	}
	kw := k.KeywordPath()
	if len(kw) == 0 {
		return "invalid"
	}
	return "violates " + strings.Join(kw, "/")
}

// bound returns the limit of a size or number rule.
func bound(k jsonschema.ErrorKind) string {
	switch k := k.(type) {
	case *kind.MinLength:
		return fmt.Sprint(k.Want)
	case *kind.MaxLength:
		return fmt.Sprint(k.Want)
	case *kind.Minimum:
		return k.Want.FloatString(6)
	case *kind.Maximum:
		return k.Want.FloatString(6)
	case *kind.ExclusiveMinimum:
		return k.Want.FloatString(6)
	case *kind.ExclusiveMaximum:
		return k.Want.FloatString(6)
	case *kind.MultipleOf:
		return k.Want.FloatString(6)
	case *kind.MinItems:
		return fmt.Sprint(k.Want)
	case *kind.MaxItems:
		return fmt.Sprint(k.Want)
	case *kind.MinProperties:
		return fmt.Sprint(k.Want)
	case *kind.MaxProperties:
		return fmt.Sprint(k.Want)
	}
	return ""
}
