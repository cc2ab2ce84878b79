// Package run is the run as a state machine: a run's state (a common
// header plus the parts of its kind — agent, exec or workflow) and one
// transition, [Machine.Apply], that takes the state and one event and
// returns the effects the new state implies: events to publish, durable
// timers to arm, progress steps.
//
// The package does no I/O of its own. What a transition needs to know of
// the world — the action catalog, the policy in force, approval keys, the
// clock — comes through [Env], a small interface the dispatcher implements
// over JetStream and tests implement in memory. What it asks the world to
// do is an effect: besides events to publish, an artifact to store
// ([EffectArtifact]) and a slot to ask of a call's limit
// ([EffectAcquire]), which the shell carries out before anything else of
// the transition ([Machine.Settle]). Storing the state with its effects
// (the outbox) and publishing them is the dispatcher's job.
//
// Ids are deterministic: every event a transition implies has an id derived
// from the run's secret id key and the state, so a transition recomputed
// from the same stored state, or an outbox republished after a crash,
// produces the same ids and JetStream drops the copies.
package run

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/skills"
	"github.com/actionbus/actionbus/internal/workspace"
)

// Env is what a transition asks of the world.
type Env interface {
	// Action returns the catalog entry of the named action, or an error
	// wrapping actionbus.ErrActionNotFound.
	Action(ctx context.Context, name string) (*actions.Entry, error)
	// Checker returns the argument checker of a catalog entry.
	Checker(e *actions.Entry) (*actions.ArgsChecker, error)
	// Evaluate judges one call by the policy in force.
	Evaluate(ctx context.Context, r policy.Request) policy.Snapshot
	// VerifyApproval checks an approval token against the context it must
	// sign, at time now, and returns the approver it authenticates
	// (claimed is the name the grant carries).
	VerifyApproval(token string, c policy.ApprovalContext, claimed string, now time.Time) (string, error)
	// VerifyDenial checks a denial's token and returns the approver it
	// authenticates.
	VerifyDenial(token, approvalID, reason, claimed string) (string, error)
	// VerifyPrincipal checks a gateway's signed statement of the user a
	// run acts for.
	VerifyPrincipal(token string, c policy.PrincipalClaim, now time.Time) (policy.Principal, error)
	// GetArtifact reads an artifact as tenant reads it: one recorded for
	// another tenant is artifact_not_found, bytes that do not match the
	// reference's SHA-256 artifact_mismatch.
	GetArtifact(ctx context.Context, tenant string, ref events.ArtifactRef) ([]byte, error)
	// PriorRun returns the stored state of another run of tenant (the one
	// a retry names), or nil when there is none: another tenant's run is
	// none, answered as fast as a missing one (no timing tells them
	// apart).
	PriorRun(ctx context.Context, tenant, runID string) (*State, error)
	// ClaimRetry records on the stored state of the ended run priorID that
	// run retryID retries it, unless another run already does, and returns
	// the run that does (retryID when the claim is this run's, or already
	// was). The write is revision-checked: of two retries admitted at once,
	// one claims the run and the other learns of it.
	ClaimRetry(ctx context.Context, priorID, retryID string) (string, error)
	// Skill returns the named skill of the catalog, or an error with
	// code skill_not_found; Skills lists every skill.
	Skill(ctx context.Context, name string) (*skills.Skill, error)
	Skills(ctx context.Context) ([]skills.Skill, error)
	// Now is the clock.
	Now() time.Time
}

// Machine applies events to runs. It holds no run state: one Machine
// serves every run, from any goroutine.
type Machine struct {
	env           Env
	lim           events.RunLimits
	artifactStore string
}

// Config configures a [Machine].
type Config struct {
	// Limits bound every run; New fills the defaults (events.RunLimits).
	Limits events.RunLimits
	// ArtifactStore names the object store the shell stores the machine's
	// artifacts in ([EffectArtifact]); the references the state keeps
	// name it. "" is the services' store of references written before
	// stores were per pool.
	ArtifactStore string
}

