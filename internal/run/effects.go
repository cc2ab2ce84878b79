package run

import (
	"time"

	"github.com/actionbus/actionbus/events"
)

// EffectKind says what an [Effect] does.
type EffectKind string

// Effect kinds. Requests that carry what the state already holds (a
// decision request's observations, an action call's arguments) are
// references rendered from the state by [Render], so the outbox stored with
// the state never holds them twice.
const (
	// EffectEvent publishes a literal event (Type, Data).
	EffectEvent EffectKind = "event"
	// EffectStep publishes a progress step (Step).
	EffectStep EffectKind = "step"
	// EffectTimer arms a durable timer (Timer).
	EffectTimer EffectKind = "timer"
	// EffectDecide publishes the decision request of cycle Cycle.
	EffectDecide EffectKind = "decide"
	// EffectAct publishes the action request of call CallID.
	EffectAct EffectKind = "act"
	// EffectSynthesize publishes the synthesis request of part (Cycle,
	// Part, Index).
	EffectSynthesize EffectKind = "synthesize"
	// EffectApproval publishes the approval request ApprovalID.
	EffectApproval EffectKind = "approval"
	// EffectEnd publishes the run's terminal event.
	EffectEnd EffectKind = "end"
	// EffectRelease frees call CallID's slot of limit key Key (and its
	// place in the key's queue).
	EffectRelease EffectKind = "release"
	// EffectWake asks the dispatcher to wake the run (a [CapacityCheck])
	// at At. It is not stored: the capacity timer is its durable backstop.
	EffectWake EffectKind = "wake"
	// EffectProgress publishes the live steps of one transition (Steps)
	// as one run.progress event. [Progress] makes it when the effects are
	// published; it is never stored (the outbox holds the steps).
	EffectProgress EffectKind = "progress"
	// EffectSave publishes nothing: the state changed (the alarm fired
	// only stale timers, or events were applied without being stored:
	// [Saved]) and is to be written.
	EffectSave EffectKind = "save"
	// EffectArtifact asks the shell to store Artifact's bytes in the
	// artifact store before anything of the transition is stored or
	// published: the state it leaves holds the reference only. It is never
	// stored (the bytes would make the state large), and storing it again
	// is harmless (its id is derived).
	EffectArtifact EffectKind = "artifact"
	// EffectAcquire asks the shell for a slot of the limit of the call Ask
	// names, and to apply the answer at once ([CapacityAnswer]): the
	// transition goes on from there. It is never stored: the shell answers
	// before anything of the transition is stored or published.
	EffectAcquire EffectKind = "acquire"
)

// Effect is one thing a transition implies, stored with the new state (the
// outbox) until it is published. Its ID is the id of the event it
// publishes: deterministic, so publishing it again is harmless.
type Effect struct {
	Kind EffectKind `json:"kind"`
	ID   string     `json:"id"`
	// Type and Data are a literal event's.
	Type string `json:"type,omitempty"`
	Data any    `json:"data,omitempty"`
	// Step is a step's; Progress makes a step that is otherwise recorded
	// live only (an allowed call's policy evaluation, which its work item
	// carries to the audit trail).
	Step     *events.RunStep `json:"step,omitempty"`
	Progress bool            `json:"progress,omitempty"`
	// Steps are a progress event's ([EffectProgress]), in order.
	Steps []*events.RunStep `json:"steps,omitempty"`
	// Timer is a timer's.
	Timer *Timer `json:"timer,omitempty"`
	// Cycle, CallID, Part, Index and ApprovalID name what a reference
	// renders.
	Cycle      int    `json:"cycle,omitempty"`
	CallID     string `json:"callId,omitempty"`
	Part       string `json:"part,omitempty"`
	Index      int    `json:"index,omitempty"`
	ApprovalID string `json:"approvalId,omitempty"`
	// RunID, when set, is the run (of the same tenant) a step is
	// published for: the link a retry leaves on the run it retries.
	RunID string `json:"runId,omitempty"`
	// Key is a release's limit key; At a wake-up's time.
	Key string    `json:"key,omitempty"`
	At  time.Time `json:"at,omitempty"`
	// Artifact is an artifact's ([EffectArtifact]), Ask a capacity
	// request's ([EffectAcquire]); neither is ever stored.
	Artifact *ArtifactWrite `json:"-"`
	Ask      *CapacityAsk   `json:"-"`
}

// ArtifactWrite is an artifact the shell stores for a transition
// ([EffectArtifact]): Data under Ref.ID in the store Ref names, recorded
// as run RunID's of Tenant. Ref is what the state holds.
type ArtifactWrite struct {
	Tenant string
	RunID  string
	Ref    events.ArtifactRef
	Data   []byte
}

