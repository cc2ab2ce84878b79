// Package client publishes actionbus runs and follows them from Go: start a
// run (a prompt for an agent run, or one action), follow its events live,
// wait for its terminal event, cancel it, read the action catalog.
//
// Other languages do the same by publishing the documented CloudEvents
// (docs/events.md) directly; this package adds nothing they cannot do.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/readapi"
	"github.com/actionbus/actionbus/internal/tracing"
)

// Options configures a [Client].
type Options struct {
	// Prefix is the subject prefix; default "ab".
	Prefix string
	// Source is the CloudEvent source of published events; default
	// "/actionbus/client".
	Source string
	// Tenant is the tenant whose runs the client starts, follows and
	// answers; default "default". A tenant's NATS user may only touch
	// its own tenant's subjects, and must connect with the inbox prefix
	// [InboxPrefix] of its tenant.
	Tenant string
}

// InboxPrefix returns the reply-inbox prefix a tenant's users connect
// with (nats.CustomInboxPrefix): a tenant's user may subscribe only to its
// own inboxes, so no tenant reads the replies another tenant's reads
// receive.
func InboxPrefix(tenant string) string { return "_INBOX_" + events.TenantOr(tenant) }

// Client publishes and follows runs. It is safe for concurrent use.
type Client struct {
	tenant string
	nc     *nats.Conn
	js     jetstream.JetStream
	bus    *bus.Bus
	topo   bus.Topology
	reads  *readapi.Caller
	// dropLive, set by tests, loses the live messages it returns true
	// for (as a connection moving to another server does).
	dropLive func(subject string) bool
}

func (o *Options) setDefaults() {
	if o.Source == "" {
		o.Source = "/actionbus/client"
	}
	o.Tenant = events.TenantOr(o.Tenant)
}

// Validate reports configuration errors (a prefix that is not a subject
// token).
func (o *Options) Validate() error {
	if o.Tenant != "" {
		if err := events.CheckTenant(o.Tenant); err != nil {
			return err
		}
	}
	return bus.Topology{Prefix: o.Prefix}.Validate()
}

// New returns a client using nc; the zero Options are the defaults.
func New(nc *nats.Conn, opts Options) (*Client, error) {
	opts.setDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	eb, err := bus.Open(nc, bus.BusConfig{Prefix: opts.Prefix, Source: opts.Source})
	if err != nil {
		return nil, err
	}
	return &Client{tenant: opts.Tenant, nc: nc, js: eb.JetStream(), bus: eb, topo: bus.Topology{Prefix: opts.Prefix},
		reads: readapi.NewCaller(nc, opts.Prefix, opts.Tenant)}, nil
}

// ActionCall names an action and its input.
type ActionCall struct {
	Name string
	Args map[string]any
	// IdempotencyKey makes a retried call return its first result instead
	// of running again.
	IdempotencyKey string
}

// RunRequest describes a run to start.
type RunRequest struct {
	// RunID is the run's id; a fresh ULID when empty. It must be a
	// canonical ULID (26 upper-case characters; invalid_run_id otherwise).
	// Reusing an id deduplicates: the run starts once.
	RunID string
	// Prompt is the user's request for an agent run.
	Prompt string
	// Scenario names the script planner's scenario.
	Scenario string
	// Action, when set, makes a one-action host-origin run: no planner is
	// asked and the run ends with the action's result.
	Action *ActionCall
	// Workflow, when set, makes a workflow run (see [NewWorkflow]); its
	// result's Output holds outputByStep and steps.
	Workflow *Workflow
	// WorkflowJSON is a workflow given as a JSON document (read from a
	// file, or from another program) instead of Workflow: it is sent as
	// it is, and the dispatcher checks all of it (a field Workflow has no
	// place for is an unknown_field issue). At most one of the two.
	WorkflowJSON json.RawMessage
	// UserID is who the run acts for.
	UserID string
	// AllowedModes are the action modes the run may use; default read,
	// draft and dryRun.
	AllowedModes []string
	// Metadata is request-scoped data for policies, handlers and audit.
	Metadata map[string]any
	// Deadline bounds the whole run; 0 means the dispatcher's default.
	Deadline time.Duration
	// RetryOf makes the run a retry of a failed or canceled workflow run
	// (see [Client.Retry]).
	RetryOf string
	// Workspace gives an agent run a virtual workspace with these
	// documents (path → markdown; at most 32, 1 MiB each), which the
	// planner reads, grows, patches and publishes (docs/workspace.md).
	Workspace map[string]string
	// Principal, set by a gateway (an HTTP API, an MCP server) that
	// authenticated its caller, makes the run act for that user with the
	// roles and scopes the gateway grants it; the dispatcher believes it
	// only when signed with a gateway's approval key. Without it the run
	// holds what the policy grants the tenant's NATS clients.
	Principal *Principal
	// Budget bounds what the run's LLM calls may spend (tokens, cost);
	// nil takes the host's run budget, which a request cannot raise.
	Budget *Budget
}

