package run

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
)

// Per-action synthesis (the seed's synthesize_per_action): the dispatcher
// asks the planner service for one section per plan action, plus an
// optional intro and outro, with at most MaxSectionParallel requests in
// flight, and stitches the parts in declaration order into the final
// answer (finalAnswerSource "plan_synthesize"). The LLM calls are the
// planner's; ordering and stitching are the dispatcher's.

// SynthesisState is a run's per-action synthesis in progress.
type SynthesisState struct {
	Parts  []SynthesisPart `json:"parts"`
	Stitch *events.Stitch  `json:"stitch,omitempty"`
	// ObservationBytes bounds a section's view of its result (the
	// machine's limit when the synthesis started).
	ObservationBytes int `json:"observationBytes,omitempty"`
}

// SynthesisPart is one section, intro or outro of a per-action synthesis.
type SynthesisPart struct {
	Part        string `json:"part"`
	Index       int    `json:"index"`
	Action      string `json:"action,omitempty"`
	Title       string `json:"title,omitempty"`
	Instruction string `json:"instruction,omitempty"`
	Requested   bool   `json:"requested,omitempty"`
	Done        bool   `json:"done,omitempty"`
	Markdown    string `json:"markdown,omitempty"`
}

// checkPerAction applies the per-action synthesis rules to a plan.
func checkPerAction(dec events.Decision) *actionbus.Error {
	if !dec.SynthesizePerAction {
		return nil
	}
	for i, a := range dec.Actions {
		if a.Section == nil || strings.TrimSpace(a.Section.Prompt) == "" {
			return actionbus.Errorf(actionbus.CodePlanRejected, "plan entry %d has no section.prompt; every action of a synthesize_per_action plan needs one", i).
				WithDetail("planIndex", i)
		}
	}
	return nil
}

// startSynthesis begins the per-action synthesis of the current plan's
// results. Direct-final results and failed actions need no call.
func (m *Machine) startSynthesis(st *State) []Effect {
	syn := &SynthesisState{Stitch: st.Agent.Plan.Stitch, ObservationBytes: m.lim.ObservationBytes}
	for i, c := range st.Calls {
		p := SynthesisPart{Part: events.PartSection, Index: c.PlanIndex, Action: c.Action, Title: fmt.Sprintf("## Section %d", i+1)}
		if i < len(st.Agent.Plan.Sections) {
			if t := strings.TrimSpace(st.Agent.Plan.Sections[i].Title); t != "" {
				p.Title = t
			}
			p.Instruction = st.Agent.Plan.Sections[i].Prompt
		}
		switch md, _ := directFinal(c); {
		case !c.OK:
			p.Done, p.Markdown = true, sectionFailed("action failed: "+errorText(c.Error))
		case md != "":
			p.Done, p.Markdown = true, stripUIBlocks(md)
		}
		syn.Parts = append(syn.Parts, p)
	}
	if s := syn.Stitch; s != nil {
		if strings.TrimSpace(s.IntroPrompt) != "" {
			syn.Parts = append(syn.Parts, SynthesisPart{Part: events.PartIntro, Instruction: s.IntroPrompt})
		}
		if strings.TrimSpace(s.OutroPrompt) != "" {
			syn.Parts = append(syn.Parts, SynthesisPart{Part: events.PartOutro, Instruction: s.OutroPrompt})
		}
	}
	st.Agent.Synthesis = syn
	st.Phase = PhaseSynthesizing
	out := []Effect{stepWith(st, StepSynthesizePerActionStart, nil, "", fmt.Sprintf("%d parts", len(syn.Parts)), "",
		map[string]any{"parts": len(syn.Parts), "maxSectionParallel": m.lim.MaxSectionParallel})}
	out = append(out, m.timer(st, events.TimerFired{Kind: events.TimerSynthesis, Stage: "synthesis"}, "synthesis", m.lim.DecisionTimeout))
	return append(out, m.continueSynthesis(st)...)
}

// continueSynthesis requests parts up to the parallel bound, or stitches
// once every part is done.
func (m *Machine) continueSynthesis(st *State) []Effect {
	syn := st.Agent.Synthesis
	inFlight, pending := 0, 0
	for _, p := range syn.Parts {
		if p.Requested && !p.Done {
			inFlight++
		}
		if !p.Done {
			pending++
		}
	}
	if pending == 0 {
		md := stitch(syn)
		st.Agent.Synthesis = nil
		out := []Effect{stepWith(st, StepSynthesizeStitchDone, nil, "", fmt.Sprintf("%d parts stitched", len(syn.Parts)), "ok",
			map[string]any{"finalAnswerSource": "plan_synthesize", "bytes": len(md)})}
		return append(out, m.terminate(st, &Terminal{Type: events.TypeRunCompleted, Answer: md})...)
	}
	var out []Effect
	for i := range syn.Parts {
		p := &syn.Parts[i]
		if inFlight >= m.lim.MaxSectionParallel {
			break
		}
		if p.Requested || p.Done {
			continue
		}
		p.Requested = true
		inFlight++
		out = append(out, synthesizeEffect(st, *p))
	}
	return out
}

