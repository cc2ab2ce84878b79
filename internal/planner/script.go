package planner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"text/template"

	"go.yaml.in/yaml/v3"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
)

// Scenario is a scripted conversation: one decision per planner cycle.
type Scenario struct {
	// Description says what the scenario shows.
	Description string `json:"description,omitempty" yaml:"description,omitempty"`
	// Decisions are returned in order, one per cycle.
	Decisions []events.Decision `json:"decisions" yaml:"decisions"`

	// forEach holds the forEach templates of plan actions, by decision
	// and action index (only from a scenario file: see [ParseScenarios]).
	forEach map[[2]int]string
	// lines maps a string's place in a decision ("decisions[1].actions[0].args.jobId")
	// to its line in the scenario file (0 when unknown).
	lines map[string]int
}

// ScenarioFile is the document a script provider reads: scenarios by name.
type ScenarioFile struct {
	Scenarios map[string]Scenario `json:"scenarios" yaml:"scenarios"`
}

// Script is the script provider: decisions come from scenario files, chosen
// by the scenario named in the run request, one per cycle. String values in
// a decision are Go templates (text/template) rendered against the run so
// far; see [TemplateData]. Inside action arguments, a string that is
// exactly one template action and renders to a JSON number, boolean, array
// or object (e.g. with the toJson function) becomes that JSON value.
type Script struct {
	scenarios map[string]Scenario
}

// TemplateData is what scenario templates see.
//
// Besides text/template's built-ins and the toJson and join functions,
// templates have an index that fails with the index and the list's length
// when an index is past the end (a missing map key is nil, as with the
// built-in index).
type TemplateData struct {
	// Prompt is the run's prompt.
	Prompt string
	// Cycle is the cycle being decided (1-based).
	Cycle int
	// Observations are every result so far, in declaration order per cycle.
	Observations []events.Observation
	// Last are the observations of the previous cycle.
	Last []events.Observation
	// Results maps an action name to its latest output.
	Results map[string]any
	// Skill is the run's active skill (nil when none): its name,
	// instructions, tools and handoff targets.
	Skill *events.SkillContext
	// Item is the current element of a plan action's forEach list (nil
	// outside one).
	Item any
}

// NewScript returns a script provider over the given scenarios.
func NewScript(scenarios map[string]Scenario) (*Script, error) {
	for name, sc := range scenarios {
		if len(sc.Decisions) == 0 {
			return nil, fmt.Errorf("planner: scenario %q has no decisions", name)
		}
		for i, d := range sc.Decisions {
			if err := checkTemplates(d); err != nil {
				return nil, fmt.Errorf("planner: scenario %q decision %d: %w", name, i, err)
			}
		}
		for at, each := range sc.forEach {
			if _, err := template.New("forEach").Funcs(funcs).Option("missingkey=error").Parse(each); err != nil {
				return nil, fmt.Errorf("planner: scenario %q decision %d action %d forEach: %w", name, at[0], at[1], err)
			}
		}
	}
	return &Script{scenarios: scenarios}, nil
}

// ParseScenarios reads a scenario document in JSON or YAML. Unknown
// fields are errors, so a typo does not silently drop a decision field.
//
// A plan's action may carry forEach: a template that renders to a JSON
// list (e.g. '{{ toJson (index .Results "jobs.search" "ids") }}'); the
// action is then repeated once per element, with the element as .Item in
// its templates, and left out when the list is empty. A template that
// cannot be rendered for a run fails the run with scenario_failed, naming
// the field and its line in the document.
func ParseScenarios(data []byte) (map[string]Scenario, error) {
	// YAML is a superset of JSON, so one decoder reads both; the generic
	// value then goes through JSON so that the json tags of the decision
	// types apply and values have JSON types (float64, map[string]any).
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("planner: parse scenarios: %w", err)
	}
	var generic any
	if err := root.Decode(&generic); err != nil {
		return nil, fmt.Errorf("planner: parse scenarios: %w", err)
	}
	forEach := takeForEach(generic)
	b, err := json.Marshal(generic)
	if err != nil {
		return nil, fmt.Errorf("planner: scenarios are not JSON-compatible: %w", err)
	}
	var out ScenarioFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		return nil, fmt.Errorf("planner: parse scenarios: %w", err)
	}
	lines := map[string]int{}
	nodeLines(&root, "", lines)
	for name, sc := range out.Scenarios {
		sc.forEach = forEach[name]
		sc.lines = map[string]int{}
		prefix := "scenarios." + name + "."
		for p, l := range lines {
			if rest, ok := strings.CutPrefix(p, prefix); ok {
				sc.lines[rest] = l
			}
		}
		out.Scenarios[name] = sc
	}
	return out.Scenarios, nil
}