// New returns a machine over env.
func New(env Env, cfg Config) *Machine {
	cfg.Limits.SetDefaults()
	return &Machine{env: env, lim: cfg.Limits, artifactStore: cfg.ArtifactStore}
}

// Event is one event applied to a run: its id and its decoded data, one of
// the per-run event types the dispatcher consumes (*events.DecisionMade,
// *events.ActionCompleted, *events.ActionFailed, *events.CancelRequested,
// *events.InputProvided, *events.ApprovalGranted, *events.ApprovalDenied,
// *events.SynthesisCompleted, *events.TimerFired).
type Event struct {
	ID   string
	Data any
}

// Apply applies one event to st and returns the effects of the change. It
// returns no effects exactly when the event changed nothing (a duplicate,
// a stale answer, an event of an ended run). [ErrAhead] means the event
// answers what a transition not yet applied to st asks (see [ErrAhead]):
// st is unchanged and the event is to be applied after that transition.
// Any other error means the world could not be asked (the catalog could
// not be read): nothing is decided and the event is to be retried.
func (m *Machine) Apply(ctx context.Context, st *State, ev Event) ([]Effect, error) {
	switch data := ev.Data.(type) {
	case *events.DecisionMade:
		return m.onDecision(ctx, st, data)
	case *events.ActionCompleted:
		return m.onResult(ctx, st, result{callID: data.CallID, executor: data.Executor, ok: true, output: data.Output,
			summary: data.Summary, complete: data.Complete, at: callAt{data.Cycle, data.PlanIndex, data.Attempt}})
	case *events.ActionFailed:
		errCopy := data.Error
		return m.onResult(ctx, st, result{callID: data.CallID, executor: data.Executor, err: &errCopy,
			at: callAt{data.Cycle, data.PlanIndex, data.Attempt}})
	case *events.CancelRequested:
		return m.onCancel(st, data), nil
	case *events.InputProvided:
		return m.onInput(st, data), nil
	case *events.ApprovalGranted:
		return m.onApprovalGranted(ctx, st, data, ev.ID), nil
	case *events.ApprovalDenied:
		return m.onApprovalDenied(st, data, ev.ID), nil
	case *events.SynthesisCompleted:
		return m.onSynthesis(st, data), nil
	case *events.TimerFired:
		return m.onTimer(ctx, st, data)
	case *CapacityCheck:
		return m.onCapacity(st, false), nil
	}
	return nil, fmt.Errorf("run: %T is not an event of a run", ev.Data)
}

