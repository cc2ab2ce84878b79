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
	"sync"
	"time"

	"github.com/invopop/jsonschema"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/catalog"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/artifacts"
	"github.com/actionbus/actionbus/internal/bus"
)

// Mode says what an action does to the world: read, draft, dryRun or
// mutate. It is [catalog.Mode].
type Mode = catalog.Mode

// The action modes. mutate needs explicit allowance in the run and an
// approval.
const (
	ModeRead   = catalog.ModeRead
	ModeDraft  = catalog.ModeDraft
	ModeDryRun = catalog.ModeDryRun
	ModeMutate = catalog.ModeMutate
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
	// MaxOutputBytes is the largest output carried inside a result; a
	// larger one is stored as an artifact and the result carries a
	// reference and a bounded preview. Default 256 KiB; never more than
	// half the server's max payload, whatever is configured.
	MaxOutputBytes int
	// PreviewBytes bounds an artifact's preview; default 1024.
	PreviewBytes int
	// Logger receives the executor's logs; nil discards them.
	Logger *slog.Logger
	// Observer, when set, sees every action executed (for metrics).
	Observer Observer
	// AnnounceTimeout bounds how long Run (and Publish) wait for a
	// registrar (hosted by the dispatchers) to answer the executor's
	// announcement of its actions and skills, retrying with backoff while
	// none answers; default 1 minute. Past it, Run fails with
	// registrar_unavailable.
	AnnounceTimeout time.Duration
	// JetStreamDomain is the JetStream domain of the cluster, for an
	// executor connected through a leaf node next to its data
	// (deploy/nats/leaf.conf): "actionbus" with deploy/nats's cluster.
	// Default "": an executor connected to the cluster itself.
	JetStreamDomain string
	// Tenants dedicates the executor's pool to these tenants: its actions
	// are offered to their runs' planners only, the dispatcher refuses
	// them to other tenants' runs (tenant_not_served), and the executor
	// refuses such work too. Empty (the default) serves every tenant. All
	// executors of a pool should agree.
	Tenants []string
	// Interceptors wrap every handler call, the first outermost:
	// Interceptors[0] sees the call first and its result last (as
	// Watermill's middleware and Temporal's interceptors). They run only
	// for calls that reach a handler, after the protocol's checks (input
	// validated, approval checked, idempotency key reserved; a refused or
	// replayed call never reaches them), inside the call's timeout and
	// cancellation, and a panic in one fails the call handler_failed as a
	// handler's does. Output they return is validated against the output
	// schema like a handler's. None by default.
	Interceptors []Interceptor
}

// Output is a handler's result as an [Interceptor] sees it: the output
// (a value of the action's output type), summary, and whether it
// completes the run.
type Output struct {
	Output   any
	Summary  string
	Complete bool
}

// Next calls the rest of an interceptor chain: the next interceptor, or
// the handler. The call is the one the interceptor was given; the handler
// always receives the call's validated input, so only ctx (values, a
// tighter deadline) passes changes on.
type Next func(ctx context.Context, call Call) (Output, error)

// Interceptor wraps the handler calls of an executor
// ([Config.Interceptors]): it may act before and after calling next
// (logging, metrics, tracing, an authorization of your own), change the
// context it passes on, fail the call without calling next (an
// *actionbus.Error chooses the code), or change the output next returned.
type Interceptor func(ctx context.Context, call Call, next Next) (Output, error)

// Observer sees an executor's work: the actions it runs and what happens
// to each message it takes. The services' Prometheus metrics implement it.
type Observer interface {
	// ActionStarted is called when a handler is about to run, ActionDone
	// with the outcome ("succeeded", "failed", "replayed", "handed_back")
	// and the time taken.
	ActionStarted()
	ActionDone(action, outcome string, took time.Duration)
}