// Principal is a user a gateway authenticated and what the gateway grants
// it, with the gateway's approval key (kid:secret:* in the dispatcher's
// keys) that signs the statement.
type Principal struct {
	User   string
	Roles  []string
	Scopes []string
	KeyID  string
	Key    []byte
}

// Start publishes a run.requested event and returns the run id.
func (c *Client) Start(ctx context.Context, req RunRequest) (string, error) {
	if req.RunID == "" {
		req.RunID = events.NewID()
	}
	if err := events.CheckRunID(req.RunID); err != nil {
		return "", fmt.Errorf("client: start run: %w", err)
	}
	data := &events.RunRequested{RunID: req.RunID, Prompt: req.Prompt, Scenario: req.Scenario, UserID: req.UserID,
		AllowedModes: req.AllowedModes, Metadata: req.Metadata, DeadlineMs: req.Deadline.Milliseconds(), RetryOf: req.RetryOf,
		Workspace: req.Workspace, Budget: req.Budget}
	wf, err := workflowDocument(req)
	if err != nil {
		return "", fmt.Errorf("client: start run: %w", err)
	}
	data.Workflow = wf
	if p := req.Principal; p != nil {
		expires := time.Now().Add(policy.PrincipalTTL).UTC().Truncate(time.Second)
		token, err := policy.SignPrincipal(p.KeyID, p.Key, policy.PrincipalClaim{RunID: req.RunID, Tenant: events.TenantOr(c.tenant),
			User: p.User, Roles: p.Roles, Scopes: p.Scopes, ExpiresAt: expires})
		if err != nil {
			return "", fmt.Errorf("client: start run: %w", err)
		}
		data.Principal = &events.Principal{User: p.User, Roles: p.Roles, Scopes: p.Scopes, ExpiresAt: expires, Token: token}
		data.UserID = p.User
	}
	if req.Action != nil {
		data.Action = &events.ActionCall{Name: req.Action.Name, Args: req.Action.Args, IdempotencyKey: req.Action.IdempotencyKey}
	}
	// The run's trace starts here: a child of the caller's span when ctx
	// holds one (the run joins the caller's trace), a root otherwise.
	ctx, span := tracing.Tracer().Start(ctx, "publish run.requested", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(tracing.RunIDKey.String(req.RunID), tracing.TenantKey.String(c.tenant)))
	defer span.End()
	if err := c.emitRetrying(tracing.WithRun(ctx, tracing.RunOf(ctx)), events.TypeRunRequested, req.RunID, req.RunID, data); err != nil {
		tracing.Fail(span, string(actionbus.CodeOf(err)))
		return "", fmt.Errorf("client: start run: %w", err)
	}
	return req.RunID, nil
}

