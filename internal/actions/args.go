package actions

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/jsoncodec"
	"github.com/actionbus/actionbus/internal/schema"
)

// Origins of action input.
const (
	// OriginModel is input a planner wrote: undeclared and host-only keys
	// are stripped.
	OriginModel = "model"
	// OriginHost is input the host application wrote (workflows, exec).
	OriginHost = "host"
)

// AliasRewrite records one alias rewritten to its canonical key.
type AliasRewrite struct {
	// Path is the JSON Pointer of the object holding the keys ("" is the
	// root).
	Path string `json:"path"`
	From string `json:"from"`
	To   string `json:"to"`
	// Collision is true when the canonical key was present too: it won,
	// and the alias was dropped.
	Collision bool `json:"collision"`
}

// ArgsReport says what preparing the input changed.
type ArgsReport struct {
	// Rewrites are the alias rewrites, in key order.
	Rewrites []AliasRewrite `json:"rewrites,omitempty"`
	// Stripped are JSON Pointers of undeclared keys removed from
	// model-origin input.
	Stripped []string `json:"stripped,omitempty"`
	// HostOnlyStripped are host-only keys removed from model-origin input.
	HostOnlyStripped []string `json:"hostOnlyStripped,omitempty"`
	// Healed are keys lifted into the HealFlattenedInto property.
	Healed []string `json:"healed,omitempty"`
	// NullAbsent are optional top-level keys given as null and removed:
	// the contract counts null as absent (a required key given null is
	// missing instead). A key whose schema admits null keeps its null.
	NullAbsent []string `json:"nullAbsent,omitempty"`
}

// ArgIssue is one reason the input is invalid; the planner gets these back
// to correct itself.
type ArgIssue struct {
	ActionName string `json:"actionName"`
	// Key is the JSON Pointer of the offending key ("" is the root).
	Key       string `json:"key"`
	Reason    string `json:"reason"`
	Error     string `json:"error"`
	PlanIndex *int   `json:"planIndex,omitempty"`
}

// ArgsChecker prepares and validates the input of one action: alias
// rewrite, auto-heal of flattened arguments, stripping by origin, then the
// input schema. One implementation serves single actions, plans and
// workflow steps, in the dispatcher and again in the executor. It is safe
// for concurrent use.
type ArgsChecker struct {
	def    Definition
	root   map[string]any // the input schema as generic JSON
	schema *schema.Compiled
}

// NewArgsChecker builds the checker of a definition.
func NewArgsChecker(def Definition) (*ArgsChecker, error) {
	c := &ArgsChecker{def: def}
	if len(def.InputSchema) == 0 {
		return c, nil
	}
	if err := json.Unmarshal(def.InputSchema, &c.root); err != nil {
		return nil, fmt.Errorf("actions: %s: input schema: %w", def.Name, err)
	}
	var err error
	if c.schema, err = schema.CompileDocument("mem://"+def.Name+"/input", def.InputSchema); err != nil {
		return nil, err
	}
	return c, nil
}

// Prepare returns the input the handler will see, what was changed, and the
// issues that make it invalid (nil when valid). The input map is not
// modified.
func (c *ArgsChecker) Prepare(args map[string]any, origin string) (map[string]any, ArgsReport, []ArgIssue) {
	var rep ArgsReport
	in := cloneMap(args)
	if in == nil {
		in = map[string]any{}
	}
	if c.root != nil {
		c.heal(in, &rep)
		c.rewrite(c.root, in, "", &rep)
	}
	if origin != OriginHost {
		for _, k := range c.def.HostOnlyKeys {
			if _, ok := in[k]; ok {
				delete(in, k)
				rep.HostOnlyStripped = append(rep.HostOnlyStripped, "/"+k)
			}
		}
		if c.root != nil {
			c.strip(c.root, in, "", &rep)
		}
	}
	c.dropNullOptional(in, &rep)
	sort.Strings(rep.Stripped)
	sort.Strings(rep.HostOnlyStripped)
	if c.schema == nil {
		return in, rep, nil
	}
	// The seed's rule: a required value given as null, or a required
	// string of only whitespace, is missing — not a type error, and not
	// valid.
	out := c.blankRequired(in)
	blank := make(map[string]bool, len(out))
	for _, is := range out {
		blank[is.Key] = true
	}
	doc, err := jsoncodec.Marshal(in)
	if err != nil {
		return in, rep, []ArgIssue{{ActionName: c.def.Name, Reason: "encoding", Error: err.Error()}}
	}
	verr := c.schema.ValidateJSON(doc)
	if verr == nil {
		if len(out) > 0 {
			return in, rep, out
		}
		return in, rep, nil
	}
	var abErr *actionbus.Error
	if !errors.As(verr, &abErr) {
		return in, rep, append(out, ArgIssue{ActionName: c.def.Name, Reason: "invalid", Error: verr.Error()})
	}
	issues, _ := abErr.Details["issues"].([]schema.Issue)
	for _, is := range issues {
		if blank[is.Path] {
			continue // already reported as missing
		}
		reason := is.Keyword
		switch reason {
		case "required":
			reason = "missing"
		case "":
			reason = "invalid"
		}
		out = append(out, ArgIssue{ActionName: c.def.Name, Key: is.Path, Reason: reason, Error: is.Reason})
	}
	if len(out) == 0 {
		out = append(out, ArgIssue{ActionName: c.def.Name, Reason: "invalid", Error: abErr.Message})
	}
	return in, rep, out
}

