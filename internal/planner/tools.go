package planner

import (
	"encoding/json"
	"slices"

	"github.com/actionbus/actionbus/internal/actions"
)

// Native tool schemas are generated from the same contract as envelope
// mode and the dispatcher's checks: an action's input schema is its tool's
// parameters (x-aliases removed: the model should write canonical keys,
// and alias rewrite stays a defensive layer), its args example a fallback
// for actions without a schema. web_search.query and read_url.url stay
// optional, as the seed says, because the runtime can fill them.

// Internal planner tools.
const (
	toolClarify = "ask_clarification"
	toolFinal   = "final_answer"
	toolFinish  = "finalize" // accepted as final_answer
)

// optionalInTools are the seed's fields kept optional in native tools.
var optionalInTools = map[string][]string{"web_search": {"query"}, "read_url": {"url"}}

// ToolParameters returns the native tool parameters of an action.
func ToolParameters(e actions.Entry) map[string]any {
	var schema map[string]any
	if len(e.InputSchema) > 0 && json.Unmarshal(e.InputSchema, &schema) == nil {
		schema = withoutAliases(schema).(map[string]any)
	} else {
		schema = schemaFromExample(e)
	}
	if schema["type"] == nil {
		schema["type"] = "object"
	}
	if opt := optionalInTools[e.Name]; opt != nil {
		if req, ok := schema["required"].([]any); ok {
			kept := make([]any, 0, len(req))
			for _, r := range req {
				if s, _ := r.(string); !slices.Contains(opt, s) {
					kept = append(kept, r)
				}
			}
			schema["required"] = kept
		}
	}
	return schema
}

// withoutAliases returns v with every x-aliases keyword removed.
func withoutAliases(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, x := range t {
			if k == "x-aliases" {
				continue
			}
			out[k] = withoutAliases(x)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, x := range t {
			out[i] = withoutAliases(x)
		}
		return out
	}
	return v
}

// schemaFromExample derives an object schema from an action's args
// example: one property per key, typed from the example value; nothing
// required (only a schema can say that).
func schemaFromExample(e actions.Entry) map[string]any {
	props := map[string]any{}
	if e.Planner != nil {
		if ex, ok := e.Planner.ArgsExample.(map[string]any); ok {
			for k, v := range ex {
				props[k] = map[string]any{"type": jsonType(v)}
			}
		}
	}
	return map[string]any{"type": "object", "properties": props}
}

func jsonType(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case bool:
		return "boolean"
	case float64, int, int64:
		return "number"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "string"
}

// nativeTool is a function tool with an explicit schema.
type nativeTool struct {
	name, description string
	params            map[string]any
}

// internalTools are the planner's own tools, with explicit schemas.
var internalTools = []nativeTool{
	{toolClarify, "Ask the user a clarifying question when the request cannot be done without their answer. The run pauses until they answer.",
		map[string]any{"type": "object", "required": []any{"question"}, "properties": map[string]any{
			"question": map[string]any{"type": "string", "description": "The question for the user."}}}},
	{toolFinal, "Give the final answer to the user when no more actions are needed.",
		map[string]any{"type": "object", "required": []any{"answer"}, "properties": map[string]any{
			"answer":    map[string]any{"type": "string", "description": "The answer, in markdown."},
			"citations": map[string]any{"type": "array", "items": map[string]any{"type": "string"}, "description": "URLs of the sources the answer uses."}}}},
}
