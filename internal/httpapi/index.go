package httpapi

import (
	"encoding/json"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/run"
)

// Run statuses of a [RunView] (the terminal ones are the client's).
const (
	StatusRunning          = "running"
	StatusAwaitingInput    = "awaiting_input"
	StatusAwaitingApproval = "awaiting_approval"
)

// RunView is what the API lists of a run: built from the run's events, so
// a client user (who cannot read run state) sees it.
type RunView struct {
	RunID  string `json:"runId"`
	Tenant string `json:"tenant"`
	// Kind is agent, exec or workflow; empty until the run's request or
	// run.started was seen.
	Kind   string `json:"kind,omitempty"`
	Status string `json:"status"`
	// Waiting says what a run that is not ended waits for.
	Waiting string `json:"waiting,omitempty"`
	UserID  string `json:"userId,omitempty"`
	// Title is the prompt, the action's name or the workflow's name.
	Title     string    `json:"title,omitempty"`
	StartedAt time.Time `json:"startedAt"`
	UpdatedAt time.Time `json:"updatedAt"`
	EndedAt   time.Time `json:"endedAt,omitzero"`
	Cycles    int       `json:"cycles,omitempty"`
	// Usage is what the run's LLM calls used, once it ended.
	Usage *events.RunUsage `json:"usage,omitempty"`
	// LastStep is the latest progress step seen live ("name: message").
	LastStep string           `json:"lastStep,omitempty"`
	Answer   string           `json:"answer,omitempty"`
	Output   any              `json:"output,omitempty"`
	Error    *actionbus.Error `json:"error,omitempty"`
	Reason   string           `json:"reason,omitempty"`
	// Approvals are the ids of the run's pending approvals.
	Approvals []string `json:"approvals,omitempty"`

	requested bool // the request was read (or is known to be gone)
}

// Ended reports whether the run reached its terminal state.
func (v *RunView) Ended() bool {
	switch v.Status {
	case client.StatusCompleted, client.StatusFailed, client.StatusCanceled:
		return true
	}
	return false
}

// ApprovalView is a pending approval as the approval context holds it.
type ApprovalView struct {
	ApprovalID  string         `json:"approvalId"`
	RunID       string         `json:"runId"`
	StepID      string         `json:"stepId,omitempty"`
	Action      string         `json:"action"`
	UserID      string         `json:"userId,omitempty"`
	InputHash   string         `json:"inputHash"`
	Input       map[string]any `json:"input"`
	ResourceIDs []string       `json:"resourceIds,omitempty"`
	DryRunHash  string         `json:"dryRunHash,omitempty"`
	// DryRunAction and DryRunMatches are the context's: the dry run whose
	// input is the input to approve, and whether there is one.
	DryRunAction  string    `json:"dryRunAction,omitempty"`
	DryRunMatches bool      `json:"dryRunMatches"`
	Reason        string    `json:"reason,omitempty"`
	RequestedAt   time.Time `json:"requestedAt"`
	ExpiresAt     time.Time `json:"expiresAt"`
}

// Index is the view of a tenant's runs and pending approvals, built by
// applying the run events in stream order. It is pure (no I/O) and not
// safe for concurrent use: the server guards it.
type Index struct {
	tenant    string
	maxRuns   int
	runs      map[string]*RunView
	approvals map[string]*ApprovalView
}

// NewIndex returns an empty index of tenant's runs that keeps at most
// maxRuns runs (the oldest ended ones go first).
func NewIndex(tenant string, maxRuns int) *Index {
	return &Index{tenant: tenant, maxRuns: maxRuns, runs: map[string]*RunView{}, approvals: map[string]*ApprovalView{}}
}

// view returns the run's view, creating it at t.
func (x *Index) view(runID string, t time.Time) *RunView {
	v, ok := x.runs[runID]
	if !ok {
		v = &RunView{RunID: runID, Tenant: x.tenant, Status: StatusRunning, StartedAt: t}
		x.runs[runID] = v
		x.evict()
	}
	return v
}

