package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go/jetstream"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/artifacts"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/jsoncodec"
	"github.com/actionbus/actionbus/internal/payload"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/tracing"
)

// errShutdown is the cause of handler contexts canceled because the
// executor stops; their messages are handed back, not reported failed.
var errShutdown = errors.New("executor: shutting down")

// outcome is what one message comes to; ack decisions are made from it in
// one place ([Executor.settle]).
type outcome int

const (
	// outcomeResult: a result (success or failure) was published; ack.
	outcomeResult outcome = iota
	// outcomeHandBack: the executor cannot finish it (shutdown); nak now
	// so another executor takes it.
	outcomeHandBack
	// outcomeRetryLater: someone else has held the call's idempotency key
	// past the call's patience; nak with a delay.
	outcomeRetryLater
	// outcomePublishFailed: the result could not be published; nak so the
	// call is redelivered (its idempotency key, if any, replays it).
	outcomePublishFailed
)

// pullWait is how long one pull request of an idle slot lives on the
// server: a request parked on a server that died (or a consumer leader
// that moved) is renewed at the latest then. Missed heartbeats (half of
// it) and reconnects renew it sooner.
const pullWait = 10 * time.Second

// work is one slot: it asks the server for one message only when it is
// free, so no message waits in a buffer while slots are busy. Each slot
// keeps one pull subscription for its life (a pull request per message,
// on the same inbox): a subscription per pull cost the server a
// subscribe and an unsubscribe for every call.
func (e *Executor) work(ctx, handlerCtx context.Context, cons jetstream.Consumer) {
	var pulls jetstream.MessagesContext
	defer func() {
		if pulls != nil {
			pulls.Stop()
		}
	}()
	for ctx.Err() == nil {
		if pulls == nil {
			var err error
			if pulls, err = cons.Messages(jetstream.PullMaxMessages(1), jetstream.PullExpiry(pullWait)); err != nil {
				pulls = nil
				e.pullFailed(ctx, err)
				continue
			}
		}
		msg, err := pulls.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrBadRequest) {
				// A pull subscription that ended without being stopped
				// is replaced.
				pulls.Stop()
				pulls = nil
			}
			e.pullFailed(ctx, err)
			continue
		}
		e.handle(handlerCtx, msg)
	}
}

// pullFailed logs a failed pull and pauses the slot briefly, so that a
// lasting failure (a server gone, a consumer deleted) does not spin.
func (e *Executor) pullFailed(ctx context.Context, err error) {
	e.log.Warn("pull failed", "err", err)
	select {
	case <-ctx.Done():
	case <-time.After(200 * time.Millisecond):
	}
}

// reject stores the rejection of a work message that is no call (E-REJECT)
// and acks it once the rejection is stored; a rejection that could not be
// stored leaves the message to be delivered again.
func (e *Executor) reject(ctx context.Context, msg jetstream.Msg, reason error) {
	if err := e.bus.Reject(context.WithoutCancel(ctx), msg, bus.PoolConsumer(e.cfg.Pool), reason); err != nil {
		_ = msg.NakWithDelay(time.Second)
		return
	}
	_ = msg.Ack()
}

