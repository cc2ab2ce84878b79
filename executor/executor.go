// Package executor hosts actions: you register typed Go handlers that wrap
// your existing service logic, and Run serves them to an actionbus pool.
// Every executor of a pool shares one durable JetStream consumer, so
// starting another executor process adds capacity with no configuration
// change.
//
// A handler receives validated input and returns a [Result] (output,
// summary, and whether it completes the run) or an error. Errors become
// action.failed events with a stable code: return an *actionbus.Error to
// choose the code, anything else is reported as handler_failed.
//
// The executor does not decide whether an action may run (the dispatcher
// checks modes and policy before publishing a request) and never retries a
// failed handler itself (the dispatcher decides retries).
package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/invopop/jsonschema"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/events"
)

// Mode says what an action does to the world: read, draft, dryRun or
// mutate.
type Mode = actions.Mode

// The action modes. mutate needs explicit allowance in the run and an
// approval.
const (
	ModeRead   = actions.ModeRead
	ModeDraft  = actions.ModeDraft
	ModeDryRun = actions.ModeDryRun
	ModeMutate = actions.ModeMutate
)

// Config configures an [Executor].
type Config struct {
	// Pool is the executor pool; default "default". The pool's work
	// consumer must exist (actionbus provision --pool NAME).
	Pool string
	// Slots bounds concurrent handlers; default 8. Each free slot pulls one
	// message at a time, so nothing waits in a buffer while slots are busy.
	Slots int
	// ID identifies this executor in results and presence; default
	// <hostname>-<pid>-<random>.
	ID string
	// Prefix is the subject prefix; default "ab".
	Prefix string
	// DefaultTimeout bounds an action without its own timeout; default 30s.
	DefaultTimeout time.Duration
	// ShutdownGrace is how long Run waits for running handlers after its
	// context ends before canceling them and handing their messages back;
	// default 10s.
	ShutdownGrace time.Duration
	// Logger receives the executor's logs; nil discards them.
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.Pool == "" {
		c.Pool = events.DefaultPool
	}
	if c.Slots <= 0 {
		c.Slots = 8
	}
	if c.ID == "" {
		host, _ := os.Hostname()
		c.ID = fmt.Sprintf("%s-%d-%s", host, os.Getpid(), events.NewID()[20:])
	}
	if c.Prefix == "" {
		c.Prefix = events.DefaultPrefix
	}
	if c.DefaultTimeout <= 0 {
		c.DefaultTimeout = actions.DefaultTimeout
	}
	if c.ShutdownGrace <= 0 {
		c.ShutdownGrace = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Executor serves registered actions to a pool. Register every action
// before calling Run.
type Executor struct {
	cfg  Config
	nc   *nats.Conn
	js   jetstream.JetStream
	bus  *events.Bus
	topo events.Topology
	reg  *actions.Registry
	log  *slog.Logger

	ready     chan struct{}
	readyOnce sync.Once

	// inflight maps a run id to the cancel functions of its running
	// handlers, so that a run's cancellation reaches them.
	inflightMu sync.Mutex
	inflight   map[string]map[string]context.CancelCauseFunc
}

// New returns an executor using nc. It does not touch the server until Run.
func New(nc *nats.Conn, cfg Config) (*Executor, error) {
	cfg.setDefaults()
	topo := events.Topology{Prefix: cfg.Prefix, Pools: []string{cfg.Pool}}
	if err := topo.Validate(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger.With("service", "executor", "executor_id", cfg.ID, "pool", cfg.Pool)
	bus, err := events.NewBus(js, events.BusConfig{Prefix: cfg.Prefix, Source: "/actionbus/executor/" + cfg.Pool, Logger: log})
	if err != nil {
		return nil, err
	}
	return &Executor{cfg: cfg, nc: nc, js: js, bus: bus, topo: topo, reg: actions.NewRegistry(), log: log, ready: make(chan struct{}),
		inflight: map[string]map[string]context.CancelCauseFunc{}}, nil
}

// Ready is closed once Run has published the executor's actions to the
// catalog and started serving.
func (e *Executor) Ready() <-chan struct{} { return e.ready }

// ID returns the executor's id.
func (e *Executor) ID() string { return e.cfg.ID }

// Action describes an action for [Register].
type Action struct {
	// Name is unique per catalog (letters, digits, '.', '_', '-').
	Name string
	// Description is a short planner-facing description.
	Description string
	// Mode defaults to ModeRead.
	Mode Mode
	// Tier is the default policy tier, 0 (allow) to 3 (deny).
	Tier int
	// InputSchema is the JSON Schema of the input; derived from the
	// handler's input type when empty.
	InputSchema json.RawMessage
	// OutputSchema is the JSON Schema of the output; derived from the
	// handler's output type when empty.
	OutputSchema json.RawMessage
	// Version of the definition; default "1".
	Version string
	// Timeout bounds one execution; default Config.DefaultTimeout.
	Timeout time.Duration
	// Planner is the planner metadata (hide the action, aliases, args
	// example, guidance); nil means visible with defaults.
	Planner *PlannerMeta
	// Permission is what the action may do to the world; missing fields
	// fall back conservatively from the mode.
	Permission *Permission
	// Tags, ResourceType, RiskLevel and Examples document the action.
	Tags         []string
	ResourceType string
	RiskLevel    string
	Examples     []Example
	// AuditPolicy says how much of input, output and error is audited.
	AuditPolicy *AuditPolicy
	// HostOnlyKeys are input keys only the host (workflows, exec) may set;
	// they are stripped from model-planned input.
	HostOnlyKeys []string
	// HealFlattenedInto names an object property of the input that
	// collects arguments a model put beside it instead of inside it.
	HealFlattenedInto string
}

// PlannerMeta is an action's planner metadata.
type PlannerMeta = actions.PlannerMeta

// Permission is an action's declared permission metadata.
type Permission = actions.Permission

// AuditPolicy is an action's audit payload policy.
type AuditPolicy = actions.AuditPolicy

// Example is a documented use of an action.
type Example = actions.Example

// Call describes the invocation a handler serves.
type Call struct {
	RunID   string
	CallID  string
	Action  string
	UserID  string
	Origin  string
	Attempt int
}

// Result is what a handler returns. Complete ends the run with Output.
type Result[Out any] struct {
	Output   Out
	Summary  string
	Complete bool
}

// HandlerFunc is a typed action handler. ctx is canceled at the action's
// timeout and when the run is canceled; honour it.
type HandlerFunc[In, Out any] func(ctx context.Context, in In, call Call) (Result[Out], error)

// Register adds a typed action to ex. It fails with an error matching
// actionbus.ErrActionExists when the name is already registered on ex, and
// when the definition is invalid.
func Register[In, Out any](ex *Executor, a Action, h HandlerFunc[In, Out]) error {
	def := actions.Definition{
		Name: a.Name, Description: a.Description, Mode: a.Mode, Tier: a.Tier,
		InputSchema: a.InputSchema, OutputSchema: a.OutputSchema, Version: a.Version,
		TimeoutMs: a.Timeout.Milliseconds(), Pool: ex.cfg.Pool,
		Planner: a.Planner, DeclaredPermission: a.Permission, Tags: a.Tags, ResourceType: a.ResourceType,
		RiskLevel: a.RiskLevel, Examples: a.Examples, AuditPolicy: a.AuditPolicy, HostOnlyKeys: a.HostOnlyKeys,
		HealFlattenedInto: a.HealFlattenedInto,
	}
	var err error
	if len(def.InputSchema) == 0 {
		if def.InputSchema, err = reflectSchema(new(In)); err != nil {
			return fmt.Errorf("executor: %s: input schema: %w", a.Name, err)
		}
	}
	if len(def.OutputSchema) == 0 {
		if def.OutputSchema, err = reflectSchema(new(Out)); err != nil {
			return fmt.Errorf("executor: %s: output schema: %w", a.Name, err)
		}
	}
	return ex.reg.Register(def, func(ctx context.Context, call actions.Call) (actions.Result, error) {
		var in In
		if err := json.Unmarshal(call.Input, &in); err != nil {
			return actions.Result{}, actionbus.Errorf(actionbus.CodeSchemaValidation, "input does not fit %T: %w", in, err)
		}
		res, err := h(ctx, in, Call{RunID: call.RunID, CallID: call.CallID, Action: call.Action,
			UserID: call.UserID, Origin: call.Origin, Attempt: call.Attempt})
		if err != nil {
			return actions.Result{}, err
		}
		return actions.Result{Output: res.Output, Summary: res.Summary, Complete: res.Complete}, nil
	})
}

func reflectSchema(v any) (json.RawMessage, error) {
	r := &jsonschema.Reflector{ExpandedStruct: true, AllowAdditionalProperties: false}
	s := r.Reflect(v)
	return json.Marshal(s)
}

// Run publishes the executor's actions to the catalog, announces its
// presence and serves its pool until ctx ends. Then it stops pulling, waits
// up to ShutdownGrace for running handlers, cancels the rest and hands
// their messages back (nak) so another executor runs them, and returns.
func (e *Executor) Run(ctx context.Context) error {
	if err := e.topo.Check(ctx, e.js, e.topo.Needs("executor", e.cfg.Pool)); err != nil {
		return err
	}
	catKV, err := e.js.KeyValue(ctx, e.topo.BucketCatalog())
	if err != nil {
		return err
	}
	cat := actions.NewCatalog(catKV)
	for _, def := range e.reg.Definitions() {
		if err := cat.Publish(ctx, def, e.cfg.ID); err != nil {
			return fmt.Errorf("executor: %w", err)
		}
	}
	presence, err := e.js.KeyValue(ctx, e.topo.BucketPresence())
	if err != nil {
		return err
	}
	cons, err := e.js.Consumer(ctx, e.topo.StreamWork(), events.PoolConsumer(e.cfg.Pool))
	if err != nil {
		return err
	}
	// Runs that end while their actions run: cancel those handlers. Core
	// subscriptions see every executor's copy of the terminal event.
	for _, verb := range []string{"canceled", "failed"} {
		sub, err := e.nc.Subscribe(e.topo.Subjects().AnyRun(verb), e.onRunEnded)
		if err != nil {
			return fmt.Errorf("executor: subscribe to run ends: %w", err)
		}
		defer sub.Unsubscribe() //nolint:errcheck // best effort at shutdown
	}
	e.log.Info("executor serving", "actions", len(e.reg.Definitions()), "slots", e.cfg.Slots)
	e.readyOnce.Do(func() { close(e.ready) })

	// Handlers outlive ctx by up to ShutdownGrace: shutdown drains.
	handlerCtx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		e.announce(ctx, presence)
	}()
	var workers sync.WaitGroup
	for i := 0; i < e.cfg.Slots; i++ {
		workers.Add(1)
		go func() {
			defer workers.Done()
			e.work(ctx, handlerCtx, cons)
		}()
	}
	<-ctx.Done()
	drained := make(chan struct{})
	go func() { workers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(e.cfg.ShutdownGrace):
		e.log.Warn("shutdown grace over; canceling running handlers")
		cancelHandlers()
		<-drained
	}
	wg.Wait()
	_ = presence.Delete(context.Background(), e.presenceKey())
	return nil
}

// ErrRunEnded is the cause of a handler context canceled because its run
// was canceled or failed.
var ErrRunEnded = errors.New("executor: the run ended")

func (e *Executor) onRunEnded(m *nats.Msg) {
	runID := e.topo.Subjects().RunIDFromSubject(m.Subject)
	e.inflightMu.Lock()
	calls := e.inflight[runID]
	delete(e.inflight, runID)
	e.inflightMu.Unlock()
	for callID, cancel := range calls {
		e.log.Info("run ended; canceling its running action", "run_id", runID, "call_id", callID)
		cancel(ErrRunEnded)
	}
}

func (e *Executor) track(runID, callID string, cancel context.CancelCauseFunc) (untrack func()) {
	e.inflightMu.Lock()
	if e.inflight[runID] == nil {
		e.inflight[runID] = map[string]context.CancelCauseFunc{}
	}
	e.inflight[runID][callID] = cancel
	e.inflightMu.Unlock()
	return func() {
		e.inflightMu.Lock()
		delete(e.inflight[runID], callID)
		if len(e.inflight[runID]) == 0 {
			delete(e.inflight, runID)
		}
		e.inflightMu.Unlock()
	}
}

func (e *Executor) presenceKey() string { return e.cfg.Pool + "." + e.cfg.ID }

func (e *Executor) announce(ctx context.Context, kv jetstream.KeyValue) {
	val, _ := json.Marshal(map[string]any{"id": e.cfg.ID, "pool": e.cfg.Pool, "slots": e.cfg.Slots, "startedAt": time.Now().UTC()})
	tick := time.NewTicker(events.PresenceTTL / 3)
	defer tick.Stop()
	for {
		if _, err := kv.Put(ctx, e.presenceKey(), val); err != nil && ctx.Err() == nil {
			e.log.Warn("presence not refreshed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// work is one slot: it pulls one message only when it is free.
func (e *Executor) work(ctx, handlerCtx context.Context, cons jetstream.Consumer) {
	for ctx.Err() == nil {
		msg, err := cons.Next(jetstream.FetchContext(ctx))
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
				e.log.Warn("pull failed", "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(200 * time.Millisecond):
				}
			}
			continue
		}
		e.handle(handlerCtx, msg)
	}
}

// handle runs one message and decides its ack outcome.
func (e *Executor) handle(ctx context.Context, msg jetstream.Msg) {
	rec, err := e.bus.Receive(msg.Subject(), msg.Headers(), msg.Data())
	if err != nil {
		if rerr := e.bus.Reject(ctx, msg, events.PoolConsumer(e.cfg.Pool), err); rerr != nil {
			_ = msg.NakWithDelay(time.Second)
			return
		}
		_ = msg.Ack()
		return
	}
	req, ok := rec.Data.(*events.ActionRequested)
	if !ok {
		_ = e.bus.Reject(ctx, msg, events.PoolConsumer(e.cfg.Pool),
			actionbus.Errorf(actionbus.CodeUnknownEventType, "%s does not belong on a work subject", rec.Event.Type()))
		_ = msg.Ack()
		return
	}
	log := e.log.With("run_id", req.RunID, "call_id", req.CallID, "action", req.Action)

	var (
		res  actions.Result
		herr error
		took time.Duration
	)
	md, mdErr := msg.Metadata()
	if mdErr == nil && md.NumDelivered >= events.DefaultMaxDeliver {
		herr = actionbus.Errorf(actionbus.CodeDeliveryExhausted,
			"delivered %d times without a result; not running it again", md.NumDelivered)
	} else {
		res, herr, took = e.execute(ctx, msg, req)
	}

	if err := e.publishResult(context.WithoutCancel(ctx), req, res, herr, took); err != nil {
		log.Error("result not published; handing the request back", "err", err)
		_ = msg.NakWithDelay(time.Second)
		return
	}
	if err := msg.Ack(); err != nil {
		log.Warn("ack failed", "err", err)
	}
}

func (e *Executor) execute(ctx context.Context, msg jetstream.Msg, req *events.ActionRequested) (res actions.Result, err error, took time.Duration) {
	reg, ok := e.reg.Lookup(req.Action)
	if !ok {
		return res, actionbus.Errorf(actionbus.CodeActionNotFound, "action %q is not registered on pool %s", req.Action, e.cfg.Pool), 0
	}
	args, _, issues := reg.Args.Prepare(req.Args, req.Origin)
	if issues != nil {
		return res, actions.ArgsError(req.Action, issues), 0
	}
	input, merr := json.Marshal(args)
	if merr != nil {
		return res, actionbus.Errorf(actionbus.CodeActionArgsInvalid, "input is not JSON: %w", merr), 0
	}
	timeout := e.cfg.DefaultTimeout
	if reg.Def.TimeoutMs > 0 {
		timeout = time.Duration(reg.Def.TimeoutMs) * time.Millisecond
	}
	if req.TimeoutMs > 0 && time.Duration(req.TimeoutMs)*time.Millisecond < timeout {
		timeout = time.Duration(req.TimeoutMs) * time.Millisecond
	}
	runCtx, cancelRun := context.WithCancelCause(ctx)
	defer cancelRun(nil)
	untrack := e.track(req.RunID, req.CallID, cancelRun)
	defer untrack()
	hctx, cancel := context.WithTimeout(runCtx, timeout)
	defer cancel()

	// Heartbeats keep JetStream from redelivering a long-running action.
	stopBeat := make(chan struct{})
	defer close(stopBeat)
	go func() {
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stopBeat:
				return
			case <-t.C:
				_ = msg.InProgress()
			}
		}
	}()

	start := time.Now()
	call := actions.Call{RunID: req.RunID, CallID: req.CallID, Action: req.Action, UserID: req.UserID,
		Origin: req.Origin, Attempt: req.Attempt, Input: input}
	res, err = runHandler(hctx, reg.Handler, call)
	took = time.Since(start)
	if err == nil && hctx.Err() != nil && errors.Is(hctx.Err(), context.DeadlineExceeded) {
		err = actionbus.Errorf(actionbus.CodeTimeout, "action %s exceeded its %s timeout", req.Action, timeout)
	}
	if err != nil && errors.Is(err, context.DeadlineExceeded) && actionbus.CodeOf(err) == actionbus.CodeInternal {
		err = actionbus.Errorf(actionbus.CodeTimeout, "action %s exceeded its %s timeout: %w", req.Action, timeout, err)
	}
	if errors.Is(context.Cause(runCtx), ErrRunEnded) {
		err = actionbus.Errorf(actionbus.CodeCanceled, "action %s was canceled: its run ended", req.Action)
	}
	if err == nil {
		out, merr := json.Marshal(res.Output)
		if merr != nil {
			err = actionbus.Errorf(actionbus.CodeHandlerFailed, "output is not JSON: %w", merr)
		} else if verr := reg.ValidateOutput(out); verr != nil {
			err = verr
		}
	}
	return res, err, took
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

func (e *Executor) publishResult(ctx context.Context, req *events.ActionRequested, res actions.Result, herr error, took time.Duration) error {
	id := events.DerivedID(req.CallID, "result")
	ext := []events.Extension{{Name: events.ExtCycle, Value: req.Cycle}, {Name: events.ExtPlanIndex, Value: req.PlanIndex}}
	if herr != nil {
		var abErr *actionbus.Error
		if !errors.As(herr, &abErr) {
			abErr = &actionbus.Error{Code: actionbus.CodeHandlerFailed, Message: herr.Error()}
		}
		failed := &events.ActionFailed{RunID: req.RunID, CallID: req.CallID, Cycle: req.Cycle, PlanIndex: req.PlanIndex,
			Attempt: req.Attempt, Action: req.Action, Error: *abErr, DurationMs: took.Milliseconds(), Executor: e.cfg.ID}
		_, err := e.bus.Emit(ctx, events.TypeActionFailed, id, req.RunID, "", failed, ext...)
		return err
	}
	done := &events.ActionCompleted{RunID: req.RunID, CallID: req.CallID, Cycle: req.Cycle, PlanIndex: req.PlanIndex,
		Attempt: req.Attempt, Action: req.Action, Output: res.Output, Summary: res.Summary, Complete: res.Complete,
		DurationMs: took.Milliseconds(), Executor: e.cfg.ID}
	_, err := e.bus.Emit(ctx, events.TypeActionCompleted, id, req.RunID, "", done, ext...)
	return err
}