func (c *Config) setDefaults() {
	if c.MaxOutputBytes <= 0 {
		c.MaxOutputBytes = 256 << 10
	}
	if c.PreviewBytes <= 0 {
		c.PreviewBytes = 1024
	}

	if c.Pool == "" {
		c.Pool = bus.DefaultPool
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
	if c.AnnounceTimeout <= 0 {
		c.AnnounceTimeout = time.Minute
	}
}

// Executor serves registered actions to a pool. Register every action
// before calling Run.
type Executor struct {
	cfg  Config
	nc   *nats.Conn
	js   jetstream.JetStream
	bus  *bus.Bus
	topo bus.Topology
	reg  *actions.Registry
	log  *slog.Logger

	ready     chan struct{}
	readyOnce sync.Once

	// inflight maps a run id to the cancel functions of its running
	// handlers, so that a run's cancellation reaches them.
	inflightMu sync.Mutex
	inflight   map[string]map[string]context.CancelCauseFunc
	// ended remembers runs seen ending, so that their queued calls are
	// answered without running (guarded by inflightMu).
	ended endedRuns

	heartbeat time.Duration
	// handlers runs the handlers (set while ex runs).
	handlers *runners
	idem     jetstream.KeyValue
	// claims are the idempotency bucket keys this process holds a claim
	// on, from its reservation until its result or release is stored: a
	// reservation of its own is never taken over as abandoned, even when
	// its lease could not be renewed (a leaf node's link cut, a stream
	// electing a leader), since this process knows its holder is alive.
	claims    sync.Map
	artifacts artifacts.Store

	// skills are the skills registered on ex, published when it runs.
	skillsMu sync.Mutex
	skills   []Skill

	// running is set once ex runs; published names the actions ex
	// announced (so that Publish can take back those unregistered since).
	pubMu     sync.Mutex
	running   bool
	published map[string]bool
}

// Unregister removes an action from ex; once ex runs, [Executor.Publish]
// takes it out of the catalog. It reports whether the action was
// registered.
func Unregister(ex *Executor, name string) bool { return ex.reg.Remove(name) }

// Publish announces ex's actions and skills to the registrar now, and
// has it take out the actions unregistered since the last announcement
// (Run announces at start; a host that registers or unregisters actions
// while ex runs — mounted MCP servers whose tool list changed — calls
// it). Before Run it does nothing. A refused announcement is an error
// with the registrar's code (catalog_conflict when another pool owns a
// name).
func (e *Executor) Publish(ctx context.Context) error {
	e.pubMu.Lock()
	defer e.pubMu.Unlock()
	if !e.running {
		return nil
	}
	now := map[string]bool{}
	for _, def := range e.reg.Definitions() {
		now[def.Name] = true
	}
	var removed []string
	for name := range e.published {
		if !now[name] {
			removed = append(removed, name)
		}
	}
	if err := e.announce(ctx, removed); err != nil {
		return err
	}
	e.published = now
	return nil
}

// New returns an executor using nc. It does not touch the server until Run.
func New(nc *nats.Conn, cfg Config) (*Executor, error) {
	cfg.setDefaults()
	topo := bus.Topology{Prefix: cfg.Prefix, Pools: []string{cfg.Pool}}
	if err := topo.Validate(); err != nil {
		return nil, err
	}
	for _, t := range cfg.Tenants {
		if err := events.CheckTenant(t); err != nil {
			return nil, fmt.Errorf("executor: Config.Tenants: %w", err)
		}
	}
	log := cfg.Logger.With("service", "executor", "executor_id", cfg.ID, "pool", cfg.Pool)
	// What an executor publishes (results, progress steps) is built by
	// this package, not by handlers (a handler's output is checked against
	// its action's output schema first), and the dispatcher validates
	// every result it receives: the bus checks only the envelope.
	eb, err := bus.Open(nc, bus.BusConfig{Prefix: cfg.Prefix, Source: "/actionbus/executor/" + cfg.Pool, Logger: log, ReceiverValidates: true,
		JetStreamDomain: cfg.JetStreamDomain})
	if err != nil {
		return nil, err
	}
	js := eb.JetStream()
	return &Executor{cfg: cfg, nc: nc, js: js, bus: eb, topo: topo, reg: actions.NewRegistry(), log: log, ready: make(chan struct{}),
		inflight: map[string]map[string]context.CancelCauseFunc{}}, nil
}

// Ready is closed once the registrar has recorded the executor's actions
// in the catalog and Run started serving.
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
	// Limits bound the action's calls across every process: at most
	// MaxInFlight running at once and Rate starting per interval, per
	// concurrency key (docs/limits.md). Calls over the limit wait, fairly,
	// within their run's deadline. Nil limits nothing.
	Limits *Limits
}

// Limits are an action's concurrency key and rate limit. It is
// [catalog.Limits].
type Limits = catalog.Limits

// Rate is a token bucket: Limit calls per PerMs milliseconds, Burst at
// once. It is [catalog.Rate].
type Rate = catalog.Rate

// PlannerMeta is an action's planner metadata. It is
// [catalog.PlannerMeta].
type PlannerMeta = catalog.PlannerMeta

// Permission is an action's declared permission metadata. It is
// [catalog.Permission].
type Permission = catalog.Permission

// AuditPolicy is an action's audit payload policy. It is
// [catalog.AuditPolicy].
type AuditPolicy = catalog.AuditPolicy

// Example is a documented use of an action. It is [catalog.Example].
type Example = catalog.Example