// handle runs one message.
func (e *Executor) handle(ctx context.Context, msg jetstream.Msg) {
	rec, err := e.bus.Receive(msg.Subject(), msg.Headers(), msg.Data())
	if err != nil {
		e.reject(ctx, msg, err)
		return
	}
	req, ok := rec.Data.(*events.ActionRequested)
	if !ok {
		e.reject(ctx, msg, actionbus.Errorf(actionbus.CodeUnknownEventType, "%s does not belong on a work subject", rec.Event.Type()))
		return
	}
	deliveries := 1
	if md, err := msg.Metadata(); err == nil {
		deliveries = int(md.NumDelivered)
	}
	// The call's span (GenAI execute_tool): a child of the dispatcher's
	// span that sent it; the handler's context carries it.
	ctx, span := tracing.Tracer().Start(tracing.Parent(tracing.Extract(ctx, msg.Headers()), tracing.RunOfEvent(rec.Event)), "execute_tool "+req.Action,
		trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(semconv.GenAIOperationNameExecuteTool, semconv.GenAIToolName(req.Action), semconv.GenAIToolCallID(req.CallID),
			semconv.GenAIToolTypeKey.String("function"), tracing.RunIDKey.String(req.RunID), tracing.TenantKey.String(events.TenantOr(req.Tenant)),
			tracing.ExecutorKey.String(e.cfg.ID), tracing.AttemptKey.Int(req.Attempt)))
	defer span.End()
	ctx = tracing.WithRun(ctx, tracing.RunOfEvent(rec.Event))
	out, delay := e.run(ctx, msg, req, deliveries)
	e.settle(msg, req, out, delay)
}

// traceCall records on the call's span what its audit policy keeps of its
// arguments and result (with the shipped default policy, neither: input
// hashed, output summarized), and its failure's code.
func traceCall(ctx context.Context, reg *actions.Registered, input any, res actions.Result, herr error) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	if herr != nil {
		tracing.Fail(span, string(failure(herr).Code))
		return
	}
	if reg == nil {
		return
	}
	p := payload.Effective(payload.Default, reg.Def.AuditPolicy)
	if input != nil && (p.Input == actions.PayloadFull || p.Input == actions.PayloadRedacted) {
		if b, err := json.Marshal(payload.ApplyInput(p, input)); err == nil {
			span.SetAttributes(semconv.GenAIToolCallArgumentsKey.String(string(b)))
		}
	}
	if p.Output == actions.PayloadFull || p.Output == actions.PayloadRedacted {
		out, _ := payload.ApplyOutput(p, res.Output, res.Summary)
		if b, err := json.Marshal(out); err == nil {
			span.SetAttributes(semconv.GenAIToolCallResultKey.String(string(b)))
		}
	}
}

// callLog is the logger of one call. It is built when something is
// logged, which most calls never do (building one per call cost a
// twentieth of an executor's CPU).
func (e *Executor) callLog(req *events.ActionRequested) *slog.Logger {
	return e.log.With("run_id", req.RunID, "call_id", req.CallID, "action", req.Action)
}

// settle decides the ack outcome of a message, in one place.
func (e *Executor) settle(msg jetstream.Msg, req *events.ActionRequested, out outcome, delay time.Duration) {
	var err error
	switch out {
	case outcomeResult:
		err = msg.Ack()
	case outcomeHandBack:
		e.callLog(req).Info("handing the call back to the pool")
		err = msg.Nak()
	case outcomeRetryLater:
		err = msg.NakWithDelay(delay)
	case outcomePublishFailed:
		err = msg.NakWithDelay(time.Second)
	}
	if err != nil {
		e.callLog(req).Warn("ack outcome not delivered; JetStream will redeliver", "err", err)
	}
}

// call is one work item as it goes through the stages of [Executor.run]:
// each stage fills the fields the next one reads.
type call struct {
	msg        jetstream.Msg
	req        *events.ActionRequested
	deliveries int

	// Set by prepare.
	reg       *actions.Registered // nil when the action is not hosted
	args      map[string]any      // the validated input
	input     json.RawMessage     // args as JSON
	inputHash string
	timeout   time.Duration

	// Set by idempotency.
	key   string     // the idempotency key ("" when none)
	claim *idemClaim // the key's reservation, held while the handler runs

	// observed is the outcome reported to the Observer.
	observed string
}