// Timer is a durable timer to arm: Fired is published on the run's timer
// subject at At (the schedule named Name replaces an earlier one of the
// same name). Stale timers are not canceled: a timer that fires for a
// stage the run has left changes nothing.
type Timer struct {
	Name  string            `json:"name"`
	At    time.Time         `json:"at"`
	Fired events.TimerFired `json:"fired"`
}

// live reports whether a step effect is progress (run.progress, live
// only) rather than a recorded run.step.
func (e Effect) live() bool { return e.Progress || !StepName(e.Step.Name).Recorded() }

// Progress folds the live steps of effects, taken in publishing order
// (after [WorkFirst]), into one [EffectProgress] effect carrying them in
// that order: a transition's progress crosses the server as one
// run.progress message. The event goes where the last of the steps was,
// so every step stays ahead of the stored events that followed the last
// of them (the run's end among them); a recorded step between two live
// ones is published ahead of both. Its id is derived from the steps' ids,
// so the same effects (an outbox published again) make the same event.
// A step published for another run (a retry's link) is left alone, as
// are effects with fewer than two live steps: a single live step becomes
// a progress event of one step when rendered ([Render]).
func Progress(st *State, effects []Effect) []Effect {
	var steps []*events.RunStep
	var ids []any
	last := -1
	for i, e := range effects {
		if e.foldable() {
			steps, ids, last = append(steps, e.Step), append(ids, e.ID), i
		}
	}
	if len(steps) < 2 {
		return effects
	}
	out := make([]Effect, 0, len(effects)-len(steps)+1)
	for i, e := range effects {
		switch {
		case i == last:
			out = append(out, Effect{Kind: EffectProgress, ID: st.derive(append([]any{"progress"}, ids...)...), Steps: steps})
		case !e.foldable():
			out = append(out, e)
		}
	}
	return out
}

// foldable reports whether e is a live step of its own run, which
// [Progress] folds into the transition's progress event.
func (e Effect) foldable() bool { return e.Kind == EffectStep && e.RunID == "" && e.live() }

// progressData is the data of a run.progress event carrying steps.
func progressData(runID string, steps []*events.RunStep) *events.RunProgress {
	p := &events.RunProgress{Version: events.ProgressVersion, RunID: runID, Steps: make([]events.RunStep, len(steps))}
	for i, s := range steps {
		p.Steps[i] = *s
	}
	return p
}

// Render returns the event an effect publishes, rendered from st, the
// state stored with it. ok is false for an effect that no longer applies
// (a reference to a request the run has moved past: its answer arrived,
// so it was published) and for timers, which the caller turns into a
// schedule.
func Render(st *State, e Effect) (em events.Emission, ok bool) {
	em = events.Emission{ID: e.ID, Tenant: st.TenantOrDefault(), RunID: st.RunID}
	if e.RunID != "" {
		em.RunID = e.RunID // a step linking another run of the tenant
	}
	switch e.Kind {
	case EffectEvent:
		em.Type, em.Data = e.Type, e.Data
	case EffectStep:
		em.Type, em.Data = events.TypeRunStep, e.Step
		if e.live() {
			em.Type, em.Data = events.TypeRunProgress, progressData(em.RunID, []*events.RunStep{e.Step})
		}
	case EffectProgress:
		em.Type, em.Data = events.TypeRunProgress, progressData(st.RunID, e.Steps)
	case EffectDecide:
		if st.Agent == nil || st.IsTerminal() || st.Phase != PhaseDeciding || st.Cycle != e.Cycle {
			return em, false
		}
		em.Type = events.TypeDecisionRequested
		em.Data = &events.DecisionRequested{RunID: st.RunID, Cycle: st.Cycle, Prompt: st.Agent.Prompt, Scenario: st.Agent.Scenario,
			Observations: st.Agent.Observations, Feedback: st.Agent.Feedback, Synthesize: st.Agent.Synthesize, Replay: st.Agent.Replay,
			Skill: skillContext(st.Agent.Skills), Workspace: workspaceView(st.Agent.Workspace), Hidden: st.Agent.Withhold,
			Budget: st.Budget, Used: st.usedIfBounded(), TenantBudget: st.TenantBudget}
		em.Ext = []events.Extension{{Name: events.ExtCycle, Value: st.Cycle}}
	case EffectAct:
		i := st.callIndex(e.CallID)
		if st.IsTerminal() || i < 0 || st.Calls[i].Done {
			return em, false
		}
		c := st.Calls[i]
		em.Type, em.Pool = events.TypeActionRequested, c.Pool
		em.Data = &events.ActionRequested{RunID: st.RunID, Tenant: st.TenantOrDefault(), CallID: c.CallID, Cycle: st.Cycle, PlanIndex: c.PlanIndex, Attempt: max(c.Attempt, 1),
			Action: c.Action, Args: nonNilArgs(c.Args), Origin: c.Origin, UserID: st.UserID, TimeoutMs: c.TimeoutMs,
			IdempotencyKey: c.IdempotencyKey, Approval: c.Approval, StepID: c.StepID, MaxAttempts: c.MaxAttempts}
		if c.Policy > 0 && c.Policy <= len(st.PolicySnapshots) {
			em.Data.(*events.ActionRequested).Policy = st.PolicySnapshots[c.Policy-1]
		}
		em.Ext = []events.Extension{{Name: events.ExtCycle, Value: st.Cycle}, {Name: events.ExtPlanIndex, Value: c.PlanIndex},
			{Name: events.ExtAttempt, Value: max(c.Attempt, 1)}, {Name: events.ExtPool, Value: c.Pool}}
	case EffectSynthesize:
		if st.Agent == nil || st.IsTerminal() || st.Phase != PhaseSynthesizing || st.Agent.Synthesis == nil || st.Cycle != e.Cycle {
			return em, false
		}
		p := st.Agent.Synthesis.part(e.Part, e.Index)
		if p == nil || p.Done {
			return em, false
		}
		em.Type, em.Data = events.TypeSynthesisRequested, synthesisRequest(st, *p)
		em.Ext = []events.Extension{{Name: events.ExtCycle, Value: st.Cycle}}
	case EffectApproval:
		p, pending := st.Approvals[e.ApprovalID]
		if !pending || st.IsTerminal() || p.CallIndex < 0 || p.CallIndex >= len(st.Calls) {
			return em, false
		}
		em.Type = events.TypeApprovalRequested
		em.Data = &events.ApprovalRequested{RunID: st.RunID, Context: p.Context, Input: nonNilArgs(st.Calls[p.CallIndex].Args), Reason: p.Reason}
	case EffectEnd:
		if !st.IsTerminal() {
			return em, false
		}
		em.Type, em.Data = terminalEvent(st)
	default:
		return em, false
	}
	return em, true
}

