package planner

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
)

// Planner repair: what an LLM reply needs before it is a decision. The
// reply's JSON is found in prose or a code fence, action names are mapped
// through the aliases the catalog declares (PlannerMeta.Aliases; names no
// action has), read_url gets the prompt's first URL when it has none,
// and the decision is checked against the planner-visible catalog. The
// dispatcher checks it all again (schemas, policy); this is the planner's
// chance to send a bad reply back to the model before a cycle is spent.

// extractJSON returns the first JSON object of text: the whole text, the
// body of a ```json fence, or the first balanced {...} in prose.
func extractJSON(text string) (string, bool) {
	t := strings.TrimSpace(text)
	if json.Valid([]byte(t)) && strings.HasPrefix(t, "{") {
		return t, true
	}
	if m := fence.FindStringSubmatch(t); m != nil {
		if body := strings.TrimSpace(m[1]); json.Valid([]byte(body)) && strings.HasPrefix(body, "{") {
			return body, true
		}
	}
	for start := strings.IndexByte(t, '{'); start >= 0; {
		if end := balanced(t[start:]); end > 0 && json.Valid([]byte(t[start:start+end])) {
			return t[start : start+end], true
		}
		next := strings.IndexByte(t[start+1:], '{')
		if next < 0 {
			break
		}
		start += 1 + next
	}
	return "", false
}

var fence = regexp.MustCompile("(?s)```(?:json|JSON)?[ \t]*\n(.*?)```")

// balanced returns the length of the {...} at the start of s, honouring
// strings, or 0.
func balanced(s string) int {
	depth, inStr, esc := 0, false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case esc:
			esc = false
		case inStr && c == '\\':
			esc = true
		case c == '"':
			inStr = !inStr
		case inStr:
		case c == '{':
			depth++
		case c == '}':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	return 0
}

// toolMarkup spots tool calls written as text by a model that should have
// used native tool calls.
var toolMarkup = regexp.MustCompile(`(?i)<tool_call>|</tool_call>|<function[=\s>]|<\|tool|"tool_calls"\s*:|"function_call"\s*:|^\s*\{\s*"name"\s*:\s*"[^"]+"\s*,\s*"(arguments|parameters)"\s*:|` + "```tool")

// firstURL is the first http(s) URL in text, without trailing punctuation.
var urlPattern = regexp.MustCompile(`https?://[^\s<>"'\x60]+`)

func firstURL(text string) string {
	u := urlPattern.FindString(text)
	return strings.TrimRight(u, ".,;:!?)]}")
}

// catalogIndex resolves the names a model may use.
type catalogIndex struct {
	byName  map[string]*actions.Entry
	byTool  map[string]string // native tool name → action name
	aliases map[string]string
}

// newCatalogIndex indexes the entries distinctTools keeps; an alias names
// the first entry that declares it, never one that a name or an earlier
// alias already names.
func newCatalogIndex(entries []actions.Entry) *catalogIndex {
	entries = distinctTools(entries)
	ix := &catalogIndex{byName: map[string]*actions.Entry{}, byTool: map[string]string{}, aliases: map[string]string{}}
	for i := range entries {
		e := &entries[i]
		ix.byName[e.Name] = e
		ix.byTool[actions.ToolName(e.Name)] = e.Name
	}
	for i := range entries {
		e := &entries[i]
		if e.Planner == nil {
			continue
		}
		for _, a := range e.Planner.Aliases {
			_, isName := ix.byName[a]
			_, isTool := ix.byTool[actions.ToolName(a)]
			_, taken := ix.aliases[a]
			if !isName && !isTool && !taken {
				ix.aliases[a] = e.Name
			}
		}
	}
	return ix
}

// distinctTools returns the entries whose native tool name
// (actions.ToolName) no earlier entry has: two entries of one tool name
// are never both offered, and a call of that name never reaches the later
// one. The registrar refuses such catalogs (it claims every tool name);
// this is defence in depth, for entries recorded before it did.
func distinctTools(entries []actions.Entry) []actions.Entry {
	seen := make(map[string]bool, len(entries))
	out := make([]actions.Entry, 0, len(entries))
	for _, e := range entries {
		n := actions.ToolName(e.Name)
		if seen[n] {
			continue
		}
		seen[n] = true
		out = append(out, e)
	}
	return out
}