// run takes a request through the protocol's stages, in order: prepare
// (refusals that need no handler: deliveries exhausted, run ended, action
// not hosted, tenant not served, invalid input, missing approval),
// idempotency (the key's reservation: replay, conflict or wait), invoke (the
// handler through the interceptors, under its timeout, with heartbeats)
// and publish (the result event). It returns the ack outcome.
func (e *Executor) run(ctx context.Context, msg jetstream.Msg, req *events.ActionRequested, deliveries int) (outcome, time.Duration) {
	c := &call{msg: msg, req: req, deliveries: deliveries, observed: "handed_back"}
	if o := e.cfg.Observer; o != nil {
		o.ActionStarted()
		start := time.Now()
		defer func() { o.ActionDone(req.Action, c.observed, time.Since(start)) }()
	}
	if err := e.prepare(c); err != nil {
		return e.publish(ctx, c, actions.Result{}, err, 0, false)
	}
	r := e.idempotency(ctx, c)
	switch {
	case r.failure != nil:
		return e.publish(ctx, c, actions.Result{}, r.failure, 0, false)
	case r.replay != nil:
		return e.publish(ctx, c, *r.replay, nil, 0, true)
	case r.stop:
		return r.outcome, r.delay
	}
	h := e.invoke(ctx, c)
	if h.after != nil {
		defer h.after() // once the result is out: an abandoned handler's slot and key
	}
	if h.handBack {
		return outcomeHandBack, 0
	}
	return e.publish(ctx, c, h.res, h.err, h.took, false)
}

// prepare checks what needs no handler, in the protocol's order, and
// returns the typed failure to publish, if any. On success c holds the
// validated input, its hash and the call's timeout.
func (e *Executor) prepare(c *call) error {
	req := c.req
	if c.deliveries >= bus.DefaultMaxDeliver {
		return actionbus.Errorf(actionbus.CodeDeliveryExhausted, "delivered %d times without a result; not running it again", c.deliveries)
	}
	if e.runEnded(req.RunID) {
		// Queued work of a run that ended (canceled, failed, completed):
		// never started, so no effect can follow a cancel.
		return actionbus.Errorf(actionbus.CodeRunEnded, "run %s ended before this call started; the handler was not called", req.RunID)
	}
	reg, ok := e.reg.Lookup(req.Action) // nil when not registered
	c.reg = reg
	if ok && !reg.Def.ServesTenant(events.TenantOr(req.Tenant)) {
		return actionbus.Errorf(actionbus.CodeTenantNotServed, "pool %s is dedicated to other tenants than %s", e.cfg.Pool, events.TenantOr(req.Tenant))
	}
	if !ok {
		return actionbus.Errorf(actionbus.CodeActionNotFound, "action %q is not registered on pool %s", req.Action, e.cfg.Pool)
	}
	prepared, _, issues := reg.Args.Prepare(req.Args, req.Origin)
	if issues != nil {
		return actions.ArgsError(req.Action, issues)
	}
	c.args = prepared
	input, err := jsoncodec.Marshal(prepared)
	if err != nil {
		return actionbus.Errorf(actionbus.CodeActionArgsInvalid, "input is not JSON: %w", err)
	}
	c.input = input
	if c.inputHash, err = policy.InputHash(prepared); err != nil {
		return actionbus.Errorf(actionbus.CodeActionArgsInvalid, "input has no canonical form: %w", err)
	}
	// Defense in depth: a mutation runs only with an approval bound to
	// exactly this input.
	if reg.Def.Mode == actions.ModeMutate {
		switch {
		case req.Approval == nil:
			return actionbus.Errorf(actionbus.CodeApprovalRequired, "mutate action %s arrived without an approval", req.Action)
		case req.Approval.Context.InputHash != c.inputHash || req.Approval.Context.Action != req.Action:
			return actionbus.Errorf(actionbus.CodeApprovalInvalid, "the approval of %s is bound to other input", req.Action)
		}
	}
	c.timeout = actions.Timeout(reg.Def.TimeoutMs, req.TimeoutMs, e.cfg.DefaultTimeout)
	return nil
}

// reservation is how the idempotency stage ends: with a failure or a
// replay to publish, with an ack outcome (stop), or, all zero, by going
// on to the handler.
type reservation struct {
	failure error
	replay  *actions.Result
	stop    bool
	outcome outcome
	delay   time.Duration
}

