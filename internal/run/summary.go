package run

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/actionbus/actionbus/events"
)

// Summary is one line of a run listing (`actionbus runs`).
type Summary struct {
	RunID  string        `json:"runId"`
	Tenant string        `json:"tenant"`
	Kind   Kind          `json:"kind"`
	Status Status        `json:"status"`
	Age    time.Duration `json:"age"`
	// Waiting says what a running run waits for ("" once it ended).
	Waiting string `json:"waiting,omitempty"`
	UserID  string `json:"userId,omitempty"`
	// Usage is what the run's LLM calls used so far (nil: none).
	Usage *events.RunUsage `json:"usage,omitempty"`
}

// Summarize describes st as of now.
func Summarize(st *State, now time.Time) Summary {
	s := Summary{RunID: st.RunID, Tenant: st.TenantOrDefault(), Kind: st.Kind, Status: st.Status, Age: now.Sub(st.CreatedAt).Round(time.Second), UserID: st.UserID, Usage: st.Usage}
	if !st.IsTerminal() {
		s.Waiting = waitingFor(st)
	}
	return s
}

// waitingFor names what a running run waits for.
func waitingFor(st *State) string {
	if len(st.Approvals) > 0 {
		ids := make([]string, 0, len(st.Approvals))
		for id := range st.Approvals {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		return "approval " + ids[0]
	}
	switch st.Phase {
	case PhaseDeciding:
		return fmt.Sprintf("planner (cycle %d)", st.Cycle)
	case PhaseAwaitingInput:
		return "input"
	case PhaseSynthesizing:
		return "synthesis"
	}
	for _, c := range st.Calls {
		if c.WaitingCapacity && !c.Dispatched {
			return "capacity of " + c.Action
		}
	}
	if st.Workflow != nil {
		for i, sr := range st.Workflow.Steps {
			if sr.Status == StepStatusWaitingRetry {
				return fmt.Sprintf("retry of step %s (attempt %d)", st.Workflow.Def.Steps[i].ID, sr.Attempt+1)
			}
		}
	}
	if n := st.inFlight(); n > 0 {
		return fmt.Sprintf("%d action(s)", n)
	}
	return string(st.Phase)
}

// Filter selects runs of a listing; zero fields select everything.
type Filter struct {
	Statuses []Status
	Kinds    []Kind
	UserID   string
	Tenant   string
	// MaxAge keeps runs younger than it.
	MaxAge time.Duration
}

// Match reports whether s passes the filter.
func (f Filter) Match(s Summary) bool {
	return (len(f.Statuses) == 0 || slices.Contains(f.Statuses, s.Status)) &&
		(len(f.Kinds) == 0 || slices.Contains(f.Kinds, s.Kind)) &&
		(f.UserID == "" || f.UserID == s.UserID) &&
		(f.Tenant == "" || f.Tenant == s.Tenant) &&
		(f.MaxAge <= 0 || s.Age < f.MaxAge)
}
