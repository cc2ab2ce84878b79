package run

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/policy"
)

// approvalID names the approval of a call: the run id, the cycle and the
// plan index, so an approver can find the run from the id alone, and the
// attempt from the second on ("<runId>-<cycle>-<index>-<attempt>"): a
// retried step needs an approval of its own, which an answered approval
// id would refuse as a replay.
func approvalID(runID string, cycle, planIndex, attempt int) string {
	if attempt > 1 {
		return fmt.Sprintf("%s-%d-%d-%d", runID, cycle, planIndex, attempt)
	}
	return fmt.Sprintf("%s-%d-%d", runID, cycle, planIndex)
}

// requestApproval holds a call and asks for its approval.
func (m *Machine) requestApproval(st *State, i int, snap policy.Snapshot) []Effect {
	c := &st.Calls[i]
	// Arguments are decoded JSON, so they always hash.
	hash, _ := policy.InputHash(c.Args)
	ctx := events.ApprovalContext{
		ApprovalID: approvalID(st.RunID, st.Cycle, c.PlanIndex, c.Attempt), RunID: st.RunID, StepID: c.CallID,
		UserID: st.UserID, Action: c.Action, InputHash: hash,
		ExpiresAt: m.env.Now().Add(m.lim.ApprovalTTL).UTC().Truncate(time.Second),
	}
	if d, ok := matchDryRun(st.DryRuns, c.Args); ok {
		ctx.DryRunHash, ctx.DryRunAction, ctx.DryRunMatches = d.InputHash, d.Action, true
	}
	if ids, ok := c.Args["resourceIds"].([]any); ok {
		for _, id := range ids {
			if s, ok := id.(string); ok {
				ctx.ResourceIDs = append(ctx.ResourceIDs, s)
			}
		}
	}
	c.NeedsApproval = true
	if st.Approvals == nil {
		st.Approvals = map[string]*PendingApproval{}
	}
	st.Approvals[ctx.ApprovalID] = &PendingApproval{Context: ctx, CallIndex: i, Reason: snap.Reason}
	if st.Workflow == nil {
		st.Phase = PhaseAwaitingApproval // a workflow's other steps go on
	}
	st.Status = StatusAwaitingApproval
	pi := c.PlanIndex
	t := m.timer(st, events.TimerFired{Kind: events.TimerApproval, ApprovalID: ctx.ApprovalID, Stage: "approval " + ctx.ApprovalID},
		fmt.Sprintf("appr%d", c.PlanIndex), m.lim.ApprovalTTL)
	// The request goes out before the step that announces it, so whoever
	// reacts to the step finds the request stored.
	return []Effect{
		{Kind: EffectApproval, ID: st.derive("approval", ctx.ApprovalID), ApprovalID: ctx.ApprovalID},
		stepWith(st, StepAwaitingApproval, &pi, c.Action, ctx.ApprovalID, "", map[string]any{"approvalId": ctx.ApprovalID, "reason": snap.Reason}),
		t,
	}
}

func toPolicyContext(c events.ApprovalContext) policy.ApprovalContext {
	return policy.ApprovalContext(c)
}

// resolved is the dispatcher's answer to a grant or denial with event id
// answerID, published on the approval subject for the approver who sent it.
func resolved(st *State, approvalID, answerID, outcome, approver string, err *actionbus.Error) Effect {
	return Effect{Kind: EffectEvent, Type: events.TypeApprovalResolved, ID: st.derive("approval-resolved", answerID),
		Data: &events.ApprovalResolved{RunID: st.RunID, ApprovalID: approvalID, AnswerID: answerID, Outcome: outcome, Approver: approver, Error: err}}
}