// synthesisRequest is the request of one part: a section sees its
// action's result, an intro or outro compact summaries of every result.
func synthesisRequest(st *State, p SynthesisPart) *events.SynthesisRequested {
	req := &events.SynthesisRequested{RunID: st.RunID, Cycle: st.Cycle, Part: p.Part, Index: p.Index, Prompt: st.Agent.Prompt,
		Instruction: p.Instruction, Scenario: st.Agent.Scenario, Budget: st.Budget, Used: st.usedIfBounded(), TenantBudget: st.TenantBudget}
	if p.Part == events.PartSection {
		for _, c := range st.Calls {
			if c.PlanIndex == p.Index {
				req.Results = []events.Observation{observe(st, c, true, st.Agent.Synthesis.ObservationBytes)}
			}
		}
		return req
	}
	for _, c := range st.Calls {
		req.Results = append(req.Results, observe(st, c, true, 512))
	}
	return req
}

// part returns the part named by kind and index, or nil.
func (s *SynthesisState) part(kind string, index int) *SynthesisPart {
	for i := range s.Parts {
		if p := &s.Parts[i]; p.Part == kind && p.Index == index {
			return p
		}
	}
	return nil
}

func (m *Machine) onSynthesis(st *State, sc *events.SynthesisCompleted) []Effect {
	if st.Agent == nil || st.IsTerminal() || st.Phase != PhaseSynthesizing || st.Cycle != sc.Cycle || st.Agent.Synthesis == nil {
		return nil
	}
	p := st.Agent.Synthesis.part(sc.Part, sc.Index)
	if p == nil || p.Done || !p.Requested {
		return nil // a duplicate or an answer to nothing asked
	}
	p.Done = true
	if over := m.spend(st, sc.Usage); over != nil {
		return m.fail(st, over)
	}
	md := stripUIBlocks(sc.Markdown)
	status := "ok"
	switch {
	case sc.Error != nil:
		p.Markdown, status = sectionFailed(errorText(sc.Error)), "failed"
	case strings.TrimSpace(md) == "":
		p.Markdown, status = sectionFailed("empty synthesis output"), "failed"
	default:
		p.Markdown = md
	}
	var out []Effect
	if p.Part == events.PartSection {
		pi := p.Index
		out = append(out, stepWith(st, StepSynthesizeSectionDone, &pi, p.Action, p.Title, status, map[string]any{"bytes": len(p.Markdown)}))
	} else {
		out = append(out, stepWith(st, map[string]StepName{events.PartIntro: StepSynthesizeIntroDone, events.PartOutro: StepSynthesizeOutroDone}[p.Part], nil, "", p.Part, status, map[string]any{"bytes": len(p.Markdown)}))
	}
	return append(out, m.continueSynthesis(st)...)
}

func errorText(e *actionbus.Error) string {
	if e == nil {
		return "unknown error"
	}
	return string(e.Code) + ": " + e.Message
}

// sectionFailed renders a part that produced nothing usable. The reason
// goes into an HTML comment, so "--" must not close it early.
func sectionFailed(reason string) string {
	reason = strings.ReplaceAll(strings.TrimSpace(reason), "--", "- -")
	return "<!-- section failed: " + reason + " -->"
}

// uiBlock matches a fenced g3-followups or g3-drill-hints block: those UI
// extension blocks are stitch-level concerns, so sections lose theirs.
var uiBlock = regexp.MustCompile("(?ms)^[ \t]*```(?:g3-followups|g3-drill-hints)[ \t]*\n.*?^[ \t]*```[ \t]*(?:\n|$)")

func stripUIBlocks(md string) string {
	return strings.TrimSpace(uiBlock.ReplaceAllString(md, ""))
}

// stitch puts the parts together deterministically: intro, the sections
// in declaration order (title, then markdown), outro, then provenance,
// followups and drill hints, in the seed's order.
func stitch(syn *SynthesisState) string {
	var intro, outro string
	var b strings.Builder
	for _, p := range syn.Parts {
		switch p.Part {
		case events.PartIntro:
			intro = p.Markdown
		case events.PartOutro:
			outro = p.Markdown
		}
	}
	block := func(s string) {
		if s = strings.TrimSpace(s); s == "" {
			return
		}
		if b.Len() > 0 {
			b.WriteString("\n\n")
		}
		b.WriteString(s)
	}
	block(intro)
	for _, p := range syn.Parts {
		if p.Part == events.PartSection {
			block(p.Title + "\n\n" + p.Markdown)
		}
	}
	block(outro)
	if s := syn.Stitch; s != nil {
		block(s.Provenance)
		if len(s.Followups) > 0 {
			j, _ := json.Marshal(s.Followups)
			block("```g3-followups\n" + string(j) + "\n```")
		}
		if len(s.DrillHints) > 0 {
			j, _ := json.Marshal(s.DrillHints)
			block("```g3-drill-hints\n" + string(j) + "\n```")
		}
	}
	return b.String()
}