// takeForEach removes the forEach key of every plan action of a generic
// scenario document and returns them by scenario, decision and action.
func takeForEach(doc any) map[string]map[[2]int]string {
	out := map[string]map[[2]int]string{}
	top, _ := doc.(map[string]any)
	scenarios, _ := top["scenarios"].(map[string]any)
	for name, sc := range scenarios {
		m, _ := sc.(map[string]any)
		decisions, _ := m["decisions"].([]any)
		for i, d := range decisions {
			dm, _ := d.(map[string]any)
			actions, _ := dm["actions"].([]any)
			for j, a := range actions {
				am, _ := a.(map[string]any)
				each, ok := am["forEach"].(string)
				if !ok {
					continue
				}
				delete(am, "forEach")
				if out[name] == nil {
					out[name] = map[[2]int]string{}
				}
				out[name][[2]int{i, j}] = each
			}
		}
	}
	return out
}

// nodeLines records the line of every scalar of a YAML document by its
// path ("scenarios.s.decisions[1].actions[0].args.jobId").
func nodeLines(n *yaml.Node, path string, out map[string]int) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			nodeLines(c, path, out)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			p := n.Content[i].Value
			if path != "" {
				p = path + "." + p
			}
			nodeLines(n.Content[i+1], p, out)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			nodeLines(c, fmt.Sprintf("%s[%d]", path, i), out)
		}
	case yaml.ScalarNode:
		out[path] = n.Line
	}
}

// LoadScenarios reads every *.json, *.yaml and *.yml file of the given
// paths (files or directories) and merges their scenarios; a name defined
// twice is an error.
func LoadScenarios(paths ...string) (map[string]Scenario, error) {
	all := map[string]Scenario{}
	for _, p := range paths {
		files := []string{p}
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			files = nil
			for _, pat := range []string{"*.json", "*.yaml", "*.yml"} {
				m, _ := filepath.Glob(filepath.Join(p, pat))
				files = append(files, m...)
			}
			sort.Strings(files)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				return nil, err
			}
			sc, err := ParseScenarios(b)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			for name, s := range sc {
				if _, dup := all[name]; dup {
					return nil, fmt.Errorf("planner: scenario %q is defined twice (%s)", name, f)
				}
				all[name] = s
			}
		}
	}
	return all, nil
}

// Name implements Provider.
func (s *Script) Name() string { return "script" }

