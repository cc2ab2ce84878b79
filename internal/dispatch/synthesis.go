package dispatch

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/events"
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
func (d *Dispatcher) startSynthesis(st *RunState) []emission {
	syn := &SynthesisState{Stitch: st.Plan.Stitch}
	for i, c := range st.Calls {
		p := SynthesisPart{Part: events.PartSection, Index: c.PlanIndex, Action: c.Action, Title: fmt.Sprintf("## Section %d", i+1)}
		if i < len(st.Plan.Sections) {
			if t := strings.TrimSpace(st.Plan.Sections[i].Title); t != "" {
				p.Title = t
			}
			p.Instruction = st.Plan.Sections[i].Prompt
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
	st.Synthesis = syn
	st.Phase = PhaseSynthesizing
	out := []emission{stepWith(st, "synthesize-per-action-start", nil, "", fmt.Sprintf("%d parts", len(syn.Parts)), "",
		map[string]any{"parts": len(syn.Parts), "maxSectionParallel": d.cfg.MaxSectionParallel})}
	out = append(out, d.timer(st, events.TimerSynthesis, "synthesis", "", "synthesis", d.cfg.DecisionTimeout))
	return append(out, d.continueSynthesis(st)...)
}

// continueSynthesis requests parts up to the parallel bound, or stitches
// once every part is done.
func (d *Dispatcher) continueSynthesis(st *RunState) []emission {
	syn := st.Synthesis
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
		st.Synthesis = nil
		out := []emission{stepWith(st, "synthesize-stitch-done", nil, "", fmt.Sprintf("%d parts stitched", len(syn.Parts)), "ok",
			map[string]any{"finalAnswerSource": "plan_synthesize", "bytes": len(md)})}
		return append(out, d.terminate(st, &Terminal{Type: events.TypeRunCompleted, Answer: md})...)
	}
	var out []emission
	for i := range syn.Parts {
		p := &syn.Parts[i]
		if inFlight >= d.cfg.MaxSectionParallel {
			break
		}
		if p.Requested || p.Done {
			continue
		}
		p.Requested = true
		inFlight++
		out = append(out, d.synthesisRequest(st, *p))
	}
	return out
}

func (d *Dispatcher) synthesisRequest(st *RunState, p SynthesisPart) emission {
	req := &events.SynthesisRequested{RunID: st.RunID, Cycle: st.Cycle, Part: p.Part, Index: p.Index, Prompt: st.Prompt,
		Instruction: p.Instruction, Scenario: st.Scenario}
	if p.Part == events.PartSection {
		for _, c := range st.Calls {
			if c.PlanIndex == p.Index {
				req.Results = []events.Observation{d.observe(st, c, true)}
			}
		}
	} else {
		// Intro and outro see compact summaries of every result.
		for _, c := range st.Calls {
			obs := d.observe(st, c, true)
			obs.Output = digest(obs.Output, 512)
			req.Results = append(req.Results, obs)
		}
	}
	return emission{typ: events.TypeSynthesisRequested, id: st.derive("synthesize", st.Cycle, p.Part, p.Index), data: req,
		ext: []events.Extension{{Name: events.ExtCycle, Value: st.Cycle}}}
}

func (d *Dispatcher) onSynthesis(st *RunState, sc *events.SynthesisCompleted) []emission {
	if st.IsTerminal() || st.Phase != PhaseSynthesizing || st.Cycle != sc.Cycle || st.Synthesis == nil {
		return nil
	}
	var p *SynthesisPart
	for i := range st.Synthesis.Parts {
		if q := &st.Synthesis.Parts[i]; q.Part == sc.Part && q.Index == sc.Index {
			p = q
		}
	}
	if p == nil || p.Done || !p.Requested {
		return nil // a duplicate or an answer to nothing asked
	}
	p.Done = true
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
	var out []emission
	if p.Part == events.PartSection {
		pi := p.Index
		out = append(out, stepWith(st, "synthesize-section-done", &pi, p.Action, p.Title, status, map[string]any{"bytes": len(p.Markdown)}))
	} else {
		out = append(out, stepWith(st, "synthesize-"+p.Part+"-done", nil, "", p.Part, status, map[string]any{"bytes": len(p.Markdown)}))
	}
	return append(out, d.continueSynthesis(st)...)
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
