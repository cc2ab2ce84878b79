package actions_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/actionbus/actionbus/internal/actions"
)

func noop(context.Context, actions.Call) (actions.Result, error) { return actions.Result{}, nil }

// FuzzPrepareArgs runs random JSON input against random small schemas: it
// never panics, and it returns either input that the schema accepts or
// structured issues naming the action.
func FuzzPrepareArgs(f *testing.F) {
	f.Add(`{"type":"object","properties":{"a":{"type":"string","x-aliases":["b"]}},"required":["a"]}`, `{"b":"x","c":1}`, true)
	f.Add(`{"type":"object","properties":{"n":{"type":"integer","minimum":0},"o":{"type":"object","properties":{"p":{"type":"boolean"}}}}}`, `{"n":-1,"o":{"p":"no","q":null}}`, false)
	f.Add(`{"$ref":"#/$defs/x","$defs":{"x":{"type":"object","properties":{"k":{"$ref":"#/$defs/x"}}}}}`, `{"k":{"k":{"k":{}}}}`, true)
	f.Add(`{"type":"array"}`, `[1,2]`, true)
	f.Fuzz(func(t *testing.T, schemaDoc, input string, model bool) {
		if !json.Valid([]byte(schemaDoc)) {
			return
		}
		def := actions.Definition{Name: "fuzz.action", InputSchema: json.RawMessage(schemaDoc), HostOnlyKeys: []string{"secret"},
			Planner: &actions.PlannerMeta{Hidden: true}}
		if def.Normalize() != nil {
			return
		}
		c, err := actions.NewArgsChecker(def)
		if err != nil {
			return
		}
		var in map[string]any
		if json.Unmarshal([]byte(input), &in) != nil {
			in = map[string]any{"raw": input}
		}
		origin := actions.OriginHost
		if model {
			origin = actions.OriginModel
		}
		out, _, issues := c.Prepare(in, origin)
		if issues == nil {
			if _, _, again := c.Prepare(out, actions.OriginHost); again != nil {
				t.Fatalf("accepted input fails on a second check: %v", again)
			}
			if _, leaked := out["secret"]; leaked && model {
				t.Fatal("a host-only key survived model-origin input")
			}
			return
		}
		for _, is := range issues {
			if is.ActionName != "fuzz.action" || is.Error == "" || is.Reason == "" {
				t.Fatalf("unstructured issue %+v", is)
			}
		}
	})
}