// dropNullOptional removes the optional top-level keys given as null
// whose schema does not admit null: the seed counts null as absent, so an
// optional argument a planner writes as null is not a type error.
func (c *ArgsChecker) dropNullOptional(in map[string]any, rep *ArgsReport) {
	if c.root == nil {
		return
	}
	required := map[string]bool{}
	for _, k := range c.requiredKeys() {
		required[k] = true
	}
	props := c.properties(c.root)
	for k, v := range in {
		if v != nil || required[k] || admitsNull(c.resolve(asObject(props[k]))) {
			continue
		}
		delete(in, k)
		rep.NullAbsent = append(rep.NullAbsent, "/"+pointerEscape(k))
	}
	sort.Strings(rep.NullAbsent)
}

// admitsNull reports whether a property schema names null among its
// types (`"type": "null"` or `"type": [..., "null"]`).
func admitsNull(s map[string]any) bool {
	switch t := s["type"].(type) {
	case string:
		return t == "null"
	case []any:
		for _, x := range t {
			if x == "null" {
				return true
			}
		}
	}
	return false
}

func asObject(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// blankRequired reports the required top-level keys whose value is null or
// a string of only whitespace, as missing.
func (c *ArgsChecker) blankRequired(in map[string]any) []ArgIssue {
	var out []ArgIssue
	for _, k := range c.requiredKeys() {
		v, present := in[k]
		if !present {
			continue // the schema reports it
		}
		switch t := v.(type) {
		case nil:
			out = append(out, ArgIssue{ActionName: c.def.Name, Key: "/" + pointerEscape(k), Reason: "missing", Error: "required value is null"})
		case string:
			if strings.TrimSpace(t) == "" {
				out = append(out, ArgIssue{ActionName: c.def.Name, Key: "/" + pointerEscape(k), Reason: "missing", Error: "required string is blank"})
			}
		}
	}
	return out
}

// requiredKeys are the top-level keys the input schema requires (a local
// $ref at the root resolved).
func (c *ArgsChecker) requiredKeys() []string {
	list, _ := c.resolve(c.root)["required"].([]any)
	keys := make([]string, 0, len(list))
	for _, r := range list {
		if k, ok := r.(string); ok {
			keys = append(keys, k)
		}
	}
	return keys
}

func pointerEscape(k string) string {
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}

// ArgsError turns issues into the action_args_invalid error that travels
// back to the planner.
func ArgsError(action string, issues []ArgIssue) *actionbus.Error {
	msgs := make([]string, 0, len(issues))
	for _, is := range issues {
		key := is.Key
		if key == "" {
			key = "/"
		}
		msgs = append(msgs, key+": "+is.Error)
	}
	err := actionbus.Errorf(actionbus.CodeActionArgsInvalid, "arguments of %s are invalid: %s", action, strings.Join(msgs, "; "))
	err.Details = ArgsDetails(action, issues)
	return err
}

// ArgsDetails are the details of an action_args_invalid error and of its
// action-args-invalid step, the same on the single-action and plan paths
// (the seed's contract): the first issue flat, as {actionName, key,
// reason, error} plus planIndex in a plan, and every issue under
// "issues".
func ArgsDetails(action string, issues []ArgIssue) map[string]any {
	d := map[string]any{"actionName": action, "issues": issues}
	if len(issues) > 0 {
		first := issues[0]
		d["key"], d["reason"], d["error"] = first.Key, first.Reason, first.Error
		if first.PlanIndex != nil {
			d["planIndex"] = *first.PlanIndex
		}
	}
	return d
}

// properties returns the declared properties of an object schema, with a
// local $ref resolved; nil when the schema declares none.
func (c *ArgsChecker) properties(s map[string]any) map[string]any {
	s = c.resolve(s)
	props, _ := s["properties"].(map[string]any)
	return props
}

// resolve follows a local "$ref": "#/$defs/X" (what derived schemas use).
func (c *ArgsChecker) resolve(s map[string]any) map[string]any {
	for i := 0; i < 8 && s != nil; i++ {
		ref, ok := s["$ref"].(string)
		if !ok || !strings.HasPrefix(ref, "#/") {
			return s
		}
		var cur any = c.root
		for _, tok := range strings.Split(ref[2:], "/") {
			tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
			m, _ := cur.(map[string]any)
			cur = m[tok]
		}
		next, _ := cur.(map[string]any)
		if next == nil {
			return s
		}
		s = next
	}
	return s
}

// rewrite renames aliased keys ("x-aliases" on a property) to their
// canonical name, in obj and in nested objects. The canonical key wins a
// collision and the alias is dropped. Aliases are strictly opt-in per
// property.
func (c *ArgsChecker) rewrite(s map[string]any, obj map[string]any, path string, rep *ArgsReport) {
	props := c.properties(s)
	names := make([]string, 0, len(props))
	for k := range props {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, canonical := range names {
		ps, _ := props[canonical].(map[string]any)
		ps = c.resolve(ps)
		var aliases []any
		switch v := ps["x-aliases"].(type) {
		case []any:
			aliases = v
		case string: // jsonschema_extras:"x-aliases=a,b" on a Go field
			for _, a := range strings.Split(v, ",") {
				aliases = append(aliases, strings.TrimSpace(a))
			}
		}
		for _, a := range aliases {
			alias, _ := a.(string)
			v, ok := obj[alias]
			if alias == "" || alias == canonical || !ok {
				continue
			}
			_, collision := obj[canonical]
			if !collision {
				obj[canonical] = v
			}
			delete(obj, alias)
			rep.Rewrites = append(rep.Rewrites, AliasRewrite{Path: path, From: alias, To: canonical, Collision: collision})
		}
		if child, ok := obj[canonical].(map[string]any); ok && ps != nil {
			c.rewrite(ps, child, path+"/"+escape(canonical), rep)
		}
	}
}

// strip removes keys an object schema does not declare, recursively. An
// object schema without "properties" declares nothing and strips nothing
// (it is a free-form map).
func (c *ArgsChecker) strip(s map[string]any, obj map[string]any, path string, rep *ArgsReport) {
	props := c.properties(s)
	if props == nil {
		return
	}
	for k, v := range obj {
		ps, declared := props[k].(map[string]any)
		if !declared {
			delete(obj, k)
			rep.Stripped = append(rep.Stripped, path+"/"+escape(k))
			continue
		}
		if child, ok := v.(map[string]any); ok {
			c.strip(ps, child, path+"/"+escape(k), rep)
		}
	}
}

// heal lifts flattened arguments into HealFlattenedInto: smaller models
// put a wrapped tool's parameters beside the wrapper's own keys instead of
// inside it. Keys the schema declares at the top level, and "reasoning",
// stay; every other key moves into the wrapper. Nothing happens when the
// wrapper already holds a non-empty object.
func (c *ArgsChecker) heal(in map[string]any, rep *ArgsReport) {
	into := c.def.HealFlattenedInto
	if into == "" {
		return
	}
	if cur, ok := in[into].(map[string]any); ok && len(cur) > 0 {
		return
	}
	props := c.properties(c.root)
	lifted := map[string]any{}
	for k, v := range in {
		if _, declared := props[k]; declared || k == "reasoning" {
			continue
		}
		lifted[k] = v
		delete(in, k)
		rep.Healed = append(rep.Healed, k)
	}
	sort.Strings(rep.Healed)
	if len(lifted) > 0 {
		in[into] = lifted
	}
}

func escape(k string) string {
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}

// cloneMap deep-copies JSON-like maps and slices.
func cloneMap(m map[string]any) map[string]any {
	if m == nil {
		return nil
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = cloneValue(v)
	}
	return out
}

func cloneValue(v any) any {
	switch t := v.(type) {
	case map[string]any:
		return cloneMap(t)
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = cloneValue(e)
		}
		return out
	}
	return v
}