// Start admits a run: the state a run.requested creates and what it
// implies (run.started, the run's deadline timer, then the first decision
// request, the action call or the workflow's first steps). idKey is the
// run's secret id key, drawn by the caller ([NewIDKey]).
func (m *Machine) Start(ctx context.Context, req *events.RunRequested, idKey string) (*State, []Effect, error) {
	now := m.env.Now().UTC()
	st := &State{RunID: req.RunID, IDKey: idKey, Tenant: events.TenantOr(req.Tenant), Status: StatusRunning, Kind: KindAgent, UserID: req.UserID,
		AllowedModes: req.AllowedModes, Metadata: req.Metadata, CreatedAt: now, UpdatedAt: now}
	st.Principal = policy.Principal{Tenant: st.TenantOrDefault()}
	var unauthenticated *actionbus.Error
	if p := req.Principal; p != nil {
		var err error
		st.Principal, err = m.env.VerifyPrincipal(p.Token, policy.PrincipalClaim{RunID: req.RunID, Tenant: st.TenantOrDefault(),
			User: p.User, Roles: p.Roles, Scopes: p.Scopes, ExpiresAt: p.ExpiresAt}, now)
		if err != nil {
			st.Principal = policy.Principal{Tenant: st.TenantOrDefault()}
			if !errors.As(err, &unauthenticated) {
				unauthenticated = actionbus.Errorf(actionbus.CodeUnauthenticated, "%v", err)
			}
		} else {
			st.UserID = st.Principal.User // the gateway's user is who the run acts for
		}
	}
	switch {
	case req.Action != nil:
		st.Kind, st.Exec = KindExec, execCallOf(req.Action)
	case req.Workflow != nil:
		st.Kind = KindWorkflow
	default:
		st.Agent = &AgentRun{Prompt: req.Prompt, Scenario: req.Scenario, Replay: req.Replay, Observations: []events.Observation{}}
	}
	var badWorkspace *actionbus.Error
	var puts []Effect // the workspace's large documents, stored by the shell
	if len(req.Workspace) > 0 {
		if st.Agent == nil {
			badWorkspace = actionbus.Errorf(actionbus.CodeInvalidDecision, "a workspace is for agent runs (a prompt or scenario), not exec or workflow runs")
		} else if ws, err := workspace.New(req.Workspace); err != nil {
			badWorkspace = err
		} else {
			st.Agent.Workspace = ws
			puts = m.storeWorkspace(st, ws)
		}
	}
	deadline := m.lim.RunDeadline
	if req.DeadlineMs > 0 {
		// The schema bounds deadlineMs; the bound is kept here too, so
		// that no request reaching the machine overflows the duration.
		deadline = time.Duration(min(req.DeadlineMs, events.MaxRunDeadline.Milliseconds())) * time.Millisecond
	}
	st.Deadline = now.Add(deadline)
	out := append(puts,
		Effect{Kind: EffectEvent, ID: st.derive("started"), Type: events.TypeRunStarted,
			Data: &events.RunStarted{RunID: req.RunID, Kind: string(st.Kind), Scenario: req.Scenario, Prompt: req.Prompt, RetryOf: req.RetryOf}},
		m.timer(st, events.TimerFired{Kind: events.TimerRunDeadline, Stage: "run"}, "run", deadline),
	)
	if unauthenticated != nil {
		return st, append(out, m.fail(st, unauthenticated)...), nil
	}
	if refused := m.budget(st, req.Budget); refused != nil {
		return st, append(out, m.fail(st, refused)...), nil
	}
	if badWorkspace != nil {
		return st, append(out, m.fail(st, badWorkspace)...), nil
	}
	var prior *State
	if req.RetryOf != "" {
		var err error
		if prior, err = m.priorRun(ctx, st, req); err != nil {
			var refused *actionbus.Error
			if errors.As(err, &refused) {
				return st, append(out, m.fail(st, refused)...), nil
			}
			return nil, nil, err
		}
		st.RetryOf = prior.RunID
		if st.Kind != KindWorkflow {
			// A workflow claims its prior run once its definition is
			// known to match (startWorkflow).
			if refused, err := m.claimRetry(ctx, st, prior); err != nil || refused != nil {
				if err != nil {
					return nil, nil, err
				}
				return st, append(out, m.fail(st, refused)...), nil
			}
			out = append(out, retriedLink(st, prior))
		}
	}
	var more []Effect
	var err error
	switch st.Kind {
	case KindExec:
		// A retried one-action run runs its action again (its
		// idempotency key, if any, replays a result that was stored).
		st.Cycle = 1
		more, err = m.startCalls(ctx, st, []events.Decision{{Type: events.DecisionAction, Name: req.Action.Name, Args: req.Action.Args,
			IdempotencyKey: req.Action.IdempotencyKey}}, events.OriginHost, nil)
	case KindWorkflow:
		more, err = m.startWorkflow(ctx, st, req.Workflow, prior)
	default:
		if prior != nil {
			more = m.resumeAgent(st, prior)
		}
		more = append(more, m.askPlanner(st)...)
	}
	if err != nil {
		return nil, nil, err
	}
	return st, append(out, more...), nil
}

