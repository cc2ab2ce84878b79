package planner

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
	}
	return &Script{scenarios: scenarios}, nil
}

// ParseScenarios reads a scenario document in JSON or YAML. Unknown
// fields are errors, so a typo does not silently drop a decision field.
func ParseScenarios(data []byte) (map[string]Scenario, error) {
	// YAML is a superset of JSON, so one decoder reads both; the generic
	// value then goes through JSON so that the json tags of the decision
	// types apply and values have JSON types (float64, map[string]any).
	var generic any
	if err := yaml.Unmarshal(data, &generic); err != nil {
		return nil, fmt.Errorf("planner: parse scenarios: %w", err)
	}
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
	return out.Scenarios, nil
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
	dec, err := render(sc.Decisions[req.Cycle-1], data)
	if err != nil {
		return events.Decision{}, actionbus.Errorf(actionbus.CodeInvalidDecision, "scenario %q cycle %d: %w", req.Scenario, req.Cycle, err)
	}
	return dec, nil
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
}

func checkTemplates(d events.Decision) error {
	_, err := walkStrings(d, func(s string, _ bool) (any, error) {
		if !strings.Contains(s, "{{") {
			return s, nil
		}
		_, err := template.New("t").Funcs(funcs).Option("missingkey=error").Parse(s)
		return s, err
	})
	return err
}

func render(d events.Decision, data TemplateData) (events.Decision, error) {
	v, err := walkStrings(d, func(s string, inArgs bool) (any, error) {
		if !strings.Contains(s, "{{") {
			return s, nil
		}
		t, err := template.New("t").Funcs(funcs).Option("missingkey=error").Parse(s)
		if err != nil {
			return nil, err
		}
		var b strings.Builder
		if err := t.Execute(&b, data); err != nil {
			return nil, err
		}
		out := b.String()
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
// JSON; fn learns whether the string is inside action arguments.
func walkStrings(d events.Decision, fn func(s string, inArgs bool) (any, error)) (any, error) {
	b, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	var walk func(any, bool) (any, error)
	walk = func(x any, inArgs bool) (any, error) {
		switch t := x.(type) {
		case string:
			return fn(t, inArgs)
		case map[string]any:
			for k, e := range t {
				if !inArgs && (k == "type" || k == "name") {
					continue
				}
				nv, err := walk(e, inArgs || k == "args")
				if err != nil {
					return nil, err
				}
				t[k] = nv
			}
		case []any:
			for i, e := range t {
				nv, err := walk(e, inArgs)
				if err != nil {
					return nil, err
				}
				t[i] = nv
			}
		}
		return x, nil
	}
	return walk(v, false)
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