// Apply applies one event and returns the changed run's view (a copy), or
// nil when the event changed nothing.
func (x *Index) Apply(e client.Event) *RunView {
	if e.RunID == "" || !events.ValidRunID(e.RunID) {
		return nil
	}
	v := x.view(e.RunID, e.Time)
	if e.Time.After(v.UpdatedAt) {
		v.UpdatedAt = e.Time
	}
	ended := v.Ended()
	switch e.Type {
	case events.TypeRunStarted:
		var d events.RunStarted
		if json.Unmarshal(e.Data, &d) == nil && d.Kind != "" {
			v.Kind = d.Kind
			if v.Title == "" {
				v.Title = d.Prompt
			}
		}
	case events.TypeRunStep, events.TypeRunProgress:
		// One step: Watch delivers a run.progress message (a
		// transition's steps) as one event per step, in order.
		var d events.RunStep
		if json.Unmarshal(e.Data, &d) != nil {
			return nil
		}
		v.LastStep = d.Name
		if d.Message != "" {
			v.LastStep += ": " + d.Message
		}
		if !ended && d.Name == string(run.StepAwaitingInput) {
			v.Status, v.Waiting = StatusAwaitingInput, "input: "+d.Message
		}
	case events.TypeDecisionRequested:
		var d events.DecisionRequested
		if json.Unmarshal(e.Data, &d) == nil && !ended {
			v.Cycles = max(v.Cycles, d.Cycle)
			v.Status, v.Waiting = StatusRunning, "planner decision (cycle "+strconv.Itoa(d.Cycle)+")"
		}
	case events.TypeDecisionMade:
		var d events.DecisionMade
		// A clarify decision is not yet a run waiting for input: the
		// dispatcher's awaiting-input step says when it is (an answer
		// sent before is ignored).
		if json.Unmarshal(e.Data, &d) == nil && !ended {
			v.Waiting = ""
		}
	case events.TypeActionCompleted, events.TypeActionFailed, events.TypeSynthesisCompleted:
		if !ended && v.Status == StatusRunning {
			v.Waiting = ""
		}
	case events.TypeApprovalRequested:
		var d events.ApprovalRequested
		if json.Unmarshal(e.Data, &d) != nil || ended {
			return nil
		}
		c := d.Context
		x.approvals[c.ApprovalID] = &ApprovalView{ApprovalID: c.ApprovalID, RunID: e.RunID, StepID: c.StepID, Action: c.Action,
			UserID: c.UserID, InputHash: c.InputHash, Input: d.Input, ResourceIDs: c.ResourceIDs, DryRunHash: c.DryRunHash, DryRunAction: c.DryRunAction, DryRunMatches: c.DryRunMatches,
			Reason: d.Reason, RequestedAt: e.Time, ExpiresAt: c.ExpiresAt}
		x.syncApprovals(v)
	case events.TypeApprovalResolved:
		var d events.ApprovalResolved
		if json.Unmarshal(e.Data, &d) != nil {
			return nil
		}
		if d.Outcome != events.ApprovalOutcomeRefused {
			delete(x.approvals, d.ApprovalID)
		}
		x.syncApprovals(v)
	case events.TypeRunCompleted:
		var d events.RunCompleted
		if json.Unmarshal(e.Data, &d) == nil {
			v.Status, v.Answer, v.Output, v.Cycles, v.Usage = client.StatusCompleted, d.Answer, d.Output, d.Cycles, d.Usage
		}
		x.end(v, e.Time)
	case events.TypeRunFailed:
		var d events.RunFailed
		if json.Unmarshal(e.Data, &d) == nil {
			v.Status, v.Error, v.Cycles, v.Usage = client.StatusFailed, &d.Error, d.Cycles, d.Usage
		}
		x.end(v, e.Time)
	case events.TypeRunCanceled:
		var d events.RunCanceled
		if json.Unmarshal(e.Data, &d) == nil {
			v.Status, v.Reason, v.Cycles, v.Usage = client.StatusCanceled, d.Reason, d.Cycles, d.Usage
		}
		x.end(v, e.Time)
	}
	out := *v
	return &out
}

// end records a terminal event: no approval of the run is pending anymore.
func (x *Index) end(v *RunView, t time.Time) {
	v.EndedAt, v.Waiting = t, ""
	for id, a := range x.approvals {
		if a.RunID == v.RunID {
			delete(x.approvals, id)
		}
	}
	v.Approvals = nil
}