// retriedLink is the step that links a retried run to its retry: published
// on the retried run's subject (it ended, so nothing else changes there),
// where followers and the audit trail of that run see it.
func retriedLink(st, prior *State) Effect {
	return Effect{Kind: EffectStep, ID: st.derive("retried-link"), RunID: prior.RunID,
		Step: &events.RunStep{RunID: prior.RunID, Name: string(StepRetried), Cycle: prior.Cycle,
			Message: "retried by run " + st.RunID, Details: map[string]any{"retriedBy": st.RunID}}}
}

// resumeAgent starts a retried agent run after the last good cycle of the
// run it retries: the observations of the cycles before the first one
// with a failed action are kept (those actions are not run again), and
// the planner is asked for the next decision from there.
func (m *Machine) resumeAgent(st, prior *State) []Effect {
	good := 0
	for c := 1; c <= prior.Cycle; c++ {
		if slices.ContainsFunc(prior.Agent.Observations, func(o events.Observation) bool { return o.Cycle == c && !o.OK }) {
			break
		}
		if !slices.ContainsFunc(prior.Agent.Observations, func(o events.Observation) bool { return o.Cycle == c }) {
			break // a cycle that observed nothing (it failed before acting)
		}
		good = c
	}
	for _, o := range prior.Agent.Observations {
		if o.Cycle <= good {
			st.Agent.Observations = append(st.Agent.Observations, o)
		}
	}
	st.Cycle = good
	return []Effect{stepWith(st, StepRetryResumed, nil, "", fmt.Sprintf("resumes after cycle %d of run %s", good, prior.RunID), "ok",
		map[string]any{"retryOf": prior.RunID, "cycles": good, "observations": len(st.Agent.Observations)})}
}

// priorRun returns the run a retry (st, admitted from req) names, or a
// retry_refused error when it cannot be retried by this run: it must
// exist, have failed or been canceled, be of the same kind (an agent run
// of the same prompt and scenario, an exec run of the same call), and
// belong to the same tenant and user — a user a gateway authenticated
// when the run was requested through one (a retry reuses its results and
// runs what remains in that user's name, and claims the run: a tenant
// client naming the user must not take a gateway user's retry).
func (m *Machine) priorRun(ctx context.Context, st *State, req *events.RunRequested) (*State, error) {
	runID := req.RetryOf
	prior, err := m.env.PriorRun(ctx, st.TenantOrDefault(), runID)
	if err != nil {
		return nil, err
	}
	refuse := func(format string, args ...any) *actionbus.Error {
		return actionbus.Errorf(actionbus.CodeRetryRefused, format, args...).WithDetail("retryOf", runID)
	}
	// Another tenant's run is not there: it is refused as a missing one,
	// before anything about it (its status) can be told.
	switch {
	case prior == nil || prior.TenantOrDefault() != st.TenantOrDefault():
		return nil, refuse("no run %s to retry", runID)
	case prior.Status != StatusFailed && prior.Status != StatusCanceled:
		return nil, refuse("run %s is %s; only a failed or canceled run is retried", runID, prior.Status)
	case prior.Kind != st.Kind:
		return nil, refuse("run %s is a %s run, not a %s run", runID, prior.Kind, st.Kind)
	case prior.UserID != st.UserID:
		return nil, refuse("run %s belongs to another user", runID)
	case prior.Principal.Gateway != "" && (st.Principal.Gateway == "" || st.Principal.User != prior.Principal.User):
		return nil, refuse("run %s was requested through a gateway that authenticated its user; retry it through a gateway, as that user", runID)
	case st.Kind == KindExec && !st.Exec.Same(prior):
		// A retry repeats the run's call; another call (or the same
		// action with other arguments) is a new run, not its retry.
		return nil, refuse("run %s was asked for another call than %s with these arguments; a retry asks for the same action with the same arguments", runID, st.Exec.Action)
	case st.Agent != nil && (prior.Agent == nil || prior.Agent.Prompt != st.Agent.Prompt || prior.Agent.Scenario != st.Agent.Scenario):
		return nil, refuse("run %s had another prompt or scenario", runID)
	case prior.Terminal != nil && prior.Terminal.Error != nil && prior.Terminal.Error.Code == actionbus.CodeRetryRefused:
		// A refused retry did nothing: there is nothing of it to retry,
		// and running it again from the start would repeat what the run
		// it named (or that run's retry) did.
		if by, _ := prior.Terminal.Error.Details["retriedBy"].(string); by != "" {
			return nil, refuse("run %s is a refused retry; retry run %s instead", runID, by).WithDetail("retriedBy", by)
		}
		return nil, refuse("run %s is a refused retry; there is nothing of it to retry", runID)
	case st.Kind == KindWorkflow && prior.Workflow == nil:
		// It failed before its steps were set up (its retry, if it was
		// one, claimed nothing): what it retried is retried instead.
		return nil, refuse("run %s started no step; retry %s instead", runID, orSelf(prior.RetryOf, "the run again"))
	}
	if refused := retriedAlready(runID, st.RunID, prior.RetriedBy); refused != nil {
		return nil, refused
	}
	return prior, nil
}