// emitRetrying publishes an event, retrying while the stream cannot
// answer (a cluster electing a new stream leader, a server going away)
// until ctx ends. The event id makes a retry of a stored event a
// duplicate, so it is stored once.
func (c *Client) emitRetrying(ctx context.Context, typ, id, runID string, data any) error {
	wait := 100 * time.Millisecond
	for {
		_, err := c.bus.Emit(ctx, typ, id, c.tenant, runID, "", data)
		if err == nil || !transient(err) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// transient reports a publish error that a retry can cure.
func transient(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected)
}

// Cancel asks the dispatcher to cancel a run. A run that already ended is
// not changed.
func (c *Client) Cancel(ctx context.Context, runID, reason string) error {
	_, err := c.bus.Emit(ctx, events.TypeCancelRequested, events.NewID(), c.tenant, runID, "",
		&events.CancelRequested{RunID: runID, Reason: reason, RequestedBy: "client"})
	return err
}

// Input answers a run's clarify question; the run resumes with the answer
// as an observation.
func (c *Client) Input(ctx context.Context, runID, answer string) error {
	_, err := c.bus.Emit(ctx, events.TypeInputProvided, events.NewID(), c.tenant, runID, "",
		&events.InputProvided{RunID: runID, Answer: answer, ProvidedBy: "client"})
	return err
}

// PendingApproval is an approval request as an approver reads it.
type PendingApproval struct {
	Context ApprovalContext
	// Input is the call's input as it will run.
	Input  map[string]any
	Reason string
}

// approvalRun returns the run id of an approval id
// ("<runId>-<cycle>-<planIndex>[-<attempt>]"), or invalid_run_id when
// approvalID does not have that shape.
func approvalRun(approvalID string) (string, error) {
	parts := strings.Split(approvalID, "-")
	shaped := (len(parts) == 3 || len(parts) == 4) && events.ValidRunID(parts[0])
	for _, n := range parts[1:] {
		shaped = shaped && n != "" && strings.Trim(n, "0123456789") == ""
	}
	if !shaped {
		return "", actionbus.Errorf(actionbus.CodeInvalidRunID, "%q is not an approval id (<runId>-<cycle>-<planIndex>[-<attempt>], runId a ULID)",
			clip(approvalID, 64)).WithDetail("approvalId", clip(approvalID, 64))
	}
	return parts[0], nil
}

// CheckApprovalID checks the shape of an approval id
// ("<runId>-<cycle>-<planIndex>[-<attempt>]"), without reading anything:
// an *actionbus.Error with code invalid_run_id, naming the id, when it
// does not have it.
func CheckApprovalID(approvalID string) error {
	_, err := approvalRun(approvalID)
	return err
}

// clip cuts s to at most n bytes, marking the cut with "…".
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Approval reads the request of an approval id (its run id is the part
// before the first '-'). It returns an *actionbus.Error with code
// invalid_run_id when approvalID is not shaped as an approval id (without
// reading), and approval_not_found when the tenant has no such approval
// request (its run unknown included), within a second; other errors are
// the read service's. It reads through the read service's approvals
// operation only, all a tenant's approver user may read.
func (c *Client) Approval(ctx context.Context, approvalID string) (*PendingApproval, error) {
	runID, err := approvalRun(approvalID)
	if err != nil {
		return nil, err
	}
	var found *PendingApproval
	match := func(r *events.Received) bool {
		if req, ok := r.Data.(*events.ApprovalRequested); ok && req.Context.ApprovalID == approvalID {
			found = &PendingApproval{Context: req.Context, Input: req.Input, Reason: req.Reason}
			return true
		}
		return false
	}
	// An approval request just received live may not be stored yet (the
	// stream stores what subscribers already got): it is read again for
	// up to approvalStoreWait before it is called missing.
	deadline := time.Now().Add(approvalStoreWait)
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, 250*time.Millisecond) {
		ok, err := c.scanApprovals(ctx, runID, match)
		if err != nil {
			return nil, fmt.Errorf("client: approval %s: %w", approvalID, err)
		}
		if ok {
			return found, nil
		}
		if time.Now().After(deadline) {
			return nil, actionbus.Errorf(actionbus.CodeApprovalNotFound, "no approval request %s in tenant %s", approvalID, c.tenant).
				WithDetail("approvalId", approvalID)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
	}
}

// approvalStoreWait bounds how long [Client.Approval] reads again an
// approval request it does not find: storing lags a live delivery by
// milliseconds, and a command naming an unknown approval answers well
// within a second.
const approvalStoreWait = 300 * time.Millisecond

// Approve signs the approval context of approvalID with the approver's own
// key (the dispatcher names the key's holder as the approver), publishes
// the grant and waits, as long as ctx allows, for the dispatcher's answer.
// It returns nil once the dispatcher granted the approval, and an
// *actionbus.Error otherwise: approval_invalid (a token for another
// context, an unknown key, no such pending approval), approval_replayed or
// approval_expired.
func (c *Client) Approve(ctx context.Context, approvalID, keyID string, key []byte) error {
	return c.grant(ctx, approvalID, keyID, func(pc policy.ApprovalContext) (string, error) {
		return policy.Sign(keyID, key, pc)
	})
}

// ApproveAs is Approve for a gateway (an HTTP API, a console) that
// authenticated approver itself: it signs the approver's name with the
// context, with a gateway's key (kid:secret:* in the dispatcher's keys).
func (c *Client) ApproveAs(ctx context.Context, approvalID, keyID string, key []byte, approver string) error {
	return c.grant(ctx, approvalID, approver, func(pc policy.ApprovalContext) (string, error) {
		return policy.SignAs(keyID, key, pc, approver)
	})
}

// grant publishes a grant naming named, signed by sign.
func (c *Client) grant(ctx context.Context, approvalID, named string, sign func(policy.ApprovalContext) (string, error)) error {
	p, err := c.Approval(ctx, approvalID)
	if err != nil {
		return err
	}
	token, err := sign(policy.ApprovalContext(p.Context))
	if err != nil {
		return err
	}
	id := events.NewID()
	return c.answer(ctx, p.Context.RunID, id, func() error {
		_, err := c.bus.Emit(ctx, events.TypeApprovalGranted, id, c.tenant, p.Context.RunID, "",
			&events.ApprovalGranted{RunID: p.Context.RunID, ApprovalID: approvalID, Token: token, Approver: named, Context: &p.Context})
		return err
	})
}

// Deny refuses an approval, signed with the approver's own key (the
// dispatcher names the key's holder as who denied), so that the run ends
// with approval_denied, and waits, as long as ctx allows, for the
// dispatcher's answer: nil when the denial took effect, an
// *actionbus.Error (approval_invalid, approval_replayed, approval_expired)
// when there was nothing to deny or the key is not known.
func (c *Client) Deny(ctx context.Context, approvalID, keyID string, key []byte, reason string) error {
	token, err := policy.SignDenial(keyID, key, approvalID, reason)
	if err != nil {
		return err
	}
	return c.deny(ctx, approvalID, keyID, token, reason)
}

// DenyAs is Deny for a gateway that authenticated approver itself, with a
// gateway's key.
func (c *Client) DenyAs(ctx context.Context, approvalID, keyID string, key []byte, approver, reason string) error {
	token, err := policy.SignDenialAs(keyID, key, approvalID, reason, approver)
	if err != nil {
		return err
	}
	return c.deny(ctx, approvalID, approver, token, reason)
}

func (c *Client) deny(ctx context.Context, approvalID, named, token, reason string) error {
	runID, err := approvalRun(approvalID)
	if err != nil {
		return err
	}
	id := events.NewID()
	return c.answer(ctx, runID, id, func() error {
		_, err := c.bus.Emit(ctx, events.TypeApprovalDenied, id, c.tenant, runID, "",
			&events.ApprovalDenied{RunID: runID, ApprovalID: approvalID, Token: token, Approver: named, Reason: reason})
		return err
	})
}

// answer publishes an approval answer with event id answerID and waits for
// the dispatcher's approval.resolved of it: live on the approval subject,
// and from the stream from time to time (an answer published while the
// connection moved servers is not lost).
func (c *Client) answer(ctx context.Context, runID, answerID string, publish func() error) error {
	got := make(chan *events.ApprovalResolved, 1)
	match := func(r *events.Received) bool {
		res, ok := r.Data.(*events.ApprovalResolved)
		if !ok || res.AnswerID != answerID {
			return false
		}
		select {
		case got <- res:
		default:
		}
		return true
	}
	sub, err := c.nc.Subscribe(c.topo.Subjects().Run(c.tenant, runID, "approval"), func(m *nats.Msg) {
		if r, err := c.bus.Receive(m.Subject, m.Header, m.Data); err == nil {
			match(r)
		}
	})
	if err != nil {
		return fmt.Errorf("client: approval answer: %w", err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // best effort
	// The subscription is in place on the server before the answer is
	// published, so the dispatcher's reply cannot be missed.
	if err := c.nc.FlushTimeout(5 * time.Second); err != nil {
		return fmt.Errorf("client: approval answer: %w", err)
	}
	if err := publish(); err != nil {
		return err
	}
	recheck := time.NewTimer(2 * time.Second)
	defer recheck.Stop()
	for {
		select {
		case res := <-got:
			if res.Outcome == events.ApprovalOutcomeRefused && res.Error != nil {
				return res.Error
			}
			return nil
		case <-recheck.C:
			_, _ = c.scanApprovals(ctx, runID, match)
			recheck.Reset(2 * time.Second)
		case <-ctx.Done():
			return fmt.Errorf("client: no answer from the dispatcher to approval answer %s: %w", answerID, ctx.Err())
		}
	}
}

// Event is one event of a run, as followed by [Client.Follow] and
// [Client.Watch]. A run.progress event carries the live steps of one
// transition in one message; it is delivered as one Event per step, in
// order, each with the event's type, subject and time and the step as its
// Data (the shape of run.step data, so [Event.Step] reads it). Such an
// Event's ID is the message's id when it carried one step, and otherwise
// the message's id followed by "#" and the step's position from 1
// ("<id>#1", "<id>#2", …).
type Event struct {
	ID      string
	Type    string
	Subject string
	Time    time.Time
	RunID   string
	// Data is the event's data as JSON.
	Data json.RawMessage
}

// Step decodes the data of a run's step (run.step, or one step of a
// run.progress event: see [Event]).
func (e Event) Step() (Step, bool) {
	var s Step
	if !events.IsRunStep(e.Type) || json.Unmarshal(e.Data, &s) != nil {
		return Step{}, false
	}
	return s, true
}

// Step is one progress step of a run.
type Step struct {
	Name      string `json:"name"`
	Cycle     int    `json:"cycle"`
	PlanIndex *int   `json:"planIndex,omitempty"`
	Action    string `json:"action,omitempty"`
	Message   string `json:"message,omitempty"`
	Status    string `json:"status,omitempty"`
	// Details holds the step's structured facts (e.g. approvalId of an
	// awaiting-approval step).
	Details map[string]any `json:"details,omitempty"`
}

// Run statuses of a [Result].
const (
	StatusCompleted = "completed"
	StatusFailed    = "failed"
	StatusCanceled  = "canceled"
)

// Result is the terminal state of a run.
type Result struct {
	RunID     string
	Status    string
	Answer    string
	Output    any
	Citations []string
	// Error is set when Status is failed.
	Error *actionbus.Error
	// Reason is set when Status is canceled.
	Reason string
	Cycles int
	// Usage is what the run's LLM calls used (nil when it made none).
	Usage *Usage
	// EventID is the id of the run's terminal event (run.completed,
	// run.failed or run.canceled): the run's audit records and the stream
	// name it, and JetStream stores it once.
	EventID string
}

// Follow delivers every stored event of a run to fn (when not nil), from
// the run's first event, until its terminal event, and returns the run's
// result. Live events (run.started, run.progress) are never stored: Follow
// delivers those published after it subscribed. To see a run's every event,
// start it with Run and a non-nil fn. It waits as long as ctx allows.
// It holds one subscription and no consumer: stored events are paged from
// the read service, each event is delivered once (by its id), and fn is
// called by one goroutine at a time. A run id that is not a ULID is
// invalid_run_id.
func (c *Client) Follow(ctx context.Context, runID string, fn func(Event)) (*Result, error) {
	return c.follow(ctx, runID, fn, nil)
}

// eventOf is the public view of a received event of runID.
func eventOf(r *events.Received, runID string) Event {
	data, _ := json.Marshal(r.Data)
	return Event{ID: r.Event.ID(), Type: r.Event.Type(), Subject: r.Subject, Time: r.Event.Time(), RunID: runID, Data: data}
}

// eventsOf is the public view of a received event of runID as Follow and
// Watch deliver it: a run.progress event, which carries the live steps of
// one transition, is one [Event] per step, in order (see [Event]); any
// other event is itself.
func eventsOf(r *events.Received, runID string) []Event {
	if r.Event.Type() != events.TypeRunProgress {
		return []Event{eventOf(r, runID)}
	}
	steps := progressSteps(r)
	out := make([]Event, 0, len(steps))
	for i, s := range steps {
		data, _ := json.Marshal(s)
		out = append(out, Event{ID: stepEventID(r.Event.ID(), i, len(steps)), Type: r.Event.Type(), Subject: r.Subject,
			Time: r.Event.Time(), RunID: runID, Data: data})
	}
	return out
}

// stepEventID is the id of the i-th of n steps of a run.progress event:
// the event's own id for a single step, and the id followed by "#" and
// the step's position (from 1) otherwise.
func stepEventID(id string, i, n int) string {
	if n == 1 {
		return id
	}
	return id + "#" + strconv.Itoa(i+1)
}

// progressSteps returns the steps of a run.progress event: the list of a
// version 2 event; the one step of a version 1 event (the data of a
// dispatcher that predates lists: one step, the shape of run.step data,
// no version); none for a version this client does not know.
func progressSteps(r *events.Received) []events.RunStep {
	p, ok := r.Data.(*events.RunProgress)
	if !ok {
		return nil
	}
	switch p.Version {
	case events.ProgressVersion:
		return p.Steps
	case 0:
		var s events.RunStep
		if events.DataAs(r.Event, &s) == nil && s.Name != "" {
			return []events.RunStep{s}
		}
	}
	return nil
}

func terminal(r *events.Received) *Result {
	id := r.Event.ID()
	switch d := r.Data.(type) {
	case *events.RunCompleted:
		return &Result{RunID: d.RunID, Status: StatusCompleted, Answer: d.Answer, Output: d.Output, Citations: d.Citations, Cycles: d.Cycles, Usage: d.Usage, EventID: id}
	case *events.RunFailed:
		e := d.Error
		return &Result{RunID: d.RunID, Status: StatusFailed, Error: &e, Cycles: d.Cycles, Usage: d.Usage, EventID: id}
	case *events.RunCanceled:
		return &Result{RunID: d.RunID, Status: StatusCanceled, Reason: d.Reason, Cycles: d.Cycles, Usage: d.Usage, EventID: id}
	}
	return nil
}

// Wait waits for a run's terminal event and returns its result. It costs
// three subscriptions (one per terminal verb) and a read of the read
// service now and then, no consumer, so many runs can be waited on at
// once.
func (c *Client) Wait(ctx context.Context, runID string) (*Result, error) {
	return c.wait(ctx, runID, nil)
}

// wait waits for runID's terminal event. With start, the run is started
// once the subscription is in place: a run started after it cannot end
// unseen, so the stream is not read first (it still is now and then, in
// case the connection moved to another server meanwhile).
func (c *Client) wait(ctx context.Context, runID string, start func() error) (*Result, error) {
	subjects := c.topo.Subjects()
	// One subscription per terminal subject, not one for the run's every
	// event: its results, steps and progress are not sent here. Channel
	// subscriptions, not callbacks: nats.go starts a goroutine for every
	// callback subscription, three per run waited on. The channel has
	// room for every terminal event a run can have (one is stored per run;
	// a republished one is a rare duplicate).
	terminals := make(chan *nats.Msg, 8)
	for _, verb := range terminalVerbs {
		sub, err := c.nc.ChanSubscribe(subjects.Run(c.tenant, runID, verb), terminals)
		if err != nil {
			return nil, fmt.Errorf("client: wait %s: %w", runID, err)
		}
		defer sub.Unsubscribe() //nolint:errcheck // best effort
	}
	decode := func(subject string, h nats.Header, data []byte) *Result {
		r, err := c.bus.Receive(subject, h, data)
		if err != nil {
			return nil
		}
		return terminal(r)
	}
	// The run may have ended before the subscription started, or while
	// the connection was moving to another server of a cluster (core
	// messages sent meanwhile are lost): the stream is read at the start
	// and again from time to time.
	// Each read has its own short deadline: a request to a stream whose
	// leader is being elected may get no answer at all.
	stored := func() (*Result, error) {
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		return c.storedResult(rctx, runID)
	}
	if start != nil {
		if err := start(); err != nil {
			return nil, err
		}
	} else {
		res, err := stored()
		switch {
		case res != nil:
			return res, nil
		case refused(err):
			return nil, fmt.Errorf("client: wait %s: %w", runID, err)
		}
	}
	// Other errors (a server going away) are retried below.
	recheck := time.NewTimer(time.Second)
	defer recheck.Stop()
	for every := time.Second; ; {
		select {
		case m := <-terminals:
			if res := decode(m.Subject, m.Header, m.Data); res != nil {
				return res, nil
			}
		case <-recheck.C:
			// A failed read (a server going away) is retried next time.
			if res, _ := stored(); res != nil {
				return res, nil
			}
			every = min(2*every, 10*time.Second)
			recheck.Reset(every)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Ended returns the result of a run that has ended, and nil when it has
// not (or is unknown). It reads the run's terminal events once and does
// not wait.
func (c *Client) Ended(ctx context.Context, runID string) (*Result, error) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := c.storedResult(rctx, runID)
	if err != nil {
		return nil, fmt.Errorf("client: ended %s: %w", runID, err)
	}
	return res, nil
}

// terminalVerbs are the subject verbs of a run's terminal events.
var terminalVerbs = []string{"completed", "failed", "canceled"}

// Run starts a run and follows it to its end, delivering every event to
// fn — live ones included, since it subscribes before it starts the run.
// With a nil fn it only waits for the result ([Client.Wait]).
func (c *Client) Run(ctx context.Context, req RunRequest, fn func(Event)) (*Result, error) {
	if fn == nil && req.RunID == "" {
		// A fresh run: subscribe, then start, and learn the result from
		// the terminal event itself, without reading the stream.
		req.RunID = events.NewID()
		return c.wait(ctx, req.RunID, func() error { _, err := c.Start(ctx, req); return err })
	}
	if fn == nil {
		// A run id of the caller's: the run may exist already, and Wait
		// reads its stored end first.
		id, err := c.Start(ctx, req)
		if err != nil {
			return nil, err
		}
		return c.Wait(ctx, id)
	}
	if req.RunID == "" {
		req.RunID = events.NewID()
	}
	// Subscribe to the live events (run.started, progress), then start:
	// none is missed; stored events are read from the run's first.
	return c.follow(ctx, req.RunID, fn, func() error { _, err := c.Start(ctx, req); return err })
}

// ActionInfo is one action of the catalog (the public listing).
type ActionInfo struct {
	Name         string
	Description  string
	Mode         string
	Tier         int
	Pool         string
	Version      string
	Hash         string
	InputSchema  json.RawMessage
	OutputSchema json.RawMessage
	// PlannerVisible is false for actions hidden from planners.
	PlannerVisible bool
	// Permission is the normalized permission metadata.
	Permission   Permission
	Tags         []string
	ResourceType string
	RiskLevel    string
}

// Tenant returns the client's tenant.
func (c *Client) Tenant() string { return c.tenant }

// StreamAnswer calls fn with the tokens of a run's final answer while the
// planner writes it (when the answer comes from an LLM synthesis call), and
// once more with end set when the answer is complete. Tokens travel on
// core NATS: subscribe before they are written, since nothing is kept;
// the terminal event always carries the whole answer. Call the returned
// function to stop.
func (c *Client) StreamAnswer(runID string, fn func(delta string, end bool)) (stop func() error, err error) {
	sub, err := c.nc.Subscribe(c.topo.Subjects().Stream(c.tenant, runID), func(m *nats.Msg) {
		fn(string(m.Data), m.Header.Get(events.StreamEndHeader) != "")
	})
	if err != nil {
		return nil, fmt.Errorf("client: stream answer of %s: %w", runID, err)
	}
	if err := c.nc.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("client: stream answer of %s: %w", runID, err)
	}
	return sub.Unsubscribe, nil
}

// AuditQuery selects audit records for [Client.AuditStream].
type AuditQuery struct {
	// RunID limits the records to one run; "" means every run.
	RunID string
	// Since starts at records stored at or after this time; zero means
	// from the first record (or, when Live, from now).
	Since time.Time
	// Live keeps delivering new records until ctx ends; otherwise the
	// stream ends at the last record stored when it was opened.
	Live bool
	// AllTenants reads the records of every tenant (operators); by
	// default only the client's tenant's.
	AllTenants bool
}

// AuditStream delivers audit records with their audit-stream sequence, in
// stream order (the records of one append share its sequence), to fn until fn returns an error, the records run out (not
// Live) or ctx ends.
//
// The client's own tenant's records are read through the read service;
// AllTenants (operators, connected as the service account's admin user)
// reads the audit stream with an ordered consumer.
func (c *Client) AuditStream(ctx context.Context, q AuditQuery, fn func(seq uint64, rec AuditRecord) error) error {
	if !q.AllTenants {
		return c.auditStream(ctx, q, fn)
	}
	subjects := c.topo.Subjects()
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{subjects.TenantAudit(c.tenant)}, DeliverPolicy: jetstream.DeliverAllPolicy}
	switch {
	case q.RunID != "":
		cfg.FilterSubjects = []string{subjects.RunAudit(c.tenant, q.RunID)}
	case q.AllTenants:
		cfg.FilterSubjects = []string{subjects.AllAudit()}
	}
	switch {
	case !q.Since.IsZero():
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &q.Since
	case q.Live:
		cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	}
	cons, err := c.js.OrderedConsumer(ctx, c.topo.StreamAudit(), cfg)
	if err != nil {
		return fmt.Errorf("client: audit stream: %w", err)
	}
	defer c.dropConsumer(ctx, c.topo.StreamAudit(), cons)
	if !q.Live {
		info, err := cons.Info(ctx)
		if err != nil {
			return fmt.Errorf("client: audit stream: %w", err)
		}
		if info.NumPending == 0 {
			return nil
		}
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("client: audit stream: %w", err)
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()
	defer it.Stop()
	for {
		msg, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("client: audit stream: %w", err)
		}
		md, err := msg.Metadata()
		if err != nil {
			return err
		}
		r, err := c.bus.Receive(msg.Subject(), msg.Headers(), msg.Data())
		if err != nil {
			return fmt.Errorf("client: audit record %d: %w", md.Sequence.Stream, err)
		}
		recs, err := events.AuditRecordsOf(r)
		if err != nil {
			return fmt.Errorf("client: audit record %d: %w", md.Sequence.Stream, err)
		}
		for _, rec := range recs {
			if err := fn(md.Sequence.Stream, rec); err != nil {
				return err
			}
		}
		if !q.Live && md.NumPending == 0 {
			return nil
		}
	}
}

// StoredEvent is where a run's event is stored: its stream, stream
// sequence and type.
type StoredEvent struct {
	Stream string
	Seq    uint64
	Type   string
}