// idempotency reserves the call's idempotency key, when it has one (a mutate
// call always does: its call id), holding it in c.claim while the handler
// runs.
func (e *Executor) idempotency(ctx context.Context, c *call) reservation {
	c.key = c.req.IdempotencyKey
	if c.key == "" && c.reg.Def.Mode == actions.ModeMutate {
		c.key = c.req.CallID // a mutate call is always idempotent per call
	}
	if c.key == "" {
		return reservation{}
	}
	claim, stored, wait, err := e.reserveWaiting(ctx, c.msg, c.key, c.req, c.inputHash, c.timeout)
	var conflict *actionbus.Error
	switch {
	case errors.As(err, &conflict):
		return reservation{failure: conflict}
	case err != nil:
		e.callLog(c.req).Error("idempotency key not reserved", "err", err)
		return reservation{stop: true, outcome: outcomePublishFailed}
	case stored != nil:
		e.callLog(c.req).Info("replaying the stored result of an idempotency key")
		return reservation{replay: &actions.Result{Output: stored.Output, Summary: stored.Summary, Complete: stored.Complete}}
	case wait > 0:
		return reservation{stop: true, outcome: outcomeRetryLater, delay: wait}
	}
	c.claim = claim
	return reservation{}
}

// handled is what the handler stage comes to.
type handled struct {
	res  actions.Result
	took time.Duration
	err  error
	// handBack: the executor is shutting down; nothing is published.
	handBack bool
	// after, when set, waits for a handler that ignored its deadline and
	// then releases its key; it runs once the result is published.
	after func()
}

// invoke runs the handler through the interceptors ([Config.Interceptors])
// under the call's timeout, checks its output, and stores a success
// under the call's idempotency key (a failure gives the key up).
func (e *Executor) invoke(ctx context.Context, c *call) handled {
	req := c.req
	ac := actions.Call{RunID: req.RunID, CallID: req.CallID, Action: req.Action, UserID: req.UserID,
		Origin: req.Origin, Attempt: req.Attempt, Input: c.input, IdempotencyKey: c.key, InputHash: c.inputHash, Approval: req.Approval,
		PutArtifact: func(ctx context.Context, role, mediaType string, data []byte) (events.ArtifactRef, error) {
			return e.putArtifact(ctx, req, events.DerivedID(req.CallID, "artifact", role, req.Attempt), role, mediaType, data)
		}}
	res, took, abandoned, herr := e.execute(ctx, c.msg, c.reg, ac, c.timeout)
	h := handled{res: res, took: took, err: herr}
	// release gives the key up once the handler has really returned: a
	// handler still running past its deadline keeps its key reserved, so
	// a retry with the same key cannot run beside it.
	release := func() {}
	if c.claim != nil {
		release = func() { e.release(c.claim) }
	}
	if abandoned != nil {
		now := release
		release = func() {}
		h.after = func() {
			<-abandoned // the slot and the key are freed when the handler returns
			now()
		}
	}
	if errors.Is(context.Cause(ctx), errShutdown) && errors.Is(herr, errShutdown) {
		release()
		h.handBack = true
		return h
	}
	if h.err == nil {
		h.err = e.checkOutput(c.reg, &h.res)
	}
	if c.claim != nil && h.err == nil {
		if err := e.complete(ctx, c.claim, h.res); err != nil {
			e.callLog(req).Warn("result not stored under its idempotency key", "err", err)
		}
	} else if h.err != nil {
		release()
	}
	return h
}

