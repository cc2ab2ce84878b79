package run

import "errors"

// ErrAhead is [Machine.Apply]'s answer to an event that answers what st
// has not asked yet: a result of a call st derives but has not handed
// out, a decision of a cycle st has not reached. It happens when a
// dispatcher handed out a transition's work without writing its state
// (a held transition) and died: the events it held come again, in any
// order, and one may come before the event whose transition asked for
// it. The event changed nothing; applied after that transition, it
// counts. A stale event (a duplicate, an answer to an earlier cycle or
// attempt) is no error: it changes nothing, ever.
var ErrAhead = errors.New("run: the event answers a transition not applied yet")

// callAt is where a result says its call was made: the cycle, the index
// in its plan (a workflow's step) and the attempt.
type callAt struct{ cycle, planIndex, attempt int }

// resultAhead reports whether r is the result of a call st would make but
// has not handed out: its id is the one st derives for where r says the
// call was made (so no executor can name a call a run has not made), and
// st has not dispatched that call — it waits in the plan for a place, or
// is made by a decision or a step st has not reached. A call waiting for
// its approval is not ahead: its grant is never held (only results and
// decisions are), so its result can only be a stale one.
func (st *State) resultAhead(r result) bool {
	if r.callID != st.derive("call", r.at.cycle, r.at.planIndex, max(r.at.attempt, 1)) {
		return false
	}
	if i := st.callIndex(r.callID); i >= 0 {
		c := st.Calls[i]
		return !c.Dispatched && !c.Done && !c.NeedsApproval
	}
	if r.at.cycle != st.Cycle {
		return r.at.cycle > st.Cycle
	}
	if wf := st.Workflow; wf != nil {
		if r.at.planIndex < 0 || r.at.planIndex >= len(wf.Steps) {
			return false
		}
		s := wf.Steps[r.at.planIndex]
		return s.Status == StepStatusPending || max(r.at.attempt, 1) > max(s.Attempt, 1)
	}
	// A call of this cycle st does not know: the decision that makes it
	// is not applied yet.
	return st.Agent != nil && st.Phase == PhaseDeciding
}
