package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
)

// progress prints a run's events live, one line per step.
type progress struct {
	mu        sync.Mutex // steps and streamed tokens arrive on different goroutines
	w         io.Writer
	start     time.Time
	streaming bool
	// onStep, when set, sees every step after it is printed.
	onStep func(client.Step)
}

func newProgress(w io.Writer) *progress { return &progress{w: w, start: time.Now()} }

// token prints a piece of the final answer as the planner writes it.
func (p *progress) token(delta string, end bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if end {
		if p.streaming {
			fmt.Fprint(p.w, "\n")
		}
		p.streaming = false
		return
	}
	if !p.streaming {
		fmt.Fprintf(p.w, "%8s ✎ ", time.Since(p.start).Round(time.Millisecond))
		p.streaming = true
	}
	fmt.Fprint(p.w, delta)
}

func (p *progress) event(e client.Event) {
	if e.Type != events.TypeRunStarted && !events.IsRunStep(e.Type) {
		return // only these are printed: the others must not break a streamed line
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.streaming {
		fmt.Fprint(p.w, "\n")
		p.streaming = false
	}
	elapsed := time.Since(p.start).Round(time.Millisecond)
	prefix := fmt.Sprintf("%8s ", elapsed)
	switch e.Type {
	case events.TypeRunStarted:
		var d events.RunStarted
		_ = json.Unmarshal(e.Data, &d)
		fmt.Fprintf(p.w, "%s▶ run %s started (%s)\n", prefix, e.RunID, d.Kind)
	case events.TypeRunStep, events.TypeRunProgress:
		// One step: Follow delivers a run.progress message (a
		// transition's steps) as one event per step, in order.
		s, _ := e.Step()
		where := ""
		if s.PlanIndex != nil {
			where = fmt.Sprintf("[%d] ", *s.PlanIndex)
		}
		mark := "·"
		switch s.Status {
		case "ok":
			mark = "✓"
		case "failed":
			mark = "✗"
		}
		fmt.Fprintf(p.w, "%s%s cycle %d %-17s %s%s %s\n", prefix, mark, s.Cycle, s.Name, where, s.Action, s.Message)
	}
}

// result prints the terminal state and returns the exit code: 0 only for
// a completed run.
func (p *progress) result(res *client.Result) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.usage(res.Usage)
	switch res.Status {
	case client.StatusCompleted:
		fmt.Fprintf(p.w, "✔ completed in %s after %d cycle(s)\n", time.Since(p.start).Round(time.Millisecond), res.Cycles)
		if res.Answer != "" {
			fmt.Fprintf(p.w, "\n%s\n", strings.TrimSpace(res.Answer))
		}
		if res.Output != nil {
			b, _ := json.MarshalIndent(res.Output, "", "  ")
			fmt.Fprintf(p.w, "\noutput: %s\n", b)
		}
		return 0
	case client.StatusCanceled:
		fmt.Fprintf(p.w, "■ canceled: %s\n", res.Reason)
		return 3
	default:
		fmt.Fprintf(p.w, "✘ failed: %s\n", res.Error.Error())
		return 2
	}
}

// usage prints what a run's LLM calls used, after its outcome.
func (p *progress) usage(u *client.Usage) {
	if u == nil {
		return
	}
	fmt.Fprintf(p.w, "LLM usage: %s\n", usageText(*u))
}

// usageText is a run's usage on one line: tokens in and out, calls,
// cost, and what of it is estimated or unpriced.
func usageText(u client.Usage) string {
	s := fmt.Sprintf("%d tokens (%d in, %d out) in %d call(s), $%.4f", u.Tokens(), u.InputTokens, u.OutputTokens, u.Calls, u.CostUSD)
	if u.EstimatedCalls > 0 {
		s += fmt.Sprintf("; %d call(s) estimated", u.EstimatedCalls)
	}
	if u.UnpricedCalls > 0 {
		s += fmt.Sprintf("; %d call(s) unpriced", u.UnpricedCalls)
	}
	return s
}