func terminalEvent(st *State) (string, any) {
	t := st.Terminal
	switch t.Type {
	case events.TypeRunCompleted:
		return t.Type, &events.RunCompleted{RunID: st.RunID, Answer: t.Answer, Output: t.Output, Citations: t.Citations, Cycles: st.Cycle, Usage: st.Usage}
	case events.TypeRunCanceled:
		return t.Type, &events.RunCanceled{RunID: st.RunID, Reason: t.Reason, Cycles: st.Cycle, Usage: st.Usage}
	}
	return events.TypeRunFailed, &events.RunFailed{RunID: st.RunID, Error: *t.Error, Cycles: st.Cycle, Usage: st.Usage}
}

func decideEffect(st *State) Effect {
	return Effect{Kind: EffectDecide, ID: st.derive("decide", st.Cycle), Cycle: st.Cycle}
}

func actEffect(c CallState) Effect {
	return Effect{Kind: EffectAct, ID: c.CallID, CallID: c.CallID}
}

func synthesizeEffect(st *State, p SynthesisPart) Effect {
	return Effect{Kind: EffectSynthesize, ID: st.derive("synthesize", st.Cycle, p.Part, p.Index), Cycle: st.Cycle, Part: p.Part, Index: p.Index}
}

func releaseEffect(st *State, c CallState) Effect {
	return Effect{Kind: EffectRelease, ID: st.derive("release", c.CallID), CallID: c.CallID, Key: c.LimitKey}
}

func wakeEffect(st *State, at time.Time) Effect {
	return Effect{Kind: EffectWake, ID: st.derive("wake", at.UnixNano()), At: at}
}

// Stored returns the effects that go into the outbox with the state, and
// the wake-ups, which do not (a transition that only implies wake-ups
// changes nothing worth storing).
func Stored(effects []Effect) (stored, wakes []Effect) {
	for _, e := range effects {
		if e.Kind == EffectWake {
			wakes = append(wakes, e)
		} else {
			stored = append(stored, e)
		}
	}
	return stored, wakes
}

// LiveOnly reports whether effects are all progress steps: live events,
// which no one recovers from the stream, so publishing them needs no
// stored state. A transition that implies nothing else (a result of a
// plan or workflow whose other calls are still out) changes the state
// without changing what the run waits for.
func LiveOnly(effects []Effect) bool {
	for _, e := range effects {
		if e.Kind != EffectStep || !e.live() {
			return false
		}
	}
	return len(effects) > 0
}