// Call describes the invocation a handler serves.
type Call struct {
	RunID   string
	CallID  string
	Action  string
	UserID  string
	Origin  string
	Attempt int
	// IdempotencyKey is the call's idempotency key ("" when it has none;
	// always set for mutate actions). Use it in your own store to make a
	// side effect happen once even if the executor crashes after the
	// effect and before its result is stored.
	IdempotencyKey string
	// InputHash is the stable hash of the input: SHA-256 over its RFC 8785
	// canonical JSON (docs/approvals.md).
	InputHash string
	// Input is the call's validated input as JSON (a typed handler
	// receives it decoded; interceptors read it here).
	Input json.RawMessage
	// Approval is the verified approval of a call that needed one (always
	// for mutate actions). Re-check it at the mutation point: its
	// Context.InputHash must equal InputHash, and Context.ExpiresAt must
	// not have passed.
	Approval *Approval

	putArtifact func(ctx context.Context, role, mediaType string, data []byte) (ArtifactRef, error)
}

// ArtifactRef names a stored artifact: id, role, media type, size, SHA-256
// and a bounded preview (Truncated when the preview is not all of it). It
// is [events.ArtifactRef] of the public package
// github.com/actionbus/actionbus/events, whose documentation shows its
// fields.
type ArtifactRef = events.ArtifactRef

// ErrNoArtifactStore is returned by [Call.PutArtifact] outside an
// executor's call.
var ErrNoArtifactStore = errors.New("executor: no artifact store for this call")

// PutArtifact stores data (a full log, a large document) in the
// deployment's artifact store, under an id derived from the call and
// role, and returns its reference for the handler's output; clients read
// it back with Client.Artifact (actionbus artifacts get ID). Storing the
// same role again in the same attempt replaces it.
func (c Call) PutArtifact(ctx context.Context, role, mediaType string, data []byte) (ArtifactRef, error) {
	if c.putArtifact == nil {
		return ArtifactRef{}, ErrNoArtifactStore
	}
	return c.putArtifact(ctx, role, mediaType, data)
}

// Approval is a verified approval as a handler sees it. It is
// [events.ApprovalGrant] of the public package
// github.com/actionbus/actionbus/events, whose documentation shows its
// fields.
type Approval = events.ApprovalGrant

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
		HealFlattenedInto: a.HealFlattenedInto, Tenants: ex.cfg.Tenants, Limits: a.Limits,
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
		res, err := h(ctx, in, publicCall(call))
		if err != nil {
			return actions.Result{}, err
		}
		return actions.Result{Output: res.Output, Summary: res.Summary, Complete: res.Complete}, nil
	})
}

// publicCall is the handler's and interceptors' view of a call.
func publicCall(c actions.Call) Call {
	return Call{RunID: c.RunID, CallID: c.CallID, Action: c.Action, UserID: c.UserID, Origin: c.Origin, Attempt: c.Attempt,
		IdempotencyKey: c.IdempotencyKey, InputHash: c.InputHash, Input: c.Input, Approval: c.Approval, putArtifact: c.PutArtifact}
}

// intercept wraps h in the configured interceptors, the first outermost.
func (e *Executor) intercept(h actions.Handler) actions.Handler {
	if len(e.cfg.Interceptors) == 0 {
		return h
	}
	return func(ctx context.Context, ac actions.Call) (actions.Result, error) {
		next := Next(func(ctx context.Context, _ Call) (Output, error) {
			res, err := h(ctx, ac)
			return Output{Output: res.Output, Summary: res.Summary, Complete: res.Complete}, err
		})
		for i := len(e.cfg.Interceptors) - 1; i >= 0; i-- {
			ic, inner := e.cfg.Interceptors[i], next
			next = func(ctx context.Context, call Call) (Output, error) { return ic(ctx, call, inner) }
		}
		out, err := next(ctx, publicCall(ac))
		return actions.Result{Output: out.Output, Summary: out.Summary, Complete: out.Complete}, err
	}
}

func reflectSchema(v any) (json.RawMessage, error) {
	r := &jsonschema.Reflector{ExpandedStruct: true, AllowAdditionalProperties: false}
	s := r.Reflect(v)
	return json.Marshal(s)
}