// publish publishes the call's result (patiently: see publishPatiently)
// and returns the ack outcome: ack once it is stored, else hand the
// request back.
func (e *Executor) publish(ctx context.Context, c *call, res actions.Result, herr error, took time.Duration, replayed bool) (outcome, time.Duration) {
	traceCall(ctx, c.reg, c.args, res, herr)
	switch {
	case replayed:
		c.observed = "replayed"
	case herr != nil:
		c.observed = "failed"
	default:
		c.observed = "succeeded"
	}
	if err := e.publishPatiently(ctx, c.msg, func() error {
		return e.publishResult(context.WithoutCancel(ctx), c.req, res, herr, took, c.deliveries, replayed)
	}); err != nil {
		e.callLog(c.req).Error("result not published; the request will be redelivered", "err", err)
		return outcomePublishFailed, 0
	}
	return outcomeResult, 0
}

// resultPatience is how long the executor keeps trying to publish a result
// (a stream electing a new leader does not answer for seconds) before it
// hands the request back.
const resultPatience = 30 * time.Second

// publishPatiently calls publish until it succeeds, with backoff, for up
// to resultPatience, keeping msg in progress meanwhile: handing the
// request back at the first failure would spend a delivery of its budget
// (which detects crashing handlers) on the bus's failover, and after five
// the call would fail delivery_exhausted although its handler succeeded.
func (e *Executor) publishPatiently(ctx context.Context, msg jetstream.Msg, publish func() error) error {
	return patiently(ctx, resultPatience, publish, func(err error) {
		e.log.Debug("result not published yet; retrying", "err", err)
		_ = msg.InProgress()
	})
}

// patiently calls op until it succeeds, fails with a
// [backoff.Permanent] error, ctx ends or patience has passed (0: no
// bound but ctx), waiting 100 ms doubling to 2 s (±20 %) between
// attempts; onRetry runs before each wait.
func patiently(ctx context.Context, patience time.Duration, op func() error, onRetry func(error)) error {
	b := &backoff.ExponentialBackOff{InitialInterval: 100 * time.Millisecond, RandomizationFactor: 0.2, Multiplier: 2, MaxInterval: 2 * time.Second}
	_, err := backoff.Retry(ctx, func() (struct{}, error) { return struct{}{}, op() },
		backoff.WithBackOff(b), backoff.WithMaxElapsedTime(patience),
		backoff.WithNotify(func(err error, _ time.Duration) { onRetry(err) }))
	return err
}