func orSelf(runID, otherwise string) string {
	if runID == "" {
		return otherwise
	}
	return "run " + runID
}

// claimRetry claims prior for st's retry (see [Env.ClaimRetry]) and
// returns the refusal when another run already retries it.
func (m *Machine) claimRetry(ctx context.Context, st, prior *State) (*actionbus.Error, error) {
	holder, err := m.env.ClaimRetry(ctx, prior.RunID, st.RunID)
	if err != nil {
		return nil, err
	}
	return retriedAlready(prior.RunID, st.RunID, holder), nil
}

// retriedAlready is the refusal of retry retryID of run priorID when
// retriedBy, another run, already retries it: a run is retried into one
// new run, so that the effects it completed are reused once, never copied
// twice. The chain goes on from its latest run, which the refusal names.
func retriedAlready(priorID, retryID, retriedBy string) *actionbus.Error {
	if retriedBy == "" || retriedBy == retryID {
		return nil
	}
	return actionbus.Errorf(actionbus.CodeRetryRefused, "run %s was already retried by run %s; retry run %s instead if it failed", priorID, retriedBy, retriedBy).
		WithDetail("retryOf", priorID).WithDetail("retriedBy", retriedBy)
}

// Rejected is the state of a run whose request was refused before it could
// be admitted (a malformed or forged run.requested): created failed with
// cause, so that whoever waits on the run id learns why.
func (m *Machine) Rejected(tenant, runID, idKey string, cause *actionbus.Error) (*State, []Effect) {
	now := m.env.Now().UTC()
	st := &State{RunID: runID, IDKey: idKey, Tenant: tenant, Kind: KindRejected, CreatedAt: now, UpdatedAt: now, Deadline: now}
	return st, m.fail(st, cause)
}

// FailWith ends a run that cannot go on (its next state could not be
// stored, an event of it could not be published) with cause, replacing the
// terminal event it had if any.
func (m *Machine) FailWith(st *State, cause *actionbus.Error) []Effect {
	st.Terminal = nil
	return m.fail(st, cause)
}

func (m *Machine) onCancel(st *State, c *events.CancelRequested) []Effect {
	if st.IsTerminal() {
		return nil
	}
	if st.waitingRetry() {
		// The seed's rule: a cancel during a retry delay aborts the
		// workflow; the step's handler is not called again.
		err := actionbus.Errorf(actionbus.CodeWorkflowAborted, "workflow canceled during a retry delay: %s", c.Reason)
		return append([]Effect{step(st, StepWorkflowAborted, nil, "", c.Reason, "failed")}, m.fail(st, err)...)
	}
	return append([]Effect{step(st, StepCanceled, nil, "", c.Reason, "")},
		m.terminate(st, &Terminal{Type: events.TypeRunCanceled, Reason: c.Reason})...)
}