// Saved is the effect of writing st as it is: events applied to it
// changed it without implying anything to publish yet (a held state, see
// [LiveOnly]).
func Saved(st *State, now time.Time) Effect {
	return Effect{Kind: EffectSave, ID: st.derive("saved", now.UnixNano())}
}

// EndID is the id of the run's terminal event: one per run, whichever
// way it ends, so its stream keeps one within its duplicate window.
func EndID(st *State) string { return endEffect(st).ID }

func endEffect(st *State) Effect {
	return Effect{Kind: EffectEnd, ID: st.derive("terminal")}
}

// Dedupe drops effects with an id already in the list (the same event
// implied twice, e.g. an outbox entry implied again), keeping the first.
func Dedupe(out []Effect) []Effect {
	seen := make(map[string]bool, len(out))
	kept := out[:0]
	for _, e := range out {
		if !seen[e.ID] {
			seen[e.ID] = true
			kept = append(kept, e)
		}
	}
	return kept
}

func nonNilArgs(a map[string]any) map[string]any {
	if a == nil {
		return map[string]any{}
	}
	return a
}

func step(st *State, name StepName, planIndex *int, action, message, status string) Effect {
	return stepWith(st, name, planIndex, action, message, status, nil)
}

func stepWith(st *State, name StepName, planIndex *int, action, message, status string, details map[string]any) Effect {
	// Steps are numbered in the run state, so each step has its own id
	// (a retried workflow step repeats names) and a transition recomputed
	// from the same stored state derives the same ids.
	st.StepSeq++
	return Effect{Kind: EffectStep, ID: st.derive("step", st.StepSeq),
		Step: &events.RunStep{RunID: st.RunID, Name: string(name), Cycle: st.Cycle, PlanIndex: planIndex, Action: action,
			Message: message, Status: status, Details: details}}
}

// timer arms a durable timer after the given duration (the run deadline
// timer: at the run's deadline). f names what the timer is for; the run id
// and cycle are filled in. Schedules with the same name replace each
// other, so a run has at most one pending timer per name.
func (m *Machine) timer(st *State, f events.TimerFired, name string, after time.Duration) Effect {
	at := m.env.Now().Add(after)
	if f.Kind == events.TimerRunDeadline {
		at = st.Deadline
	}
	f.RunID, f.Cycle = st.RunID, st.Cycle
	// The id names what the timer is for (the call, approval and step
	// attempt differ), so a timer of a later attempt is not mistaken for a
	// duplicate of an earlier one.
	id := st.derive("timer", name, st.Cycle, f.CallID+f.ApprovalID+f.StepID)
	return Effect{Kind: EffectTimer, ID: id, Timer: &Timer{Name: name, At: at, Fired: f}}
}

// WorkFirst orders effects for publishing: a request that hands work to
// another service (an action, decision or synthesis request) goes out
// ahead of the live progress and timer schedules before it, so that the
// work starts while the rest is still being rendered and published.
// Everything else keeps its order: events that are stored
// (recorded steps, approvals, the run's end; the audit trail records them
// in the order they were stored) stay in order with the requests and
// after what preceded them, and live progress stays ahead of the stored
// events that followed it, so that a follower sees every step before the
// run's end.
func WorkFirst(effects []Effect) []Effect {
	out := make([]Effect, 0, len(effects))
	var deferred []Effect // live progress and timers waiting for the next stored event
	for _, e := range effects {
		switch {
		case e.handsOutWork():
			out = append(out, e)
		case e.deferrable():
			deferred = append(deferred, e)
		default:
			out = append(append(out, deferred...), e)
			deferred = deferred[:0]
		}
	}
	return append(out, deferred...)
}

// LeadingWork splits effects, in the order [WorkFirst] publishes them,
// into the requests other services work on that go out first (calls,
// decisions, syntheses ahead of every stored event) and the rest. An
// admission hands that work out while its state is written: the order
// in which its events are stored is the same.
func LeadingWork(effects []Effect) (work, rest []Effect) {
	ordered := WorkFirst(effects)
	i := 0
	for i < len(ordered) && ordered[i].handsOutWork() {
		i++
	}
	return ordered[:i:i], ordered[i:]
}

// handsOutWork reports whether e is a request another service works on.
func (e Effect) handsOutWork() bool {
	return e.Kind == EffectAct || e.Kind == EffectDecide || e.Kind == EffectSynthesize
}

// deferrable reports whether e may be published after a work request that
// followed it: live progress (which nothing stores) and timer schedules
// (which only the dispatcher reads, when they fire).
func (e Effect) deferrable() bool {
	switch e.Kind {
	case EffectStep:
		return e.live()
	case EffectTimer:
		return true
	case EffectEvent:
		entry, ok := events.Lookup(e.Type)
		return ok && entry.Live
	}
	return false
}