// Run announces the executor's actions and skills to the registrar
// (which records them in the catalog), keeps its presence and serves its
// pool until ctx ends. Then it stops pulling, waits
// up to ShutdownGrace for running handlers, cancels the rest and hands
// their messages back (nak) so another executor runs them, and returns.
func (e *Executor) Run(ctx context.Context) error {
	if err := e.topo.Check(ctx, e.js, e.topo.Needs("executor", e.cfg.Pool)); err != nil {
		return err
	}
	presence, err := e.js.KeyValue(ctx, e.topo.BucketPresence(e.cfg.Pool))
	if err != nil {
		return err
	}
	if e.idem, err = e.js.KeyValue(ctx, e.topo.BucketIdempotency(e.cfg.Pool)); err != nil {
		return err
	}
	if e.artifacts, err = artifacts.Open(ctx, e.js, e.topo.PoolArtifacts(e.cfg.Pool)); err != nil {
		return err
	}
	e.pubMu.Lock()
	e.running = true
	e.pubMu.Unlock()
	if err := e.Publish(ctx); err != nil {
		return err
	}
	cons, err := e.js.Consumer(ctx, e.topo.StreamWork(), bus.PoolConsumer(e.cfg.Pool))
	if err != nil {
		return err
	}
	// Runs that end while their calls on this pool run or wait in the
	// queue: cancel those handlers, and answer queued calls without
	// running them. The dispatcher tells the pool (the run id only); every
	// executor of the pool hears it.
	ends, err := e.nc.Subscribe(e.topo.Subjects().PoolEnded(e.cfg.Pool), e.onRunEnded)
	if err != nil {
		return fmt.Errorf("executor: subscribe to run ends: %w", err)
	}
	defer ends.Unsubscribe() //nolint:errcheck // best effort at shutdown
	e.log.Info("executor serving", "actions", len(e.reg.Definitions()), "slots", e.cfg.Slots)
	e.readyOnce.Do(func() { close(e.ready) })

	// Handlers outlive ctx by up to ShutdownGrace: shutdown drains. What
	// does not finish in time is canceled with errShutdown and handed back.
	handlerCtx, cancelHandlers := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelHandlers(nil)
	ackWait := bus.DefaultAckWait
	if info, err := cons.Info(ctx); err == nil && info.Config.AckWait > 0 {
		ackWait = info.Config.AckWait
	}
	e.heartbeat = ackWait / 3
	e.handlers = newRunners()
	defer e.handlers.stop()

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		e.present(ctx, presence)
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
		e.log.Warn("shutdown grace over; canceling running handlers and handing their work back")
		cancelHandlers(errShutdown)
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
	runID := string(m.Data)
	if !events.ValidRunID(runID) {
		return
	}
	e.inflightMu.Lock()
	calls := e.inflight[runID]
	delete(e.inflight, runID)
	e.ended.add(runID)
	e.inflightMu.Unlock()
	for callID, cancel := range calls {
		e.log.Info("run ended; canceling its running action", "run_id", runID, "call_id", callID)
		cancel(ErrRunEnded)
	}
}

// runEnded reports whether the executor saw runID end.
func (e *Executor) runEnded(runID string) bool {
	e.inflightMu.Lock()
	defer e.inflightMu.Unlock()
	return e.ended.has(runID)
}

// endedRuns is a bounded set of run ids, oldest forgotten first. A call of
// a run forgotten here still runs and its result is ignored by the
// dispatcher (the run has ended): the set saves work, it does not decide.
type endedRuns struct {
	ids  map[string]struct{}
	ring []string
	next int
}

// endedCapacity bounds the runs an executor remembers ending.
const endedCapacity = 8192

func (r *endedRuns) add(id string) {
	if r.ids == nil {
		r.ids = make(map[string]struct{}, endedCapacity)
		r.ring = make([]string, endedCapacity)
	}
	if _, ok := r.ids[id]; ok {
		return
	}
	if old := r.ring[r.next]; old != "" {
		delete(r.ids, old)
	}
	r.ring[r.next] = id
	r.ids[id] = struct{}{}
	r.next = (r.next + 1) % endedCapacity
}

func (r *endedRuns) has(id string) bool {
	_, ok := r.ids[id]
	return ok
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

// present keeps the executor's presence in its pool's presence bucket.
func (e *Executor) present(ctx context.Context, kv jetstream.KeyValue) {
	val, _ := json.Marshal(map[string]any{"id": e.cfg.ID, "pool": e.cfg.Pool, "slots": e.cfg.Slots, "startedAt": time.Now().UTC()})
	tick := time.NewTicker(bus.PresenceTTL / 3)
	defer tick.Stop()
	for {
		pctx, cancel := bus.Bounded(ctx)
		_, err := kv.Put(pctx, e.presenceKey(), val)
		cancel()
		if err != nil && ctx.Err() == nil {
			e.log.Warn("presence not refreshed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// CheckReady reports whether the streams, consumers and buckets the
// executor's pool needs exist (the /readyz probe).
func (e *Executor) CheckReady(ctx context.Context) error {
	return e.topo.Check(ctx, e.js, e.topo.Needs("executor", e.cfg.Pool))
}