func (m *Machine) onApprovalGranted(ctx context.Context, st *State, g *events.ApprovalGranted, answerID string) []Effect {
	refuse := func(err *actionbus.Error) []Effect {
		err = err.WithDetail("approvalId", g.ApprovalID)
		return []Effect{stepWith(st, StepApprovalRefused, nil, "", err.Error(), "failed",
			map[string]any{"approvalId": g.ApprovalID, "code": string(err.Code)}),
			resolved(st, g.ApprovalID, answerID, events.ApprovalOutcomeRefused, g.Approver, err)}
	}
	// A late or replayed grant is refused, and recorded, even after the
	// run ended.
	if slices.Contains(st.ApprovalsExpired, g.ApprovalID) {
		return refuse(actionbus.Errorf(actionbus.CodeApprovalExpired, "approval %s expired before it was granted", g.ApprovalID))
	}
	if slices.Contains(st.ApprovalsDone, g.ApprovalID) {
		return refuse(actionbus.Errorf(actionbus.CodeApprovalReplayed, "approval %s was already answered", g.ApprovalID))
	}
	p, ok := st.Approvals[g.ApprovalID]
	if !ok || st.IsTerminal() {
		return refuse(actionbus.Errorf(actionbus.CodeApprovalInvalid, "no pending approval %s", g.ApprovalID))
	}
	approver, err := m.env.VerifyApproval(g.Token, toPolicyContext(p.Context), g.Approver, m.env.Now())
	if err != nil {
		var abErr *actionbus.Error
		if errors.As(err, &abErr) && abErr.Code == actionbus.CodeApprovalExpired {
			delete(st.Approvals, g.ApprovalID)
			st.ApprovalsExpired = append(st.ApprovalsExpired, g.ApprovalID)
			abErr = abErr.WithDetail("approvalId", g.ApprovalID)
			return append([]Effect{resolved(st, g.ApprovalID, answerID, events.ApprovalOutcomeRefused, g.Approver, abErr)}, m.fail(st, abErr)...)
		}
		if !errors.As(err, &abErr) {
			abErr = &actionbus.Error{Code: actionbus.CodeApprovalInvalid, Message: err.Error()}
		}
		return refuse(m.mismatch(g, p.Context, abErr))
	}
	delete(st.Approvals, g.ApprovalID)
	st.ApprovalsDone = append(st.ApprovalsDone, g.ApprovalID)
	c := &st.Calls[p.CallIndex]
	c.NeedsApproval = false
	c.Approval = &events.ApprovalGrant{Context: p.Context, Token: g.Token, Approver: approver}
	pi := c.PlanIndex
	out := []Effect{stepWith(st, StepApprovalGranted, &pi, c.Action, "approved by "+approver, "ok", map[string]any{"approvalId": g.ApprovalID, "approver": approver}),
		resolved(st, g.ApprovalID, answerID, events.ApprovalOutcomeGranted, approver, nil)}
	if len(st.Approvals) == 0 {
		st.Phase, st.Status = PhaseActing, StatusRunning
	}
	if st.Workflow != nil {
		st.Workflow.Steps[p.CallIndex].Status = StepStatusReady
	}
	return append(out, m.dispatchMore(st)...)
}

// mismatch names why a grant's token did not verify over the stored
// context, from the context the grant says it signs: the stored context
// itself (the token's secret is wrong: a bad signature), or another one
// over which the token verifies (a context mismatch, naming the fields
// that differ). Any other refusal, and one whose grant names no context,
// is returned as it is.
func (m *Machine) mismatch(g *events.ApprovalGranted, stored events.ApprovalContext, refusal *actionbus.Error) *actionbus.Error {
	if g.Context == nil || refusal.Details[policy.MismatchDetail] != policy.MismatchSignature {
		return refusal
	}
	kid, _, _ := strings.Cut(g.Token, ".")
	diff := policy.ContextDiff(toPolicyContext(*g.Context), toPolicyContext(stored))
	if len(diff) == 0 {
		return actionbus.Errorf(actionbus.CodeApprovalInvalid,
			"bad signature: the approval token does not verify with key %q over approval %s's context (the secret it was signed with is not the key's)", kid, g.ApprovalID).
			WithDetail(policy.MismatchDetail, policy.MismatchBadSignature)
	}
	_, err := m.env.VerifyApproval(g.Token, toPolicyContext(*g.Context), g.Approver, m.env.Now())
	if err == nil || actionbus.CodeOf(err) == actionbus.CodeApprovalExpired {
		return actionbus.Errorf(actionbus.CodeApprovalInvalid,
			"approval token does not match the approval context: it signs a context that differs from approval %s's in %s", g.ApprovalID, strings.Join(diff, ", ")).
			WithDetail(policy.MismatchDetail, policy.MismatchContext).WithDetail("fields", diff)
	}
	return actionbus.Errorf(actionbus.CodeApprovalInvalid,
		"bad signature: the approval token does not verify with key %q over approval %s's context, nor over the context it names (which differs in %s)", kid, g.ApprovalID, strings.Join(diff, ", ")).
		WithDetail(policy.MismatchDetail, policy.MismatchBadSignature)
}