// Scenarios returns the scenario names, sorted.
func (s *Script) Scenarios() []string {
	out := make([]string, 0, len(s.scenarios))
	for n := range s.scenarios {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Decide implements Provider.
func (s *Script) Decide(_ context.Context, in Input) (events.Decision, error) {
	req := in.Request
	sc, ok := s.scenarios[req.Scenario]
	if !ok {
		return events.Decision{}, actionbus.Errorf(actionbus.CodeScenarioNotFound, "scenario %q is not loaded (have %s)", req.Scenario, strings.Join(s.Scenarios(), ", "))
	}
	if req.Cycle < 1 || req.Cycle > len(sc.Decisions) {
		return events.Decision{}, actionbus.Errorf(actionbus.CodeInvalidDecision, "scenario %q has %d decisions; none for cycle %d", req.Scenario, len(sc.Decisions), req.Cycle)
	}
	data := TemplateData{Prompt: req.Prompt, Cycle: req.Cycle, Observations: req.Observations, Results: map[string]any{}, Skill: req.Skill}
	for _, o := range req.Observations {
		if o.Cycle == req.Cycle-1 {
			data.Last = append(data.Last, o)
		}
		if o.OK {
			data.Results[o.Action] = o.Output
		}
	}
	return decideCycle(req.Scenario, sc, req.Cycle, data)
}

// decideCycle renders a scenario's decision of a cycle, repeating each plan
// action with a forEach once per element of its list.
func decideCycle(name string, sc Scenario, cycle int, data TemplateData) (events.Decision, error) {
	i := cycle - 1
	d := sc.Decisions[i]
	actions := d.Actions
	d.Actions = nil
	prefix := fmt.Sprintf("decisions[%d]", i)
	dec, err := render(d, data, prefix)
	if err != nil {
		return events.Decision{}, scenarioFailed(name, sc, cycle, err)
	}
	for j, a := range actions {
		at := fmt.Sprintf("%s.actions[%d]", prefix, j)
		each, ok := sc.forEach[[2]int{i, j}]
		if !ok {
			ra, err := render(a, data, at)
			if err != nil {
				return events.Decision{}, scenarioFailed(name, sc, cycle, err)
			}
			dec.Actions = append(dec.Actions, ra)
			continue
		}
		items, err := forEachItems(each, data, at+".forEach")
		if err != nil {
			return events.Decision{}, scenarioFailed(name, sc, cycle, err)
		}
		for _, item := range items {
			di := data
			di.Item = item
			ra, err := render(a, di, at)
			if err != nil {
				return events.Decision{}, scenarioFailed(name, sc, cycle, err)
			}
			dec.Actions = append(dec.Actions, ra)
		}
	}
	return dec, nil
}

// templateError is a template of a scenario that could not be rendered.
type templateError struct {
	field, text string
	err         error
}

func (e *templateError) Error() string { return e.err.Error() }

// scenarioFailed is the scenario_failed error of a template error: it
// names the scenario, the cycle, the field, its line in the scenario file
// and the template.
func scenarioFailed(name string, sc Scenario, cycle int, err error) *actionbus.Error {
	var te *templateError
	if !errors.As(err, &te) {
		return actionbus.Errorf(actionbus.CodeScenarioFailed, "scenario %q cycle %d: %w", name, cycle, err)
	}
	line := sc.lines[te.field]
	where := te.field
	if line > 0 {
		where = fmt.Sprintf("%s (line %d)", te.field, line)
	}
	cause := te.err
	var exec template.ExecError
	if errors.As(cause, &exec) {
		cause = errors.Unwrap(exec.Err)
		if cause == nil {
			cause = exec.Err
		}
	}
	return actionbus.Errorf(actionbus.CodeScenarioFailed, "scenario %q cycle %d, %s: template %s: %w", name, cycle, where, strings.TrimSpace(te.text), cause).
		WithDetail("scenario", name).WithDetail("cycle", cycle).WithDetail("field", te.field).
		WithDetail("line", line).WithDetail("template", te.text)
}

// forEachItems renders a forEach template to its list.
func forEachItems(each string, data TemplateData, field string) ([]any, error) {
	out, err := execute(each, data, field)
	if err != nil {
		return nil, err
	}
	var items []any
	if err := json.Unmarshal([]byte(out), &items); err != nil {
		return nil, &templateError{field: field, text: each, err: fmt.Errorf("renders %q, not a JSON list", out)}
	}
	return items, nil
}

// execute renders one template string.
func execute(s string, data TemplateData, field string) (string, error) {
	t, err := template.New(field).Funcs(funcs).Option("missingkey=error").Parse(s)
	if err == nil {
		var b strings.Builder
		if err = t.Execute(&b, data); err == nil {
			return b.String(), nil
		}
	}
	return "", &templateError{field: field, text: s, err: err}
}

var funcs = template.FuncMap{
	"toJson": func(v any) (string, error) {
		b, err := json.Marshal(v)
		return string(b), err
	},
	"join": func(sep string, v []any) string {
		parts := make([]string, len(v))
		for i, x := range v {
			parts[i] = fmt.Sprint(x)
		}
		return strings.Join(parts, sep)
	},
	"index": index,
}

// index replaces text/template's built-in index, which checks a slice
// index against the slice's capacity and so fails past its length with
// reflect's own panic text: an index past the end is an error naming the
// index and the length. A missing map key is nil, as with the built-in.
func index(item any, keys ...any) (any, error) {
	for _, k := range keys {
		v := reflect.ValueOf(item)
		switch {
		case !v.IsValid():
			return nil, fmt.Errorf("index %v of nothing (no such result or key)", k)
		case v.Kind() == reflect.Slice || v.Kind() == reflect.Array:
			n, ok := toInt(k)
			if !ok {
				return nil, fmt.Errorf("index %v of a list is not an integer", k)
			}
			if n < 0 || n >= v.Len() {
				return nil, fmt.Errorf("index %d out of range: the list has %d item(s)", n, v.Len())
			}
			item = v.Index(n).Interface()
		case v.Kind() == reflect.Map:
			kv := reflect.ValueOf(k)
			if !kv.IsValid() || !kv.Type().AssignableTo(v.Type().Key()) {
				return nil, fmt.Errorf("key %v does not fit a map of %s keys", k, v.Type().Key())
			}
			e := v.MapIndex(kv)
			if !e.IsValid() {
				item = nil
				continue
			}
			item = e.Interface()
		default:
			return nil, fmt.Errorf("cannot index %T with %v", item, k)
		}
	}
	return item, nil
}

func toInt(k any) (int, bool) {
	switch n := k.(type) {
	case int:
		return n, true
	case int64:
		return int(n), true
	case float64:
		return int(n), n == float64(int(n))
	}
	return 0, false
}

func checkTemplates(d events.Decision) error {
	_, err := walkStrings(d, func(s string, _ bool, _ string) (any, error) {
		if !strings.Contains(s, "{{") {
			return s, nil
		}
		_, err := template.New("t").Funcs(funcs).Option("missingkey=error").Parse(s)
		return s, err
	})
	return err
}

// render renders every template string of a decision; prefix is the
// decision's place in its scenario, which errors name.
func render(d events.Decision, data TemplateData, prefix string) (events.Decision, error) {
	v, err := walkStrings(d, func(s string, inArgs bool, path string) (any, error) {
		if !strings.Contains(s, "{{") {
			return s, nil
		}
		out, err := execute(s, data, prefix+path)
		if err != nil {
			return nil, err
		}
		trimmed := strings.TrimSpace(s)
		if inArgs && strings.HasPrefix(trimmed, "{{") && strings.HasSuffix(trimmed, "}}") && strings.Count(trimmed, "{{") == 1 {
			var j any
			if json.Unmarshal([]byte(out), &j) == nil {
				if _, isStr := j.(string); !isStr {
					return j, nil
				}
			}
		}
		return out, nil
	})
	if err != nil {
		return events.Decision{}, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return events.Decision{}, err
	}
	var out events.Decision
	err = json.Unmarshal(b, &out)
	return out, err
}

// walkStrings maps fn over every string of a decision, returned as generic
// JSON; fn learns whether the string is inside action arguments and its
// path in the decision (".args.jobId", ".actions[1].args.jobId").
func walkStrings(d events.Decision, fn func(s string, inArgs bool, path string) (any, error)) (any, error) {
	b, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	var walk func(any, bool, string) (any, error)
	walk = func(x any, inArgs bool, path string) (any, error) {
		switch t := x.(type) {
		case string:
			return fn(t, inArgs, path)
		case map[string]any:
			for k, e := range t {
				if !inArgs && (k == "type" || k == "name") {
					continue
				}
				nv, err := walk(e, inArgs || k == "args", path+"."+k)
				if err != nil {
					return nil, err
				}
				t[k] = nv
			}
		case []any:
			for i, e := range t {
				nv, err := walk(e, inArgs, fmt.Sprintf("%s[%d]", path, i))
				if err != nil {
					return nil, err
				}
				t[i] = nv
			}
		}
		return x, nil
	}
	return walk(v, false, "")
}

// Synthesize implements Provider with a deterministic stand-in for an LLM:
// a section is its result's summary (or its output as JSON); an intro or
// outro is its instruction followed by one line per result.
func (s *Script) Synthesize(_ context.Context, req *events.SynthesisRequested) (string, error) {
	if req.Part == events.PartSection {
		if len(req.Results) == 0 {
			return "", nil
		}
		return resultText(req.Results[0]), nil
	}
	lines := []string{strings.TrimSpace(req.Instruction)}
	for _, r := range req.Results {
		lines = append(lines, "- "+r.Action+": "+resultText(r))
	}
	return strings.Join(lines, "\n"), nil
}

func resultText(o events.Observation) string {
	if !o.OK {
		if o.Error != nil {
			return "failed: " + o.Error.Message
		}
		return "failed"
	}
	if o.Summary != "" {
		return o.Summary
	}
	b, _ := json.Marshal(o.Output)
	return string(b)
}