// execute runs the handler under its timeout and the run's cancellation,
// with heartbeats. A handler that ignores its context is reported as timed
// out at the deadline; its late output is discarded, and its slot stays
// taken until it returns (documented: a context-ignoring handler costs a
// slot for as long as it really runs, so the executor never runs more
// handlers at once than it has slots).
//
// The returned channel, when not nil, closes when an abandoned handler
// finally returns; the caller publishes the timeout first and then waits
// on it before taking more work.
func (e *Executor) execute(ctx context.Context, msg jetstream.Msg, reg *actions.Registered, call actions.Call, timeout time.Duration) (actions.Result, time.Duration, <-chan struct{}, error) {
	runCtx, cancelRun := context.WithCancelCause(ctx)
	defer cancelRun(nil)
	untrack := e.track(call.RunID, call.CallID, cancelRun)
	defer untrack()
	hctx, cancel := context.WithTimeoutCause(runCtx, timeout, context.DeadlineExceeded)
	defer cancel()

	type result struct {
		res actions.Result
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	e.handlers.run(func() {
		res, err := runHandler(hctx, e.intercept(reg.Handler), call)
		done <- result{res, err}
	})
	beat := time.NewTicker(e.heartbeatInterval())
	defer beat.Stop()
	for {
		select {
		case r := <-done:
			err := r.err
			switch cause := context.Cause(hctx); {
			case errors.Is(cause, errShutdown):
				return r.res, time.Since(start), nil, errShutdown
			case errors.Is(cause, ErrRunEnded):
				err = actionbus.Errorf(actionbus.CodeCanceled, "action %s was canceled: its run ended", call.Action)
			case err != nil && errors.Is(err, context.DeadlineExceeded) && actionbus.CodeOf(err) == actionbus.CodeInternal,
				err == nil && errors.Is(hctx.Err(), context.DeadlineExceeded):
				err = timeoutError(call.Action, timeout, false)
			}
			return r.res, time.Since(start), nil, err
		case <-beat.C:
			_ = msg.InProgress()
		case <-hctx.Done():
			if !errors.Is(context.Cause(hctx), context.DeadlineExceeded) {
				continue // canceled: wait for the handler to return
			}
			took := time.Since(start)
			// A handler that honours its context returns right after the
			// deadline: give it a moment before calling it stubborn.
			grace := time.NewTimer(returnGrace)
			select {
			case <-done:
				grace.Stop()
				return actions.Result{}, took, nil, timeoutError(call.Action, timeout, false)
			case <-grace.C:
			}
			e.log.Warn("handler ignored its deadline; reporting a timeout and discarding its late output",
				"action", call.Action, "call_id", call.CallID, "timeout", timeout)
			abandoned := make(chan struct{})
			go func() {
				<-done // the late output is discarded
				close(abandoned)
			}()
			return actions.Result{}, took, abandoned, timeoutError(call.Action, timeout, true)
		}
	}
}

// returnGrace is how long a handler may take to return once its deadline
// passed before it counts as ignoring its context.
const returnGrace = 100 * time.Millisecond

// timeoutError is the timeout failure of an action: the timeout is in its
// details (timeoutMs), and ignoredContext says whether the handler was
// still running after returnGrace (its late output is discarded).
func timeoutError(action string, timeout time.Duration, ignoredContext bool) *actionbus.Error {
	msg := fmt.Sprintf("action %s exceeded its %s timeout", action, timeout)
	if ignoredContext {
		msg += " (the handler ignored its context)"
	}
	return (&actionbus.Error{Code: actionbus.CodeTimeout, Message: msg}).
		WithDetail("timeoutMs", timeout.Milliseconds()).WithDetail("ignoredContext", ignoredContext)
}

func (e *Executor) heartbeatInterval() time.Duration {
	if e.heartbeat > 0 {
		return e.heartbeat
	}
	return bus.DefaultAckWait / 3
}

// runHandler runs h, turning a panic into a handler_failed error.
func runHandler(ctx context.Context, h actions.Handler, call actions.Call) (res actions.Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = (&actionbus.Error{Code: actionbus.CodeHandlerFailed, Message: fmt.Sprintf("handler panicked: %v", p)}).
				WithDetail("stack", string(debug.Stack()))
		}
	}()
	return h(ctx, call)
}

// checkOutput validates the output against the output schema and moves a
// large output into the artifact store.
func (e *Executor) checkOutput(reg *actions.Registered, res *actions.Result) error {
	out, err := json.Marshal(res.Output)
	if err != nil {
		return actionbus.Errorf(actionbus.CodeHandlerFailed, "output is not JSON: %w", err)
	}
	return reg.ValidateOutput(out)
}

func (e *Executor) publishResult(ctx context.Context, req *events.ActionRequested, res actions.Result, herr error, took time.Duration, deliveries int, replayed bool) error {
	err := e.emitResult(ctx, req, res, herr, took, deliveries, replayed)
	if tooLarge := new(actionbus.Error); errors.As(err, &tooLarge) && tooLarge.Code == actionbus.CodePayloadTooLarge {
		// A result the server would refuse becomes a small typed failure
		// (same id: only one of the two can ever be stored), so that the
		// run fails now instead of waiting for its deadline.
		e.log.Warn("result over the server's max payload; reporting payload_too_large", "call_id", req.CallID, "action", req.Action, "err", tooLarge.Message)
		tooLarge.Message = "the result of " + req.Action + " is too large: " + tooLarge.Message
		return e.emitResult(ctx, req, actions.Result{}, tooLarge, took, deliveries, false)
	}
	return err
}