func (m *Machine) onApprovalDenied(st *State, dn *events.ApprovalDenied, answerID string) []Effect {
	if _, ok := st.Approvals[dn.ApprovalID]; !ok || st.IsTerminal() {
		code, msg := actionbus.CodeApprovalInvalid, "no pending approval "+dn.ApprovalID
		switch {
		case slices.Contains(st.ApprovalsExpired, dn.ApprovalID):
			code, msg = actionbus.CodeApprovalExpired, "approval "+dn.ApprovalID+" already expired"
		case slices.Contains(st.ApprovalsDone, dn.ApprovalID):
			code, msg = actionbus.CodeApprovalReplayed, "approval "+dn.ApprovalID+" was already answered"
		}
		err := (&actionbus.Error{Code: code, Message: msg}).WithDetail("approvalId", dn.ApprovalID)
		return []Effect{resolved(st, dn.ApprovalID, answerID, events.ApprovalOutcomeRefused, dn.Approver, err)}
	}
	approver, verr := m.env.VerifyDenial(dn.Token, dn.ApprovalID, dn.Reason, dn.Approver)
	if verr != nil {
		var abErr *actionbus.Error
		if !errors.As(verr, &abErr) {
			abErr = &actionbus.Error{Code: actionbus.CodeApprovalInvalid, Message: verr.Error()}
		}
		abErr = abErr.WithDetail("approvalId", dn.ApprovalID)
		return []Effect{stepWith(st, StepApprovalRefused, nil, "", abErr.Error(), "failed",
			map[string]any{"approvalId": dn.ApprovalID, "code": string(abErr.Code)}),
			resolved(st, dn.ApprovalID, answerID, events.ApprovalOutcomeRefused, dn.Approver, abErr)}
	}
	delete(st.Approvals, dn.ApprovalID)
	st.ApprovalsDone = append(st.ApprovalsDone, dn.ApprovalID)
	err := actionbus.Errorf(actionbus.CodeApprovalDenied, "approval %s denied by %s: %s", dn.ApprovalID, approver, dn.Reason).
		WithDetail("approvalId", dn.ApprovalID).WithDetail("approver", approver)
	return append([]Effect{step(st, StepApprovalDenied, nil, "", err.Message, "failed"),
		resolved(st, dn.ApprovalID, answerID, events.ApprovalOutcomeDenied, approver, nil)}, m.fail(st, err)...)
}

// MaxDryRuns bounds the dry runs a run remembers (the newest are kept).
const MaxDryRuns = 32

// DryRun is a successful dryRun call: its action and the stable hash of
// its input.
type DryRun struct {
	Action    string `json:"action"`
	InputHash string `json:"inputHash"`
}

// recordDryRun adds d as the newest dry run (moved there if it was already
// recorded) and keeps at most MaxDryRuns.
func recordDryRun(runs []DryRun, d DryRun) []DryRun {
	runs = slices.DeleteFunc(slices.Clone(runs), func(r DryRun) bool { return r == d })
	runs = append(runs, d)
	if len(runs) > MaxDryRuns {
		runs = runs[len(runs)-MaxDryRuns:]
	}
	return runs
}

// dryRunHashKey is the input key by which a mutation names the dry run it
// follows.
const dryRunHashKey = "dryRunHash"

// matchDryRun finds the dry run an approval of a call with input args is
// bound to: the newest whose input is args without its dryRunHash key.
// When args names a dryRunHash, it must be that dry run's hash. A model
// that dry-runs {jobIds: [A]} and asks to run {jobIds: [A, B, C],
// dryRunHash: H(A)} matches nothing.
func matchDryRun(runs []DryRun, args map[string]any) (DryRun, bool) {
	rest := make(map[string]any, len(args))
	for k, v := range args {
		if k != dryRunHashKey {
			rest[k] = v
		}
	}
	hash, err := policy.InputHash(rest)
	if err != nil {
		return DryRun{}, false
	}
	named, hasNamed := args[dryRunHashKey]
	for i := len(runs) - 1; i >= 0; i-- {
		if runs[i].InputHash != hash {
			continue
		}
		if hasNamed && named != runs[i].InputHash {
			return DryRun{}, false
		}
		return runs[i], true
	}
	return DryRun{}, false
}
