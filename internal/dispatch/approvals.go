package dispatch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/events"
	"github.com/actionbus/actionbus/internal/policy"
)

// PolicyKey is the key of the policy document in the policy bucket.
const PolicyKey = "config"

// watchPolicy follows the policy bucket: a valid document under PolicyKey
// replaces the running policy configuration at once; an invalid one is
// logged and ignored (the previous policy stays in force).
func (d *Dispatcher) watchPolicy(ctx context.Context) error {
	kv, err := d.js.KeyValue(ctx, d.topo.BucketPolicy())
	if err != nil {
		return fmt.Errorf("dispatch: policy bucket: %w", err)
	}
	w, err := kv.Watch(ctx, PolicyKey)
	if err != nil {
		return fmt.Errorf("dispatch: watch policy: %w", err)
	}
	go func() {
		defer w.Stop() //nolint:errcheck // best effort
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil {
					continue
				}
				if e.Operation() != jetstream.KeyValuePut {
					d.policy.Store(&policy.Evaluator{Config: d.cfg.Policy, Extra: d.cfg.ExtraPolicies})
					d.log.Info("policy reset to the configured one")
					continue
				}
				cfg, err := policy.ParseConfig(e.Value())
				if err != nil {
					d.log.Error("policy document refused; the previous policy stays in force", "revision", e.Revision(), "err", err)
					continue
				}
				d.policy.Store(&policy.Evaluator{Config: cfg, Extra: d.cfg.ExtraPolicies})
				d.log.Info("policy reloaded", "revision", e.Revision())
			}
		}
	}()
	return nil
}

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
func (d *Dispatcher) requestApproval(st *RunState, i int, snap policy.Snapshot) ([]emission, error) {
	c := &st.Calls[i]
	hash, err := policy.InputHash(c.Args)
	if err != nil {
		return nil, err
	}
	ctx := events.ApprovalContext{
		ApprovalID: approvalID(st.RunID, st.Cycle, c.PlanIndex, c.Attempt), RunID: st.RunID, StepID: c.CallID,
		UserID: st.UserID, Action: c.Action, InputHash: hash, DryRunHash: st.DryRunHash,
		ExpiresAt: time.Now().Add(d.cfg.ApprovalTTL).UTC().Truncate(time.Second),
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
	st.Approvals[ctx.ApprovalID] = &PendingApproval{Context: ctx, CallIndex: i}
	if st.Workflow == nil {
		st.Phase = PhaseAwaitingApproval // a workflow's other steps go on
	}
	st.Status = StatusAwaitingApproval
	pi := c.PlanIndex
	t := d.timer(st, events.TimerApproval, fmt.Sprintf("appr%d", c.PlanIndex), ctx.ApprovalID, "approval "+ctx.ApprovalID, d.cfg.ApprovalTTL)
	// The request goes out before the step that announces it, so whoever
	// reacts to the step finds the request stored.
	return []emission{
		{typ: events.TypeApprovalRequested, id: st.derive("approval", ctx.ApprovalID),
			data: &events.ApprovalRequested{RunID: st.RunID, Context: ctx, Input: nonNilArgs(c.Args), Reason: snap.Reason}},
		stepWith(st, "awaiting-approval", &pi, c.Action, ctx.ApprovalID, "", map[string]any{"approvalId": ctx.ApprovalID, "reason": snap.Reason}),
		t,
	}, nil
}

func toPolicyContext(c events.ApprovalContext) policy.ApprovalContext {
	return policy.ApprovalContext(c)
}

// resolved is the dispatcher's answer to a grant or denial with event id
// answerID, published on the approval subject for the approver who sent it.
func resolved(st *RunState, approvalID, answerID, outcome, approver string, err *actionbus.Error) emission {
	return emission{typ: events.TypeApprovalResolved, id: st.derive("approval-resolved", answerID),
		data: &events.ApprovalResolved{RunID: st.RunID, ApprovalID: approvalID, AnswerID: answerID, Outcome: outcome, Approver: approver, Error: err}}
}

func (d *Dispatcher) onApprovalGranted(st *RunState, g *events.ApprovalGranted, answerID string) []emission {
	refuse := func(err *actionbus.Error) []emission {
		err = err.WithDetail("approvalId", g.ApprovalID)
		return []emission{stepWith(st, "approval-refused", nil, "", err.Error(), "failed",
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
	if err := d.cfg.ApprovalKeys.Verify(g.Token, toPolicyContext(p.Context), time.Now()); err != nil {
		var abErr *actionbus.Error
		if errors.As(err, &abErr) && abErr.Code == actionbus.CodeApprovalExpired {
			delete(st.Approvals, g.ApprovalID)
			st.ApprovalsExpired = append(st.ApprovalsExpired, g.ApprovalID)
			abErr = abErr.WithDetail("approvalId", g.ApprovalID)
			return append([]emission{resolved(st, g.ApprovalID, answerID, events.ApprovalOutcomeRefused, g.Approver, abErr)}, d.fail(st, abErr)...)
		}
		if !errors.As(err, &abErr) {
			abErr = &actionbus.Error{Code: actionbus.CodeApprovalInvalid, Message: err.Error()}
		}
		return refuse(abErr)
	}
	delete(st.Approvals, g.ApprovalID)
	st.ApprovalsDone = append(st.ApprovalsDone, g.ApprovalID)
	c := &st.Calls[p.CallIndex]
	c.NeedsApproval = false
	c.Approval = &events.ApprovalGrant{Context: p.Context, Token: g.Token, Approver: g.Approver}
	pi := c.PlanIndex
	out := []emission{stepWith(st, "approval-granted", &pi, c.Action, "approved by "+g.Approver, "ok", map[string]any{"approvalId": g.ApprovalID}),
		resolved(st, g.ApprovalID, answerID, events.ApprovalOutcomeGranted, g.Approver, nil)}
	if len(st.Approvals) == 0 {
		st.Phase, st.Status = PhaseActing, StatusRunning
	}
	if st.Workflow != nil {
		st.Workflow.Steps[p.CallIndex].Status = StepReady
	}
	return append(out, d.dispatchMore(st)...)
}

func (d *Dispatcher) onApprovalDenied(st *RunState, dn *events.ApprovalDenied, answerID string) []emission {
	if _, ok := st.Approvals[dn.ApprovalID]; !ok || st.IsTerminal() {
		code, msg := actionbus.CodeApprovalInvalid, "no pending approval "+dn.ApprovalID
		switch {
		case slices.Contains(st.ApprovalsExpired, dn.ApprovalID):
			code, msg = actionbus.CodeApprovalExpired, "approval "+dn.ApprovalID+" already expired"
		case slices.Contains(st.ApprovalsDone, dn.ApprovalID):
			code, msg = actionbus.CodeApprovalReplayed, "approval "+dn.ApprovalID+" was already answered"
		}
		err := (&actionbus.Error{Code: code, Message: msg}).WithDetail("approvalId", dn.ApprovalID)
		return []emission{resolved(st, dn.ApprovalID, answerID, events.ApprovalOutcomeRefused, dn.Approver, err)}
	}
	delete(st.Approvals, dn.ApprovalID)
	st.ApprovalsDone = append(st.ApprovalsDone, dn.ApprovalID)
	err := actionbus.Errorf(actionbus.CodeApprovalDenied, "approval %s denied by %s: %s", dn.ApprovalID, dn.Approver, dn.Reason).
		WithDetail("approvalId", dn.ApprovalID).WithDetail("approver", dn.Approver)
	return append([]emission{step(st, "approval-denied", nil, "", err.Message, "failed"),
		resolved(st, dn.ApprovalID, answerID, events.ApprovalOutcomeDenied, dn.Approver, nil)}, d.fail(st, err)...)
}