// failure is the error a call's failure is reported as, on its event and
// its span alike: the handler's typed error, or handler_failed for a plain
// one.
func failure(herr error) *actionbus.Error {
	var abErr *actionbus.Error
	if !errors.As(herr, &abErr) {
		abErr = &actionbus.Error{Code: actionbus.CodeHandlerFailed, Message: herr.Error()}
	}
	return abErr
}

func (e *Executor) emitResult(ctx context.Context, req *events.ActionRequested, res actions.Result, herr error, took time.Duration, deliveries int, replayed bool) error {
	id := events.ResultID(req.CallID, req.Attempt)
	ext := []events.Extension{{Name: events.ExtCycle, Value: req.Cycle}, {Name: events.ExtPlanIndex, Value: req.PlanIndex},
		{Name: events.ExtAttempt, Value: req.Attempt}}
	if herr != nil {
		abErr := failure(herr)
		failed := &events.ActionFailed{RunID: req.RunID, CallID: req.CallID, Cycle: req.Cycle, PlanIndex: req.PlanIndex,
			Attempt: req.Attempt, Action: req.Action, Error: *abErr, DurationMs: took.Milliseconds(), Executor: e.cfg.ID, Deliveries: deliveries,
			UserID: req.UserID, StepID: req.StepID, MaxAttempts: req.MaxAttempts}
		_, err := e.bus.Emit(ctx, events.TypeActionFailed, id, events.TenantOr(req.Tenant), req.RunID, "", failed, ext...)
		return err
	}
	done := &events.ActionCompleted{RunID: req.RunID, CallID: req.CallID, Cycle: req.Cycle, PlanIndex: req.PlanIndex,
		Attempt: req.Attempt, Action: req.Action, Output: res.Output, Summary: res.Summary, Complete: res.Complete,
		DurationMs: took.Milliseconds(), Executor: e.cfg.ID, Deliveries: deliveries, Replayed: replayed,
		UserID: req.UserID, StepID: req.StepID, MaxAttempts: req.MaxAttempts}
	if err := e.offload(ctx, req, done); err != nil {
		return err
	}
	_, err := e.bus.Emit(ctx, events.TypeActionCompleted, id, events.TenantOr(req.Tenant), req.RunID, "", done, ext...)
	return err
}

// offload stores an output larger than MaxOutputBytes as an artifact and
// replaces it with its reference (which includes a bounded preview).
func (e *Executor) offload(ctx context.Context, req *events.ActionRequested, done *events.ActionCompleted) error {
	if ref, ok := done.Output.(map[string]any); ok && ref["artifact"] != nil {
		return nil // a replayed reference
	}
	data, err := json.Marshal(done.Output)
	if err != nil || len(data) <= e.outputLimit() {
		return err
	}
	ref, err := e.putArtifact(ctx, req, events.DerivedID(req.CallID, "artifact", "output"), "output", "application/json", data)
	if err != nil {
		return fmt.Errorf("executor: store a %d-byte output as an artifact: %w", len(data), err)
	}
	done.Artifacts = []events.ArtifactRef{ref}
	done.Output = map[string]any{"artifact": ref}
	return nil
}

// outputLimit is the largest output carried inside a result:
// MaxOutputBytes, but never more than half the server's max payload, so
// that an output goes to the artifact store before its result could reach
// the limit.
func (e *Executor) outputLimit() int {
	limit := e.cfg.MaxOutputBytes
	if mp := e.nc.MaxPayload(); mp > 0 && int64(limit) > mp/2 {
		limit = int(mp / 2)
	}
	return limit
}

// putArtifact stores data in the pool's artifact store under id,
// recording the request's tenant and run as its owner.
func (e *Executor) putArtifact(ctx context.Context, req *events.ActionRequested, id, role, mediaType string, data []byte) (events.ArtifactRef, error) {
	return artifacts.Put(ctx, e.artifacts, artifacts.Owner{Tenant: req.Tenant, RunID: req.RunID}, id, role, mediaType, data, e.cfg.PreviewBytes)
}