func (ix *catalogIndex) names() string {
	out := make([]string, 0, len(ix.byName))
	for n := range ix.byName {
		out = append(out, n)
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// repair fixes what can be fixed in dec and reports each repair; then
// check decides whether the result is usable.
func (ix *catalogIndex) repair(dec *events.Decision, prompt string, in Input) {
	fix := func(a *events.Decision) {
		if a.Type == "" && a.Name != "" {
			a.Type = events.DecisionAction
		}
		if a.Type != events.DecisionAction {
			return
		}
		if _, ok := ix.byName[a.Name]; !ok {
			if target, ok := ix.aliases[a.Name]; ok {
				in.Diagnose(actionbus.Errorf(actionbus.CodePlannerRepaired, "action name %q mapped to %q", a.Name, target).
					WithDetail("repair", "alias").WithDetail("from", a.Name).WithDetail("to", target))
				a.Name = target
			}
		}
		if a.Name == "read_url" {
			if u, _ := a.Args["url"].(string); strings.TrimSpace(u) == "" {
				if u := firstURL(prompt); u != "" {
					if a.Args == nil {
						a.Args = map[string]any{}
					}
					a.Args["url"] = u
					in.Diagnose(actionbus.Errorf(actionbus.CodePlannerRepaired, "read_url.url taken from the prompt").
						WithDetail("repair", "read_url.url").WithDetail("url", u))
				}
			}
		}
	}
	fix(dec)
	for i := range dec.Actions {
		fix(&dec.Actions[i])
	}
}

// check returns why dec cannot be used, or nil.
func (ix *catalogIndex) check(dec events.Decision) *actionbus.Error {
	checkAction := func(a events.Decision, where string) *actionbus.Error {
		if a.Name == "" {
			return actionbus.Errorf(actionbus.CodeInvalidDecision, "%san action needs a name", where)
		}
		if _, ok := ix.byName[a.Name]; !ok {
			return actionbus.Errorf(actionbus.CodeActionNotFound, "%saction %q does not exist; choose one of: %s", where, a.Name, ix.names()).
				WithDetail("action", a.Name)
		}
		return nil
	}
	switch dec.Type {
	case events.DecisionAction:
		return checkAction(dec, "")
	case events.DecisionPlan:
		if len(dec.Actions) == 0 {
			return actionbus.Errorf(actionbus.CodeInvalidDecision, "a plan needs a non-empty actions array")
		}
		for i, a := range dec.Actions {
			if a.Type != events.DecisionAction {
				return actionbus.Errorf(actionbus.CodeInvalidDecision, "plan entry %d has type %q; a plan holds only action envelopes", i, a.Type)
			}
			if err := checkAction(a, fmt.Sprintf("plan entry %d: ", i)); err != nil {
				return err
			}
		}
		return nil
	case events.DecisionClarify:
		if strings.TrimSpace(dec.Question) == "" {
			return actionbus.Errorf(actionbus.CodeInvalidDecision, "a clarify envelope needs a question")
		}
		return nil
	case events.DecisionFinal:
		if strings.TrimSpace(dec.Answer) == "" {
			return actionbus.Errorf(actionbus.CodeInvalidDecision, "a final envelope needs an answer")
		}
		return nil
	case "":
		return actionbus.Errorf(actionbus.CodeInvalidDecision, "the envelope has no type (want action, plan, clarify or final)")
	}
	return actionbus.Errorf(actionbus.CodeInvalidDecision, "unknown envelope type %q (want action, plan, clarify or final)", dec.Type)
}

// decodeEnvelope reads one decision envelope from a model's text reply.
func decodeEnvelope(text string, in Input) (events.Decision, *actionbus.Error) {
	raw, ok := extractJSON(text)
	if !ok {
		return events.Decision{}, actionbus.Errorf(actionbus.CodeInvalidDecision, "the reply holds no JSON envelope; reply with exactly one JSON object")
	}
	if raw != strings.TrimSpace(text) {
		in.Diagnose(actionbus.Errorf(actionbus.CodePlannerRepaired, "JSON envelope extracted from a wrapped reply").WithDetail("repair", "extract_json"))
	}
	var dec events.Decision
	if err := json.Unmarshal([]byte(raw), &dec); err != nil {
		return events.Decision{}, actionbus.Errorf(actionbus.CodeInvalidDecision, "the envelope does not decode: %v", err)
	}
	return dec, nil
}

// readSource is a page a run read, which a final answer may cite.
type readSource struct {
	URL, Title string
}

// readSources lists the pages successful read_url calls returned, in the
// order they were read, without duplicates.
func readSources(obs []events.Observation) []readSource {
	var out []readSource
	seen := map[string]bool{}
	for _, o := range obs {
		if !o.OK || o.Action != "read_url" {
			continue
		}
		m, _ := o.Output.(map[string]any)
		if ok, isBool := m["ok"].(bool); isBool && !ok {
			continue // a failed read (read_url_result with ok false) is no source
		}
		u, _ := m["finalUrl"].(string)
		if u == "" {
			u, _ = m["url"].(string)
		}
		if u == "" || seen[u] {
			continue
		}
		seen[u] = true
		title, _ := m["title"].(string)
		out = append(out, readSource{URL: u, Title: title})
	}
	return out
}

// withSources completes a final answer: citations default to the read
// sources, and a user-visible "Sources:" section lists them unless the
// answer has one.
func withSources(dec events.Decision, obs []events.Observation) events.Decision {
	src := readSources(obs)
	if len(src) == 0 {
		return dec
	}
	if len(dec.Citations) == 0 {
		for _, s := range src {
			dec.Citations = append(dec.Citations, s.URL)
		}
	}
	if strings.Contains(dec.Answer, "\nSources:") || strings.HasPrefix(dec.Answer, "Sources:") {
		return dec
	}
	titles := map[string]string{}
	for _, s := range src {
		titles[s.URL] = s.Title
	}
	var b strings.Builder
	b.WriteString(strings.TrimRight(dec.Answer, "\n"))
	b.WriteString("\n\nSources:\n")
	for i, c := range dec.Citations {
		if t := titles[c]; t != "" {
			fmt.Fprintf(&b, "%d. [%s](%s)\n", i+1, t, c)
		} else {
			fmt.Fprintf(&b, "%d. %s\n", i+1, c)
		}
	}
	dec.Answer = strings.TrimRight(b.String(), "\n")
	return dec
}