// syncApprovals sets a run's pending approvals and what it waits for.
func (x *Index) syncApprovals(v *RunView) {
	v.Approvals = v.Approvals[:0]
	for id, a := range x.approvals {
		if a.RunID == v.RunID {
			v.Approvals = append(v.Approvals, id)
		}
	}
	sort.Strings(v.Approvals)
	switch {
	case v.Ended():
	case len(v.Approvals) > 0:
		v.Status, v.Waiting = StatusAwaitingApproval, "approval "+v.Approvals[0]
	case v.Status == StatusAwaitingApproval:
		v.Status, v.Waiting = StatusRunning, ""
	}
}

// NeedsRequest reports whether the run's request has not been applied yet.
func (x *Index) NeedsRequest(runID string) bool {
	v, ok := x.runs[runID]
	return ok && !v.requested
}

// ApplyRequest records what a run was started with (from its stored
// run.requested); req is nil when it is no longer stored.
func (x *Index) ApplyRequest(runID string, req *client.RunRequest, at time.Time) *RunView {
	v, ok := x.runs[runID]
	if !ok {
		return nil
	}
	v.requested = true
	if req == nil {
		return nil
	}
	v.setRequest(req, at)
	out := *v
	return &out
}

// setRequest records in v what its run was started with.
func (v *RunView) setRequest(req *client.RunRequest, at time.Time) {
	switch {
	case req.Workflow != nil:
		v.Kind = string(run.KindWorkflow)
		v.Title = req.Workflow.WorkflowName
	case req.Action != nil:
		v.Kind, v.Title = string(run.KindExec), req.Action.Name
	default:
		v.Kind, v.Title = string(run.KindAgent), req.Prompt
	}
	v.UserID = req.UserID
	if !at.IsZero() {
		v.StartedAt = at
	}
}

// Run returns a copy of a run's view.
func (x *Index) Run(runID string) (RunView, bool) {
	v, ok := x.runs[runID]
	if !ok {
		return RunView{}, false
	}
	return *v, true
}

// RunFilter selects runs of [Index.Runs]; zero fields match everything.
type RunFilter struct {
	Statuses []string
	Kinds    []string
	UserID   string
	// Limit bounds the list (youngest first); 0 means no bound.
	Limit int
}

func (f RunFilter) match(v *RunView) bool {
	return (len(f.Statuses) == 0 || slices.Contains(f.Statuses, v.Status)) &&
		(len(f.Kinds) == 0 || slices.Contains(f.Kinds, v.Kind)) &&
		(f.UserID == "" || f.UserID == v.UserID)
}

// Runs lists the runs f selects, youngest first.
func (x *Index) Runs(f RunFilter) []RunView {
	out := []RunView{}
	for _, v := range x.runs {
		if f.match(v) {
			out = append(out, *v)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].StartedAt.Equal(out[j].StartedAt) {
			return out[i].StartedAt.After(out[j].StartedAt)
		}
		return out[i].RunID > out[j].RunID
	})
	if f.Limit > 0 && len(out) > f.Limit {
		out = out[:f.Limit]
	}
	return out
}

// Approvals lists the pending approvals, oldest first.
func (x *Index) Approvals() []ApprovalView {
	out := []ApprovalView{}
	for _, a := range x.approvals {
		out = append(out, *a)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].RequestedAt.Equal(out[j].RequestedAt) {
			return out[i].RequestedAt.Before(out[j].RequestedAt)
		}
		return out[i].ApprovalID < out[j].ApprovalID
	})
	return out
}

// Approval returns a pending approval.
func (x *Index) Approval(id string) (ApprovalView, bool) {
	a, ok := x.approvals[id]
	if !ok {
		return ApprovalView{}, false
	}
	return *a, true
}

// evict drops the oldest ended runs beyond maxRuns; runs that have not
// ended are kept whatever their number (they hold pending approvals).
func (x *Index) evict() {
	if x.maxRuns <= 0 || len(x.runs) <= x.maxRuns {
		return
	}
	var ended []*RunView
	for _, v := range x.runs {
		if v.Ended() {
			ended = append(ended, v)
		}
	}
	sort.Slice(ended, func(i, j int) bool { return ended[i].UpdatedAt.Before(ended[j].UpdatedAt) })
	for _, v := range ended {
		if len(x.runs) <= x.maxRuns {
			return
		}
		delete(x.runs, v.RunID)
	}
}
