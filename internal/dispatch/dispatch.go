// Package dispatch is the dispatcher service: the I/O shell around the run
// state machine of package run. For every event it consumes it loads the
// run's state (from its cache, else the runs bucket), applies the event
// ([run.Machine.Apply]), writes the new state together with the effects
// it implies (the outbox) under a revision check, publishes them, and then
// clears the outbox. A crash anywhere in between loses nothing: the event
// is redelivered, the outbox found and published again, and the effects'
// deterministic ids make the copies harmless.
//
// Two dispatchers can share the work without driving a run twice (every
// write is revision-checked). The package does not execute actions
// (executors do), does not plan (planners do), and decides nothing about a
// run itself (package run does).
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions/actionstore"
	"github.com/actionbus/actionbus/internal/artifacts"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/ingress"
	"github.com/actionbus/actionbus/internal/keymutex"
	"github.com/actionbus/actionbus/internal/limits/limitstore"
	"github.com/actionbus/actionbus/internal/metrics"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/readapi"
	"github.com/actionbus/actionbus/internal/registrar"
	"github.com/actionbus/actionbus/internal/run"
	"github.com/actionbus/actionbus/internal/tracing"
)

// Defaults of [Config] beyond the run limits (whose defaults are
// events.Default*), named once for setDefaults and the command's flags.
const (
	DefaultConcurrency  = 64
	DefaultResultLinger = 20 * time.Millisecond
	DefaultAlarmDelay   = time.Second
)

// Config configures a [Dispatcher].
type Config struct {
	// Prefix is the subject prefix; default "ab".
	Prefix string
	// RunLimits bound every run (cycles, plans, deadlines, sizes,
	// budgets); zero fields take their defaults. They are declared once,
	// in package events, where a test stack's options name them too;
	// package run enforces them.
	events.RunLimits
	// Concurrency bounds events handled at once; default 64.
	Concurrency int
	// Policy is the operator's policy configuration (explicit per-action
	// policy, required roles and scopes); nil means tier defaults only. A
	// document under the key "config" of the policy bucket replaces it
	// without a restart.
	Policy *policy.Config
	// ApprovalKeys verify approval tokens (key id to secret).
	ApprovalKeys policy.Keys
	// ResultLinger bounds how long events whose transitions need no write
	// of their own (a plan's results while its other calls are out; a
	// result or decision that hands the run's next work out) are held,
	// unacknowledged, for the run's next write or its end instead of each
	// being written; default 20 ms; negative writes each at once.
	ResultLinger time.Duration
	// AlarmDelay is how long a new run's alarm (its deadline, its first
	// stage's) is held before it is armed, its request unacknowledged
	// meanwhile: a run that ends sooner, as most do, never stores one;
	// default 1 s; negative arms every alarm at once.
	AlarmDelay time.Duration
	// InstanceID names this dispatcher in the source of its events
	// (/actionbus/dispatcher/<id>); default <hostname>-<pid>.
	InstanceID string
	// Logger receives the dispatcher's logs; nil discards them.
	Logger *slog.Logger
	// Metrics records runs and event handling; nil records nothing.
	Metrics *metrics.Metrics
}

func (c *Config) setDefaults() {
	if c.Prefix == "" {
		c.Prefix = events.DefaultPrefix
	}
	c.RunLimits.SetDefaults()
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.ResultLinger == 0 {
		c.ResultLinger = DefaultResultLinger
	}
	if c.AlarmDelay == 0 {
		c.AlarmDelay = DefaultAlarmDelay
	}
	if c.InstanceID == "" {
		host, _ := os.Hostname()
		c.InstanceID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// ParsePlanLimit parses a MaxPlanActions setting from text (a flag or an
// environment variable): a whole number from 1 to 20. Anything else (0,
// 21, 1.5, "ten") is refused, so a bad setting stops the dispatcher at
// start instead of being silently replaced by the default.
func ParsePlanLimit(s string) (int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return 0, fmt.Errorf("dispatch: max plan actions %q is not a whole number", s)
	}
	if n < 1 || n > events.MaxPlanActionsCeiling {
		return 0, fmt.Errorf("dispatch: max plan actions must be 1 to %d (hard ceiling), got %d", events.MaxPlanActionsCeiling, n)
	}
	return n, nil
}

// Validate reports configuration errors.
func (c *Config) Validate() error {
	if err := c.RunLimits.Validate(); err != nil {
		return fmt.Errorf("dispatch: %w", err)
	}
	if c.Concurrency < 1 {
		return fmt.Errorf("dispatch: Concurrency must be at least 1, got %d", c.Concurrency)
	}
	return bus.Topology{Prefix: c.Prefix}.Validate()
}

// Dispatcher is the dispatcher service.
type Dispatcher struct {
	cfg      Config
	js       jetstream.JetStream
	bus      *bus.Bus
	topo     bus.Topology
	log      *slog.Logger
	locks    *keymutex.Striped
	runs     jetstream.KeyValue
	requests jetstream.Stream // read by an admission (firstOfRun)
	// trustFirstMark: the requests stream has one replica, so its ingress
	// marks a run's first request and an admission believes the mark
	// (ingress.MarksFirstOfRun).
	trustFirstMark bool
	artifacts      artifacts.Store
	cat            *actionstore.View
	catKV          jetstream.KeyValue // skills are read from it
	ready          chan struct{}
	cache          *stateCache
	checkers       *checkerCache
	policy         atomic.Pointer[policy.Evaluator]
	machine        *run.Machine
	limits         *limitstore.Store
	wakes          *wakeups
	alarms         *endedAlarms
	deferred       *deferredAlarms
	unsent         *unpublished
	// outboxFresh is how long a stored outbox may still be unsent (half
	// the streams' duplicate window); see carriedOutbox.
	outboxFresh time.Duration

	queueMu sync.Mutex
	queues  map[string]*runQueue
	// held counts the events held unacknowledged in runs' held states
	// (see heldState), across runs.
	held atomic.Int64
	// endWaits counts the readers waiting for an end in flight
	// (endedState); at most maxEndWaits wait at once.
	endWaits atomic.Int32

	// crashAfterWrite, set by tests, simulates a crash between storing a
	// state and publishing its outbox when it returns true: nothing is
	// published, the event is handed back, the cache is lost.
	crashAfterWrite func(runID string) bool
	// crashAfterEnd, set by tests, simulates a crash between publishing
	// a run's end and writing its state (see endFirst) when it returns
	// true.
	crashAfterEnd func(runID string) bool
	// crashHandingOut, set by tests, simulates a crash of an admission
	// that handed its work out before its state was stored when it
	// returns true: the work is published, the state is not, the request
	// is handed back.
	crashHandingOut func(runID string) bool
	// failHandingOut, set by tests, fails an admission's hand-out of a run
	// admitted unstored, before it publishes, with the error it returns.
	failHandingOut func(runID string) error

	// ids derives runs' id keys (nil until Run has read it).
	ids *idSecret
	// earlyWork lets admissions hand their work out while their state is
	// written (see admit): the streams deduplicate long enough.
	earlyWork bool
	// stateTTL is the runs bucket's TTL (0: states never expire), read at
	// start: a run's end is its commit only from a state stored within
	// half of it (see endIsCommit).
	stateTTL time.Duration

	// fences are the partitions' fences this dispatcher holds.
	fences *fences
}

// errSimulatedCrash is what a simulated crash returns.
var errSimulatedCrash = errors.New("dispatch: simulated crash after the state write")

// Ready is closed once Run has loaded the catalog and started serving.
func (d *Dispatcher) Ready() <-chan struct{} { return d.ready }

// New returns a dispatcher using nc.
func New(nc *nats.Conn, cfg Config) (*Dispatcher, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger.With("service", "dispatcher")
	eb, err := bus.Open(nc, bus.BusConfig{Prefix: cfg.Prefix, Source: "/actionbus/dispatcher/" + cfg.InstanceID, Logger: log, ReceiverValidates: true})
	if err != nil {
		return nil, err
	}
	d := &Dispatcher{cfg: cfg, js: eb.JetStream(), bus: eb, topo: bus.Topology{Prefix: cfg.Prefix}, log: log, locks: keymutex.New(256),
		ready: make(chan struct{}), cache: newStateCache(stateCacheEntries), checkers: newCheckerCache(), queues: map[string]*runQueue{}}
	d.policy.Store(&policy.Evaluator{Config: cfg.Policy})
	d.wakes = newWakeups(d)
	d.alarms = newEndedAlarms(log)
	d.deferred = newDeferredAlarms(d, cfg.AlarmDelay)
	d.unsent = newUnpublished()
	d.machine = run.New(env{d}, d.machineConfig())
	d.fences = newFences(d.js, d.bus.Subjects(), cfg.InstanceID)
	return d, nil
}

// machineConfig is the configuration of the dispatcher's machines: its
// own and those that rebuild or replay a run.
func (d *Dispatcher) machineConfig() run.Config {
	return run.Config{Limits: d.cfg.RunLimits, ArtifactStore: d.topo.BucketArtifacts()}
}

// Run serves run requests, decisions, results and cancels until ctx ends,
// then waits for events in hand to finish.
func (d *Dispatcher) Run(ctx context.Context) error {
	if err := d.topo.Check(ctx, d.js, d.topo.Needs("dispatcher", "")); err != nil {
		return err
	}
	var err error
	if d.runs, err = d.js.KeyValue(ctx, d.topo.BucketRuns()); err != nil {
		return err
	}
	if d.ids, err = loadIDSecret(ctx, d.runs); err != nil {
		return err
	}
	if d.requests, err = d.js.Stream(ctx, d.topo.StreamRequests()); err != nil {
		return err
	}
	d.trustFirstMark = ingress.MarksFirstOfRun(d.requests.CachedInfo().Config)
	status, err := d.runs.Status(ctx)
	if err != nil {
		return err
	}
	d.stateTTL = status.TTL()
	go d.ids.keepFresh(ctx)
	if d.earlyWork, err = d.deduplicationCoversReadmission(ctx); err != nil {
		return err
	}
	if d.artifacts, err = artifacts.Open(ctx, d.js, d.topo.BucketArtifacts()); err != nil {
		return err
	}
	if d.catKV, err = d.js.KeyValue(ctx, d.topo.BucketCatalog()); err != nil {
		return err
	}
	// The registrar: the catalog's only writer, from the executors'
	// announcements.
	owners, err := d.js.KeyValue(ctx, d.topo.BucketCatalogOwners())
	if err != nil {
		return err
	}
	if err := registrar.New(d.bus, d.catKV, owners, d.log).Serve(ctx, d.js.Conn()); err != nil {
		return err
	}
	if d.cat, err = actionstore.NewCatalog(d.catKV, actionstore.WithLogger(d.log)).Watch(ctx); err != nil {
		return err
	}
	if err := d.watchPolicy(ctx); err != nil {
		return err
	}
	if err := d.openLimits(ctx); err != nil {
		return err
	}
	if d.outboxFresh, err = d.freshOutboxes(ctx); err != nil {
		return err
	}
	d.wakes.start(ctx)
	timers, err := d.js.Stream(ctx, d.topo.StreamTimers())
	if err != nil {
		return err
	}
	d.alarms.start(ctx, timers)
	stopDeferred := context.AfterFunc(ctx, d.deferred.release)
	defer stopDeferred()
	go d.republish(ctx)
	// The read service: tenants read their runs, audit records,
	// artifacts and the catalog through it (they hold no JetStream).
	// Every dispatcher answers in one queue group.
	reads, err := readapi.New(d.js.Conn(), readapi.Config{Prefix: d.cfg.Prefix, Catalog: d.cat, Logger: d.cfg.Logger})
	if err != nil {
		return err
	}
	if err := reads.Start(); err != nil {
		return fmt.Errorf("dispatch: start the read service: %w", err)
	}
	defer reads.Stop()
	// The ingress: the one writer of the requests stream. Tenants'
	// requests, cancels, inputs and approvals' answers reach it as
	// requests on their run subjects; it stores each under the tenant's
	// namespaced message id, with only its CloudEvents headers.
	in, err := ingress.New(d.js.Conn(), ingress.Config{Prefix: d.cfg.Prefix, Logger: d.cfg.Logger, MarkFirstOfRun: d.trustFirstMark})
	if err != nil {
		return err
	}
	if err := in.Start(); err != nil {
		return fmt.Errorf("dispatch: start the ingress: %w", err)
	}
	defer in.Stop()
	d.log.Info("dispatcher serving")
	close(d.ready)
	// The runs' events: each partition's by the one dispatcher that owns
	// it (see partitions).
	return d.servePartitions(ctx)
}

// drainGrace is how long a partition's transitions in hand may go on once
// the dispatcher stops serving it (see [bus.ServeOptions.DrainGrace]).
const drainGrace = 2 * time.Second

// serveConsumer serves one of a partition's consumers until ctx ends,
// then lets the events in hand finish. An error (the consumer deleted
// under it, or unreadable) is retried: the partition is served until it
// is handed on.
func (d *Dispatcher) serveConsumer(ctx context.Context, c bus.ConsumerSpec) {
	opts := bus.ServeOptions{Name: c.Config.Durable, Concurrency: d.cfg.Concurrency, PriorityGroup: bus.OwnerGroup,
		PullExpiry: bus.PartitionPullExpiry, DrainGrace: drainGrace}
	if d.cfg.Metrics != nil {
		opts.Observer = d.cfg.Metrics
	}
	if c.Stream == d.topo.StreamRequests() {
		opts.OnReject = d.onRejected
	}
	for ctx.Err() == nil {
		cons, err := d.js.Consumer(ctx, c.Stream, c.Config.Durable)
		if err == nil {
			err = d.bus.Serve(ctx, cons, opts, d.handle)
		}
		if err == nil || ctx.Err() != nil {
			return
		}
		d.log.Warn("partition consumer not served; retrying", "consumer", c.Config.Durable, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// onRejected answers a rejected run request: when its subject names a
// valid run id that no run has yet, the run is created failed, with the
// rejection's code, and its run.failed published, so that whoever waits on
// the id learns why. A run that exists is left alone: junk sent on a live
// run's subject must not end it. Only the run's first message in the
// requests stream creates it so: a run may exist with no state stored
// (admitUnstored), and one with any earlier message is left alone.
func (d *Dispatcher) onRejected(ctx context.Context, msg jetstream.Msg, reason error) error {
	subjects := d.bus.Subjects()
	tenant, runID := subjects.RunFromSubject(msg.Subject())
	if !events.ValidRunID(runID) || !events.ValidTenant(tenant) || msg.Subject() != subjects.Run(tenant, runID, "requested") {
		return nil
	}
	unlock := d.locks.Lock(runID)
	defer unlock()
	// Only the run's first message in the requests stream may create it
	// failed: after another, the run may exist unstored (admitUnstored).
	if first, err := d.firstOfRun(ctx, msg); err != nil || !first {
		return err
	}
	abErr := &actionbus.Error{Code: actionbus.CodeOf(reason), Message: "run.requested rejected"}
	var typed *actionbus.Error
	if errors.As(reason, &typed) {
		abErr.Message = "run.requested rejected: " + typed.Message
	}
	st, out := d.machine.Rejected(tenant, runID, d.idKey(tenant, runID), abErr)
	return d.admit(ctx, st, out, nil)
}

func (d *Dispatcher) handle(ctx context.Context, r *events.Received, msg jetstream.Msg) error {
	if req, ok := r.Data.(*events.RunRequested); ok {
		req.Tenant = r.Tenant // the subject's, which permissions bind
		ctx, span := tracing.Tracer().Start(tracing.Parent(ctx, tracing.RunOfEvent(r.Event)), "dispatcher run.requested",
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(tracing.RunIDKey.String(req.RunID), tracing.TenantKey.String(r.Tenant), tracing.EventIDKey.String(r.Event.ID())))
		defer span.End()
		unlock := d.locks.Lock(req.RunID)
		defer unlock()
		st, out, err := d.start(ctx, req, r.Event)
		if err != nil {
			return err
		}
		return d.admit(ctx, st, out, msg)
	}
	runID := r.RunID()
	if runID == "" {
		d.log.Warn("ignoring an event the dispatcher does not handle", "type", r.Event.Type(), "subject", r.Subject)
		return nil
	}
	var pos string
	if meta, err := msg.Metadata(); err == nil {
		pos = storedAt(meta)
	}
	err := d.transition(ctx, r.Tenant, runID, run.Event{ID: r.Event.ID(), Data: r.Data}, r.Event.Type(), pos, firstFreshDelivery(msg, time.Now()))
	if errors.Is(err, errNoState) {
		return d.unknownRun(ctx, r, msg, err)
	}
	return err
}

// start is the run req starts, with the effects of its admission settled,
// as the machine decides it now. Its trace starts with the span of ev's
// publisher, else with ctx's.
func (d *Dispatcher) start(ctx context.Context, req *events.RunRequested, ev *event.Event) (*run.State, []run.Effect, error) {
	st, out, err := d.machine.Start(ctx, req, d.idKey(req.Tenant, req.RunID))
	if err == nil {
		out, err = d.machine.Settle(ctx, env{d}, st, out)
	}
	if err != nil {
		return nil, nil, err
	}
	if st.Trace = tracing.RunOfEvent(ev); st.Trace == nil {
		st.Trace = tracing.RunOf(ctx)
	}
	return st, out, nil
}

// errNoState is a transition's error when its run has no stored state.
var errNoState = errors.New("no such run")

// unknownRun answers an event whose run has no state. A run whose end is
// stored ended without a state written (admitUnstored): the event meets
// an ended run, which it no longer changes, and is acknowledged. A
// client's or approver's event (a cancel, an input, an approval's answer:
// the requests stream) for a run whose request is not stored names a run
// that was never requested (or aged out): it is rejected once,
// run_not_found, instead of being redelivered until its deliveries run
// out. Any other such event is retried (the run.requested may still be
// on its way, or be delivered again to admit the run again), by
// returning err.
func (d *Dispatcher) unknownRun(ctx context.Context, r *events.Received, msg jetstream.Msg, err error) error {
	runID := r.RunID()
	end, eerr := d.readEnd(ctx, &run.State{RunID: runID, Tenant: events.TenantOr(r.Tenant), IDKey: d.idKey(r.Tenant, runID)})
	if eerr != nil {
		return err
	}
	if end != nil {
		if end.Type != events.TypeRunCompleted {
			// Failed or canceled, and its writer died before the ended
			// state: it is written now (commitUnstoredEnd).
			admitted, _, aerr := d.admittedFromRequest(ctx, r.Tenant, runID)
			if aerr != nil {
				return err
			}
			if cerr := d.commitUnstoredEnd(ctx, admitted, end, nil); cerr != nil {
				return cerr
			}
		}
		d.log.Debug("event for a run that ended unstored; nothing left to change", "run_id", runID, "type", r.Event.Type())
		return nil
	}
	md, mdErr := msg.Metadata()
	if mdErr != nil || md.Stream != d.topo.StreamRequests() {
		return err
	}
	// A batch direct get, as the read service reads (what the dispatcher's
	// user may ask in operator mode).
	stored, serr := d.requestStored(ctx, r.Tenant, runID)
	if serr != nil || stored {
		return err // requested (its state is on its way), or not known now
	}
	return bus.Rejection(run.NoRun(runID, r.Tenant))
}

// admit creates a new run's state, with its effects in the outbox, and
// publishes them. Create only: the first request of a run creates it; a
// republished request, or another dispatcher that got there first, finds
// it and changes nothing, except that an outbox still in the stored state
// (the creator crashed before publishing) is published.
//
// msg is the request as delivered (nil: a rejected request, or one not
// from the requests stream). Its first delivery, stored a moment ago,
// lets the admission hand its work out while the state is written,
// instead of after: one stored write fewer on the run's path, an fsync
// where the server syncs every write. And when it is also the first
// message of the run in the requests stream, the admission may store no
// state at all (admitUnstored). What makes that safe is that the run's
// ids are derived from its tenant and id ([idSecret]): whoever admits the
// run again — its request delivered again because this dispatcher died
// before the state was written, or to the partition's next owner — hands
// out the same work items, which the work stream deduplicates by message
// id, and a result that comes back before the state exists is handed back
// until the state does (errNoState). Any other admission reads first: a
// request stored again past the streams' duplicate window, or delivered
// again after its run ended unstored, hands nothing out (commitUnstoredEnd).
func (d *Dispatcher) admit(ctx context.Context, st *run.State, out []run.Effect, msg jetstream.Msg) error {
	_, fence, err := d.fences.ensure(ctx, st.RunID)
	if err != nil {
		return err
	}
	st, val, err := d.admitted(st, out, fence)
	if err != nil {
		return err
	}
	work, afterWork := run.LeadingWork(st.Outbox)
	early := firstFreshDelivery(msg, time.Now()) && d.earlyWork && len(work) > 0 && !st.IsTerminal()
	var rev uint64
	handedOut := false
	switch held := d.deferred.admitted(st.RunID); {
	case held != nil:
		// This dispatcher holds the run, admitted unstored: its request
		// came again (republished under another id, or delivered again
		// while held: its acknowledgement must not leave the run
		// unstored), so the run is stored as admitted first.
		cctx, cancel := bus.Bounded(ctx)
		_, err = d.runs.Create(cctx, st.RunID, held)
		cancel()
		if err == nil {
			err = jetstream.ErrKeyExists
		}
	case early:
		var first bool
		if first, err = d.firstUnstored(ctx, msg, st.RunID); err != nil {
			break
		}
		if first && d.deferred.room() && !holdsSlot(st) {
			return d.admitUnstored(ctx, st, fence)
		}
		if !first {
			var end *endInStream
			if st, val, end, err = d.readmitted(ctx, st, val, msg, fence); err != nil || end != nil {
				return d.commitUnstoredEnd(ctx, st, end, err)
			}
			work, afterWork = run.LeadingWork(st.Outbox)
		}
		rev, handedOut, err = d.createHandingOut(ctx, st, val, work)
	default:
		// A request delivered again, or stored again: the run may have
		// ended without a state stored (admitUnstored).
		var end *endInStream
		if st, val, end, err = d.readmitted(ctx, st, val, msg, fence); err != nil || end != nil {
			return d.commitUnstoredEnd(ctx, st, end, err)
		}
		rev, err = d.create(ctx, st.RunID, val)
	}
	if errors.Is(err, jetstream.ErrKeyExists) {
		// A request delivered again: its first delivery may have been
		// held with its run's alarm by a dispatcher that crashed
		// (deferredAlarms), so the alarm is armed again.
		if err := d.flushStored(ctx, st.RunID, false); err != nil {
			return err
		}
		return d.rearm(ctx, st.RunID)
	}
	if err != nil {
		return err
	}
	d.cfg.Metrics.RunStarted(string(st.Kind))
	if st.IsTerminal() {
		d.cfg.Metrics.RunEnded(string(st.Kind), string(st.Status), 0)
	}
	if handedOut {
		// The stored outbox holds the work; what is left to publish is
		// what follows it.
		st.Outbox = afterWork
	}
	// The run's alarm is held (deferredAlarms): the request is settled
	// when the run ends or the alarm is armed.
	rest, settled := d.deferred.hold(ctx, st, st.Outbox)
	if settled == nil {
		return d.flush(ctx, st, rev, fence)
	}
	st.Outbox = rest
	if err := d.flush(ctx, st, rev, fence); err != nil {
		d.deferred.take(st.RunID, nil) // the request is redelivered and arms it
		return err
	}
	return bus.Later(settled)
}

// admitted is run st as an admission under fence stores it, with out, the
// effects of its admission, armed and in its outbox; and its encoding. A
// request that cannot be held as state creates its run failed, without
// what made it too large.
func (d *Dispatcher) admitted(st *run.State, out []run.Effect, fence uint64) (*run.State, []byte, error) {
	st.Outbox = run.Dedupe(run.ArmAdmitted(st, out, time.Now(), d.cfg.ActionGrace))
	st.Fence = fence
	val, err := st.Encode()
	if err != nil {
		return nil, nil, bus.Permanent(err)
	}
	if tooLarge := d.stateTooLarge(val); tooLarge != nil {
		failed, fout := d.machine.Rejected(st.Tenant, st.RunID, st.IDKey, tooLarge)
		failed.Kind, failed.UserID, failed.Trace = st.Kind, st.UserID, st.Trace
		failed.Outbox, failed.Fence = fout, fence
		st = failed
		if val, err = st.Encode(); err != nil {
			return nil, nil, bus.Permanent(err)
		}
	}
	return st, val, nil
}

// readmitted is run st, admitted from msg by an admission other than the
// fast path, as its first request admits it (fromFirstRequest), with its
// encoding, and the run's stored end when it has one (the run may have
// ended without a state stored: admitUnstored).
func (d *Dispatcher) readmitted(ctx context.Context, st *run.State, val []byte, msg jetstream.Msg, fence uint64) (*run.State, []byte, *endInStream, error) {
	st, val, err := d.fromFirstRequest(ctx, st, val, msg, fence)
	if err != nil {
		return nil, nil, nil, err
	}
	end, err := d.readEnd(ctx, st)
	return st, val, end, err
}

// fromFirstRequest is the run st, admitted from msg, as the run's first
// request in the requests stream admits it, with its encoding: st and val
// themselves when msg is that request, or is not from the requests
// stream, or no request the dispatcher would take is stored. A run is
// what its first request says, as readers rebuild it (admittedFromRequest):
// a client may store a second, different request for its run (another
// id) while a dispatcher holds the first unstored, and should that
// dispatcher die, the second may come to the partition's next owner
// before the first comes again. Admitted from the second, the run would
// record its action and arguments, and apply to them the result of the
// call the first handed out. One read, made only by an admission that is
// not a request's first delivery as its run's first message.
func (d *Dispatcher) fromFirstRequest(ctx context.Context, st *run.State, val []byte, msg jetstream.Msg, fence uint64) (*run.State, []byte, error) {
	if msg == nil {
		return st, val, nil
	}
	md, err := msg.Metadata()
	if err != nil || md.Stream != d.topo.StreamRequests() {
		return st, val, nil
	}
	first, err := d.storedRequest(ctx, st.Tenant, st.RunID)
	if err != nil {
		return nil, nil, err
	}
	if first == nil || first.pos == storedAt(md) {
		return st, val, nil
	}
	req := *first.rec.Data.(*events.RunRequested)
	req.Tenant = first.rec.Tenant
	fst, out, err := d.start(ctx, &req, first.rec.Event)
	if err != nil {
		return nil, nil, err
	}
	return d.admitted(fst, out, fence)
}

// admitUnstored admits run st, on the first delivery of the first message
// of the run in the requests stream, without storing its state: its work
// goes out at once, its alarm and its request are held (deferredAlarms),
// and its state is kept in the cache, as this dispatcher's own, written
// under fence at revision 0 — none. The run's next write creates it (a
// revision-checked write expecting none), and so does the alarm when
// Config.AlarmDelay passes with the run still going; a run that completes
// first ends from it (endFirst) and is never in the bucket: its ended
// state is its request and its end, which readers rebuild
// (loadTenantRun). A one-action run so stores one write fewer (an fsync
// where the server syncs every write); in messages, the read that tells
// the run's first request (firstOfRun) takes the write's place.
//
// Nothing is lost by a crash: the request, unacknowledged until the run
// ends or its state is created, comes again, and finding neither state
// nor end, its next owner admits the run again with the same ids
// (admit). Nothing is run twice by it either: only the first delivery
// of the run's first message in the stream, for a run not in the bucket,
// is admitted so (firstUnstored), so no state or end of the run can exist
// yet.
func (d *Dispatcher) admitUnstored(ctx context.Context, st *run.State, fence uint64) error {
	outbox := st.Outbox
	st.Outbox = nil
	val, err := st.Encode()
	if err != nil {
		return bus.Permanent(err)
	}
	rest, settled := d.deferred.holdAdmitted(ctx, st, outbox, val)
	if settled == nil {
		return fmt.Errorf("dispatch: run %s: its alarm could not be held", st.RunID)
	}
	err = nil
	if d.failHandingOut != nil {
		err = d.failHandingOut(st.RunID)
	}
	if err == nil {
		err = d.publishOrFail(ctx, st, rest)
	}
	if err != nil {
		// The request is handed back: its next delivery stores the run.
		d.deferred.take(st.RunID, nil)
		return err
	}
	if d.crashHandingOut != nil && d.crashHandingOut(st.RunID) {
		d.deferred.take(st.RunID, nil)
		return errSimulatedCrash
	}
	d.cfg.Metrics.RunStarted(string(st.Kind))
	d.cache.put(st, 0, fence)
	return bus.Later(settled)
}

// holdsSlot reports whether a call of st holds a slot of a limit: a run
// that does is stored at admission, so that its slot is released by
// whoever ends it, whatever happens to this dispatcher.
func holdsSlot(st *run.State) bool {
	for _, c := range st.Calls {
		if c.LimitKey != "" {
			return true
		}
	}
	return false
}

// firstUnstored reports whether msg, a request on its first delivery, is
// the first message the requests stream holds of its run, and the run has
// no state in the bucket: read at once (two direct gets). Then no state
// or end of the run can exist — a run whose request aged out of the
// requests stream while its state is kept (the bucket's TTL counts from
// the run's last write) is found in the bucket — and the run may be
// admitted unstored. A run found in the bucket is jetstream.ErrKeyExists.
func (d *Dispatcher) firstUnstored(ctx context.Context, msg jetstream.Msg, runID string) (bool, error) {
	stored := make(chan error, 1)
	go func() {
		gctx, cancel := bus.Bounded(ctx)
		defer cancel()
		_, err := d.runs.Get(gctx, runID)
		stored <- err
	}()
	first, ferr := d.firstOfRun(ctx, msg)
	switch err := <-stored; {
	case err == nil:
		return false, jetstream.ErrKeyExists
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return false, err
	}
	return first, ferr
}

// firstOfRun reports whether msg, a request on its first delivery, is the
// first message the requests stream holds of its run: no request of the
// run was admitted before it. The ingress marks a request the stream
// stored only as its run's first (ingress.FirstOfRunHeader), so a marked
// one is told without a read; an unmarked one by one direct get of the
// next message on the run's subjects from the stream's start.
func (d *Dispatcher) firstOfRun(ctx context.Context, msg jetstream.Msg) (bool, error) {
	md, err := msg.Metadata()
	if err != nil || md.Stream != d.topo.StreamRequests() {
		return false, nil
	}
	if d.trustFirstMark && msg.Headers().Get(ingress.FirstOfRunHeader) == "1" {
		return true, nil
	}
	tenant, runID := d.bus.Subjects().RunFromSubject(msg.Subject())
	if tenant == "" || runID == "" {
		return false, nil
	}
	gctx, cancel := bus.Bounded(ctx)
	defer cancel()
	m, err := d.requests.GetMsg(gctx, 1, jetstream.WithGetMsgSubject(d.bus.Subjects().Run(tenant, runID, ">")))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil // a replica behind: not known to be the first
	}
	if err != nil {
		return false, fmt.Errorf("dispatch: run %s: reading its first request: %w", runID, err)
	}
	return m.Sequence == md.Sequence.Stream, nil
}

// commitUnstoredEnd answers an admission of run st, as admitted again from
// its request, that found the run's stored end (err: the read failed):
// nothing is handed out. A completed run's end is its commit, and nothing
// is written. A failed or canceled run's ended state must be stored — a
// retry reuses what it says its calls did — and its writer died after the
// end, before the write (endFirst): it is written now, rebuilt from what
// the end names (repair), with what the end implies published.
func (d *Dispatcher) commitUnstoredEnd(ctx context.Context, st *run.State, end *endInStream, err error) error {
	if err != nil || end.Type == events.TypeRunCompleted {
		return err
	}
	_, fence, err := d.fences.ensure(ctx, st.RunID)
	if err != nil {
		return err
	}
	st.Outbox = nil
	ended, outbox := d.repair(ctx, st, end, nil)
	ended.Outbox = outbox
	err = d.commitAdopted(ctx, ended, 0, fence)
	if bus.IsRevisionConflict(err) {
		return nil // written meanwhile
	}
	return err
}

// create stores a new run's state.
func (d *Dispatcher) create(ctx context.Context, runID string, val []byte) (uint64, error) {
	cctx, cancel := bus.Bounded(ctx)
	defer cancel()
	return d.runs.Create(cctx, runID, val)
}

// createHandingOut stores a new run's state while it publishes the work
// its admission hands out (see [Dispatcher.admit]). It reports whether the
// work was published; when it was not (refused, or the state was found
// stored already), the outbox publishes it after the state, as any other
// admission's. A state found stored is jetstream.ErrKeyExists.
func (d *Dispatcher) createHandingOut(ctx context.Context, st *run.State, val []byte, work []run.Effect) (uint64, bool, error) {
	gctx, cancel := bus.Bounded(ctx)
	_, err := d.runs.Get(gctx, st.RunID)
	cancel()
	switch {
	case err == nil:
		return 0, false, jetstream.ErrKeyExists
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return 0, false, err
	}
	if d.crashHandingOut != nil && d.crashHandingOut(st.RunID) {
		_ = d.publish(ctx, st, work)
		return 0, false, errSimulatedCrash
	}
	published := make(chan error, 1)
	go func() { published <- d.publish(ctx, st, work) }()
	rev, err := d.create(ctx, st.RunID, val)
	perr := <-published
	if perr != nil && err == nil {
		d.log.Debug("work handed out with the admission was not published; the outbox publishes it", "run_id", st.RunID, "err", perr)
	}
	return rev, perr == nil, err
}

// rearm arms the alarm of the stored run runID again, unless this
// dispatcher holds it (see [run.Rearm]).
func (d *Dispatcher) rearm(ctx context.Context, runID string) error {
	if d.deferred.holds(runID) {
		return nil
	}
	st, _, adopted, _, err := d.loadOwned(ctx, runID)
	if err != nil || adopted {
		return err // an adopted end is written by the run's next event
	}
	alarm, ok := run.Rearm(st)
	if !ok {
		return nil
	}
	return d.publish(ctx, st, []run.Effect{alarm})
}

// loadStored reads the stored state of runID from the bucket; a run this
// dispatcher admitted unstored, and holds (admitUnstored), is read as
// admitted, at revision 0 (its next write creates it).
func (d *Dispatcher) loadStored(ctx context.Context, runID string) (*run.State, jetstream.KeyValueEntry, error) {
	gctx, cancel := bus.Bounded(ctx)
	entry, err := d.runs.Get(gctx, runID)
	cancel()
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		if val := d.deferred.admitted(runID); val != nil {
			entry, err = unstoredEntry{key: runID, val: val}, nil
		}
	}
	if err != nil {
		return nil, nil, err
	}
	st, err := decodeState(runID, entry.Value())
	if err != nil {
		return nil, nil, err
	}
	return &st, entry, nil
}

// unstoredEntry is the entry of a run state not in the bucket: revision
// 0, which a revision-checked write expects of a key that has none.
type unstoredEntry struct {
	key string
	val []byte
	at  time.Time
}

func (e unstoredEntry) Bucket() string                  { return "" }
func (e unstoredEntry) Key() string                     { return e.key }
func (e unstoredEntry) Value() []byte                   { return e.val }
func (e unstoredEntry) Revision() uint64                { return 0 }
func (e unstoredEntry) Created() time.Time              { return e.at }
func (e unstoredEntry) Delta() uint64                   { return 0 }
func (e unstoredEntry) Operation() jetstream.KeyValueOp { return jetstream.KeyValuePut }

// loadTenantRun is loadStored for a reader acting for tenant: another
// tenant's run is jetstream.ErrKeyNotFound, as a missing one, and told
// as fast. A run that is in the bucket nowhere — admitted unstored and
// completed with its end as its commit, or held by its dispatcher still —
// is read as admitted from its stored request (admittedFromRequest).
func (d *Dispatcher) loadTenantRun(ctx context.Context, tenant, runID string) (*run.State, jetstream.KeyValueEntry, error) {
	st, entry, err := d.loadStored(ctx, runID)
	if err == nil && st.TenantOrDefault() != events.TenantOr(tenant) {
		// Another tenant's run is looked for as a missing one is, so that
		// the time taken tells neither from the other.
		err = jetstream.ErrKeyNotFound
	}
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		st, entry, err = d.admittedFromRequest(ctx, tenant, runID)
	}
	if err == nil && st.TenantOrDefault() != events.TenantOr(tenant) {
		return nil, nil, jetstream.ErrKeyNotFound
	}
	return st, entry, err
}

// decodeState decodes a stored run state; one that does not decode is a
// permanent error (retrying cannot mend it).
func decodeState(runID string, b []byte) (run.State, error) {
	st, err := run.DecodeState(b)
	if err != nil {
		return st, bus.Permanent(fmt.Errorf("dispatch: corrupt state of run %s: %w", runID, err))
	}
	return st, nil
}

// freshOutboxes returns how long a stored outbox may be unsent: half the
// shortest duplicate window of the streams the outbox publishes to.
func (d *Dispatcher) freshOutboxes(ctx context.Context) (time.Duration, error) {
	window := time.Duration(0)
	for _, name := range []string{d.topo.StreamRuns(), d.topo.StreamTimers(), d.topo.StreamWork()} {
		st, err := d.js.Stream(ctx, name)
		if err != nil {
			return 0, err
		}
		if w := st.CachedInfo().Config.Duplicates; window == 0 || w < window {
			window = w
		}
	}
	return window / 2, nil
}

// carriedOutbox is the outbox of a state read from the bucket at
// revision, if it may still be unsent. A published outbox is not cleared —
// that would cost a write per transition — so a stored outbox is usually
// sent already: surely when this dispatcher sent it (the cache remembers),
// and when it was written more than outboxFresh ago (a writer that crashed
// before sending leaves the event that produced it unacknowledged,
// redelivered within the consumer's ack wait, well inside that time).
// Sending it again past the streams' duplicate window would store its
// events twice — a work item would run again — so it is not. A younger
// outbox another dispatcher wrote is sent again: its events' ids make that
// harmless to the streams (core subscribers may see an event twice).
func (d *Dispatcher) carriedOutbox(st *run.State, revision uint64) []run.Effect {
	if d.cache.sentAt(st.RunID, revision) || time.Since(st.UpdatedAt) > d.outboxFresh {
		return nil
	}
	return st.Outbox
}

// flushStored publishes the outbox of the stored state of runID when it
// may still be unsent (carriedOutbox), or, with unsent, whatever it is:
// the caller knows its publish failed.
func (d *Dispatcher) flushStored(ctx context.Context, runID string, unsent bool) error {
	st, entry, adopted, fence, err := d.loadOwned(ctx, runID)
	if err != nil {
		return err
	}
	if adopted {
		return d.commitAdopted(ctx, st, entry.Revision(), fence)
	}
	if !unsent {
		st.Outbox = d.carriedOutbox(st, entry.Revision())
	}
	if len(st.Outbox) == 0 {
		d.cache.put(st, entry.Revision(), writtenUnder(st, fence))
		return nil
	}
	return d.flush(ctx, st, entry.Revision(), writtenUnder(st, fence))
}

// flush publishes the outbox of st (stored at revision rev). It stays in
// the stored state — the run's next write drops it, and a reader only
// sends it again while it may be unsent (carriedOutbox) — and the state
// is cached (the cache owns st from then on): a cached state's outbox is
// known sent. Until the outbox is published the state is not cached, so
// a failed publish is retried from the stored outbox.
//
// fence is the partition fence under which this dispatcher wrote rev (0:
// it read the state, or wrote it unfenced): a run whose cached state this
// dispatcher wrote under its current fence may publish its end first
// (see endFirst).
func (d *Dispatcher) flush(ctx context.Context, st *run.State, rev, fence uint64) error {
	if d.crashAfterWrite != nil && d.crashAfterWrite(st.RunID) {
		d.cache.drop(st.RunID)
		return errSimulatedCrash
	}
	if st.IsTerminal() {
		// Before the end, which the run's followers hear at once: see
		// tellPools.
		d.tellPools(st)
	}
	if err := d.publishOrFail(ctx, st, st.Outbox); err != nil {
		d.cache.drop(st.RunID)
		if ctx.Err() == nil {
			d.unsent.add(st.RunID)
		}
		return err
	}
	if st.IsTerminal() {
		d.endCommitted(st)
	}
	d.cache.put(st, rev, fence)
	return nil
}

// writtenUnder returns fence if st, as read from the bucket, was written
// under it (by this dispatcher: no other holds its fence), else 0.
func writtenUnder(st *run.State, fence uint64) uint64 {
	if fence != 0 && st.Fence == fence {
		return fence
	}
	return 0
}

// endCommitted cancels the alarm of run st, whose end is committed (its
// ended state written, or its end stored as the commit: see endIsCommit):
// it has nothing left to watch (unless it was never armed).
func (d *Dispatcher) endCommitted(st *run.State) {
	if !d.deferred.ended(st.RunID) {
		d.alarms.cancel(d.bus.Subjects().Schedule(st.TenantOrDefault(), st.RunID, "*"))
	}
}

// tellPools tells the executors of every pool with a call of the ended run
// st in flight that it ended (core NATS, the run id only): they stop the
// call, or answer it run_ended if it has not started. Best effort: a
// signal lost leaves the call to run to its end, and its result is
// ignored. Executors are told nothing else of runs: not their outputs,
// nor of runs with nothing on their pool.
//
// It is called before the end is published, on the same connection, so
// that the server has sent the signal before anyone hears the end: told
// after the end's acknowledgement, a client that heard the cancel and
// freed the executor's slot had the run's queued call started before its
// executor heard of the end. An end decided but then refused (its
// partition fenced by another dispatcher) is decided again from the same
// events by the next owner, so the signal is not early for nothing.
func (d *Dispatcher) tellPools(st *run.State) {
	for _, pool := range st.PoolsInFlight() {
		if err := d.js.Conn().Publish(d.bus.Subjects().PoolEnded(pool), []byte(st.RunID)); err != nil {
			d.log.Warn("executors not told that a run ended", "run_id", st.RunID, "pool", pool, "err", err)
		}
	}
}

// job is one event waiting to be applied to its run.
type job struct {
	ev run.Event
	// typ is the event's type and span the context of the span that
	// sent it, for the transition's span.
	typ  string
	span trace.SpanContext
	// tenant is the tenant the event's subject names.
	tenant string
	// pos is where the event is stored (storedAt); empty for one the
	// dispatcher made itself (a capacity check).
	pos string
	// refused is set when the job's event is refused on its merits (it
	// names the run under another tenant); the batch goes on without it.
	refused error
	// first says the event is on its first delivery, stored a moment ago
	// (firstFreshDelivery): only such events hand work out from a held
	// state (see Dispatcher.holds).
	first bool
	// ahead is set when the job's event answers a transition not applied
	// yet (run.ErrAhead): the batch goes on without it, and it is handed
	// back to come again.
	ahead bool
	done  chan error
}

// transition applies ev to the stored state of runID. Events of one run
// that arrive while a transition of that run is being stored are applied
// together in the next one (group commit): one read, one revision-checked
// write and one publish batch for all of them, which is what keeps a
// plan's results from queueing behind each other's round trips.
func (d *Dispatcher) transition(ctx context.Context, tenant, runID string, ev run.Event, typ, pos string, first bool) error {
	j := &job{ev: ev, typ: typ, pos: pos, first: first, span: trace.SpanContextFromContext(ctx), tenant: tenant, done: make(chan error, 1)}
	d.queueMu.Lock()
	q, leading := d.queues[runID]
	if !leading {
		q = &runQueue{wake: make(chan struct{}, 1)}
		d.queues[runID] = q
	}
	q.jobs = append(q.jobs, j)
	d.queueMu.Unlock()
	if leading {
		select {
		case q.wake <- struct{}{}: // a leader holding results waits for it
		default:
		}
	} else {
		d.lead(ctx, runID, q)
	}
	select {
	case err := <-j.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runQueue holds the jobs of one run waiting for its leader; wake tells a
// leader that holds results (see heldState) that more came.
type runQueue struct {
	jobs []*job
	wake chan struct{}
}

// heldState is a run's state with events applied that it has not written:
// results of a plan or workflow whose other calls are still out (their
// transitions imply live progress only, see run.LiveOnly), and results and
// decisions whose transitions hand work out (the next step of a chain, the
// next decision request: see Dispatcher.holds), published at once.
// Storing each such state would put a write between every result and the
// next; instead they are stored with the run's next event that must be
// written, or with its end (the commit, naming them), or after
// Config.ResultLinger. Their messages stay unacknowledged until then, so a
// crash loses nothing: they are redelivered and applied again, in any
// order (an event ahead of the run is handed back: run.ErrAhead).
type heldState struct {
	st       *run.State
	revision uint64 // the stored revision st was applied on
	fence    uint64 // the fence under which this dispatcher wrote revision (0: read)
	jobs     []*job // the events applied to st since
}

// maxHeld is how many events may be held at once across runs: half the
// workers that handle events, so that holding never starves the events
// that end the hold.
func (d *Dispatcher) maxHeld() int64 { return int64(max(1, d.cfg.Concurrency/2)) }

// lead applies queued jobs of runID batch by batch until none is left
// and nothing is held.
func (d *Dispatcher) lead(ctx context.Context, runID string, q *runQueue) {
	var held *heldState
	var linger *time.Timer // from the first event held
	defer func() {
		if linger != nil {
			linger.Stop()
		}
	}()
	for {
		d.queueMu.Lock()
		batch := q.jobs
		q.jobs = nil
		if len(batch) == 0 && held == nil {
			delete(d.queues, runID)
			d.queueMu.Unlock()
			return
		}
		d.queueMu.Unlock()
		if len(batch) == 0 {
			select {
			case <-q.wake:
				continue
			case <-linger.C:
			case <-ctx.Done():
			}
		}
		// Events keep being held while they come; the linger's end (no
		// batch) stores what is held.
		next, err := d.applyBatch(ctx, runID, held, batch, len(batch) > 0 && d.cfg.ResultLinger > 0)
		if next != nil {
			d.held.Add(int64(len(batch)))
			if held == nil {
				linger = time.NewTimer(d.cfg.ResultLinger)
			}
			held = next
			continue
		}
		done := batch
		if held != nil {
			d.held.Add(-int64(len(held.jobs)))
			done = append(held.jobs, batch...)
			held = nil
			linger.Stop()
		}
		for _, j := range done {
			switch {
			case j.refused != nil:
				j.done <- bus.Rejection(j.refused)
			case j.ahead && err == nil:
				j.done <- errAhead
			default:
				j.done <- err
			}
		}
	}
}

// applyBatch is the shell around one transition: load, apply, store the
// new state with its outbox, publish, clear. With held, the batch applies
// on top of the held state (and, should that be stale, the held events
// are applied again on the stored state); with mayHold, a transition that
// implies live progress only is not stored but returned to be held.
func (d *Dispatcher) applyBatch(ctx context.Context, runID string, held *heldState, batch []*job, mayHold bool) (*heldState, error) {
	unlock := d.locks.Lock(runID)
	defer unlock()
	var span trace.Span
	defer func() {
		if span != nil {
			span.End()
		}
	}()
	all := batch
	if held != nil {
		all = append(slices.Clip(held.jobs), batch...)
	}
	// The partition's fence comes before any read of the run's state.
	p, fence, err := d.fences.ensure(ctx, runID)
	if err != nil {
		return nil, err
	}
	for attempt := 0; attempt < 20; attempt++ {
		// A cached state is one whose outbox was published; its revision
		// makes a stale copy (another dispatcher wrote since) fail the
		// update and be reloaded. Taken out of the cache, it is this
		// transition's to change. A held state is taken the same way.
		var st *run.State
		var revision uint64
		var cached bool
		var written uint64 // the fence under which this dispatcher wrote st
		apply := all
		if held != nil && attempt == 0 {
			st, revision, written, cached, apply = held.st, held.revision, held.fence, true, batch
		} else {
			var c cachedState
			c, cached = d.cache.take(runID)
			st, revision, written = c.st, c.revision, c.fence
		}
		fresh := !cached || attempt > 0
		var stored []byte        // the state as read from the bucket, when fresh
		var adopted []run.Effect // what a stored end adopted implies (loadOwned)
		var adoptedEnd bool      // st ended by adopting its stored end
		if fresh {
			loaded, entry, end, _, err := d.loadOwnedEnd(ctx, runID)
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				// An event for a run we do not know (yet): the
				// run.requested may still be on its way; retry with
				// backoff, bounded by MaxDeliver (a client's event for a
				// run never requested is rejected: see unknownRun).
				return nil, fmt.Errorf("dispatch: run %s: %w", runID, errNoState)
			}
			if err != nil {
				return nil, err
			}
			st, revision, stored, written = loaded, entry.Revision(), entry.Value(), 0
			if end != nil {
				st, adopted = d.repair(ctx, st, end, apply)
				adoptedEnd, st.Outbox = true, nil
			}
		}
		// The run may end first (endFirst) only from a state this
		// dispatcher wrote under its current fence of the partition.
		mayEndFirst := !fresh && written != 0 && written == fence
		if span == nil {
			ctx, span = d.traceTransition(ctx, st, batch)
		}
		// An outbox read from the bucket may never have been published (its
		// writer crashed): it goes out again with this transition's.
		var carried []run.Effect
		if fresh {
			carried = d.carriedOutbox(st, revision)
		}
		st.Outbox = nil
		wasTerminal, lastWrite := st.IsTerminal(), st.UpdatedAt
		effects, ordered, err := d.applyJobs(ctx, st, apply)
		if err != nil {
			return nil, err
		}
		// The jobs in the order they were applied (those ahead last), so
		// that the end names its events in the order a reader must apply
		// them again (recompute).
		if held != nil && attempt == 0 {
			all = append(slices.Clip(held.jobs), ordered...)
		} else {
			all = ordered
		}
		out := append(adopted, effects...)
		// Wake-ups are not stored: a transition that only implies them
		// changes nothing to write.
		out, wakes := run.Stored(out)
		d.wakes.schedule(st, wakes)
		if mayHold && len(carried) == 0 && !st.IsTerminal() && d.held.Load()+int64(len(batch)) <= d.maxHeld() && d.holds(st, all, &out) {
			// Progress is live, and the work a result or decision hands
			// out is derived from events that stay unacknowledged until
			// the state is written (see heldState): it goes out now, the
			// state with the run's next write.
			if err := d.publish(ctx, st, out); err != nil {
				return nil, err
			}
			return &heldState{st: st, revision: revision, fence: written, jobs: all}, nil
		}
		if len(out) == 0 && (held != nil && attempt == 0 || adoptedEnd) {
			// The held events changed the state, or it adopted the run's
			// stored end: it is written (should the held state be stale,
			// the write fails and all is applied again on the stored
			// state).
			out = []run.Effect{run.Saved(st, time.Now())}
		}
		if len(out) == 0 {
			if !fresh {
				// "Nothing to do" is only trusted on the stored state: a
				// cached copy may predate what another dispatcher wrote
				// (a result for a call this copy does not know yet).
				continue
			}
			// Nothing to store: what is cached is the stored state, not
			// st (applying may have touched it without effects).
			unchanged, err := decodeState(runID, stored)
			if err != nil {
				return nil, err
			}
			if len(carried) > 0 {
				unchanged.Outbox = carried
				return nil, d.flush(ctx, &unchanged, revision, writtenUnder(&unchanged, fence))
			}
			d.cache.put(&unchanged, revision, writtenUnder(&unchanged, fence))
			return nil, nil
		}
		// The transition's timers become pending timers of the state,
		// under one armed schedule (the alarm).
		st.Outbox = run.Dedupe(append(carried, run.Arm(st, out, time.Now())...))
		st.UpdatedAt, st.Fence = time.Now().UTC(), fence
		after, err := st.Encode()
		if err != nil {
			return nil, bus.Permanent(err)
		}
		if tooLarge := d.stateTooLarge(after); tooLarge != nil {
			// The new state could never be stored: the run fails from the
			// state as it is stored, with the limit named.
			d.log.Warn("run state over the server's max payload; failing the run", "run_id", runID, "bytes", len(after))
			current, entry, isAdopted, _, err := d.loadOwned(ctx, runID)
			if err != nil {
				return nil, err
			}
			if isAdopted {
				// Its end is stored: nothing is left to fail.
				return nil, d.commitAdopted(ctx, current, entry.Revision(), fence)
			}
			st, revision, mayEndFirst = current, entry.Revision(), false
			st.Outbox = run.Dedupe(append(d.carriedOutbox(st, revision), run.Arm(st, d.machine.FailWith(st, tooLarge), time.Now())...))
			st.UpdatedAt, st.Fence = time.Now().UTC(), fence
			if after, err = st.Encode(); err != nil {
				return nil, bus.Permanent(err)
			}
		}
		if mayEndFirst && !wasTerminal && st.IsTerminal() {
			applied := slices.DeleteFunc(slices.Clone(all), func(j *job) bool { return j.ahead })
			return nil, d.endFirst(ctx, st, revision, after, p, fence, applied, lastWrite)
		}
		uctx, cancel := bus.Bounded(ctx)
		rev, err := d.runs.Update(uctx, runID, after, revision)
		cancel()
		if err != nil {
			d.cache.drop(runID)
			if bus.IsRevisionConflict(err) {
				d.stateConflict(runID)
				continue
			}
			return nil, err
		}
		if !wasTerminal && st.IsTerminal() {
			d.cfg.Metrics.RunEnded(string(st.Kind), string(st.Status), st.UpdatedAt.Sub(st.CreatedAt))
		}
		return nil, d.flush(ctx, st, rev, fence)
	}
	return nil, fmt.Errorf("dispatch: run %s: too many concurrent updates", runID)
}

// applyJobs applies the events of jobs to st, in order, and returns the
// effects and the jobs in the order their events were applied, those
// still ahead last. An event ahead of the run (run.ErrAhead) is applied
// again after the others, as long as one of them moves the run on: a
// held transition's events, delivered again after its dispatcher died,
// come in any order. Those still ahead are marked so: their jobs are
// handed back.
func (d *Dispatcher) applyJobs(ctx context.Context, st *run.State, jobs []*job) ([]run.Effect, []*job, error) {
	var out []run.Effect
	ordered := make([]*job, 0, len(jobs))
	for _, j := range jobs {
		j.ahead = false
	}
	for pending := jobs; len(pending) > 0; {
		var later []*job
		for _, j := range pending {
			if j.refused = st.CheckTenant(j.tenant); j.refused != nil {
				ordered = append(ordered, j)
				continue
			}
			effects, err := d.machine.Apply(ctx, st, j.ev)
			if errors.Is(err, run.ErrAhead) {
				later = append(later, j)
				continue
			}
			if err == nil {
				// What the transition asks of the shell is done before
				// the next event is applied: it may read an artifact
				// this one stored.
				effects, err = d.machine.Settle(ctx, env{d}, st, effects)
			}
			if err != nil {
				return nil, nil, err
			}
			ordered = append(ordered, j)
			out = append(out, effects...)
		}
		if len(later) == len(pending) {
			for _, j := range later {
				j.ahead = true
			}
			ordered = append(ordered, later...)
			break
		}
		pending = later
	}
	return out, ordered, nil
}

// holds reports whether the transition that brought st to its state by
// the events of jobs, implying *out, may be held: its state written with
// the run's next write instead of now. That is so when it implies only
// live progress (run.LiveOnly), or when it hands work out from events of
// the runs stream alone (freshFromRunsStream, run.HandsOutHeld) and its state
// could be stored; *out then has its timers folded into st (run.Arm).
// Like an admission's early hand-out, it needs the streams to deduplicate
// for twice the ack wait (earlyWork): a dispatcher that dies holding the
// events hands the same work out again when they come again.
func (d *Dispatcher) holds(st *run.State, jobs []*job, out *[]run.Effect) bool {
	if run.LiveOnly(*out) {
		return true
	}
	now := time.Now()
	if !d.earlyWork || !freshFromRunsStream(d.topo.StreamRuns(), jobs) || !run.HandsOutHeld(st, *out, now) {
		return false
	}
	*out = run.Arm(st, *out, now)
	// Work is not handed out for a state that could never be stored: its
	// next write fails the run (payload_too_large).
	val, err := st.Encode()
	return err == nil && d.stateTooLarge(val) == nil
}

// errAhead hands back an event that answers a transition of its run not
// applied yet (run.ErrAhead): it comes again after the event that makes
// that transition.
var errAhead = fmt.Errorf("dispatch: %w", run.ErrAhead)

// freshFromRunsStream reports whether every event of jobs is one the runs
// stream holds (a decision, a result) on its first delivery, stored a
// moment ago: a transition of only those may hand its work out from a
// held state, because a dispatcher that dies holding it leaves each of
// them to come again — with deliveries to spare, within the streams'
// duplicate window. A client's event (a cancel, an input, an approval's
// answer) or a timer's is committed with the state it changes, and so is
// an event delivered again (after a crash, or handed back ahead of its
// run): the state is written before its work goes out, as before.
func freshFromRunsStream(stream string, jobs []*job) bool {
	prefix := stream + ":"
	for _, j := range jobs {
		if !j.first || !strings.HasPrefix(j.pos, prefix) {
			return false
		}
	}
	return true
}

// stateConflict notes a run state write that another writer beat: with
// each run's events served by its partition's one owner, that happens
// only while a partition moves (or an operator's `actionbus retry` claims
// a run), so it is counted and logged.
func (d *Dispatcher) stateConflict(runID string) {
	d.cfg.Metrics.StateConflict()
	d.log.Info("run state write conflict", "run_id", runID)
}

// traceTransition starts the span of one transition of a run: a child of
// the span that sent its first event, else of the run's starting context,
// linked to the senders of the other events applied with it.
func (d *Dispatcher) traceTransition(ctx context.Context, st *run.State, batch []*job) (context.Context, trace.Span) {
	parent := ctx
	if len(batch) > 0 && batch[0].span.IsValid() {
		parent = trace.ContextWithRemoteSpanContext(ctx, batch[0].span)
	} else {
		parent = tracing.Parent(trace.ContextWithSpanContext(ctx, trace.SpanContext{}), st.Trace)
	}
	name := "dispatcher"
	if len(batch) > 0 {
		name += " " + strings.TrimPrefix(batch[0].typ, "io.actionbus.")
	}
	var links []trace.Link
	for _, j := range batch[min(1, len(batch)):] {
		if j.span.IsValid() {
			links = append(links, trace.Link{SpanContext: j.span})
		}
	}
	return tracing.Tracer().Start(parent, name, trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(links...),
		trace.WithAttributes(tracing.RunIDKey.String(st.RunID), tracing.TenantKey.String(st.TenantOrDefault()),
			tracing.CycleKey.Int(st.Cycle), attribute.Int("actionbus.events", len(batch))))
}

// publish renders effects from st and publishes them in one batch, work
// for other services first (run.WorkFirst), the live steps as one
// run.progress event (run.Progress).
func (d *Dispatcher) publish(ctx context.Context, st *run.State, effects []run.Effect) error {
	_, err := d.publishWith(ctx, st, effects, nil)
	return err
}

// publishWith is [Dispatcher.publish] with endHeader added to the run's
// end, if the effects hold it (the fence of an end published first), and
// returns the stream sequence the end was stored at (0 without one). The
// run's slots are released once the events are stored: a refused end
// leaves them to the transition that ends the run instead.
func (d *Dispatcher) publishWith(ctx context.Context, st *run.State, effects []run.Effect, endHeader nats.Header) (uint64, error) {
	ctx = tracing.WithRun(ctx, st.Trace)
	batch := make([]events.Emission, 0, len(effects))
	end := -1 // the end's index in batch
	var releases []run.Effect
	for _, e := range run.Progress(st, run.WorkFirst(effects)) {
		if e.Kind == run.EffectRelease {
			releases = append(releases, e)
			continue
		}
		if e.Kind == run.EffectTimer {
			fired := e.Timer.Fired
			batch = append(batch, d.bus.TimerEmission(e.ID, st.TenantOrDefault(), e.Timer.Name, e.Timer.At, &fired))
			continue
		}
		if em, ok := run.Render(st, e); ok {
			if e.Kind == run.EffectEnd {
				end = len(batch)
				if endHeader != nil {
					em.Header = endHeader
				}
			}
			batch = append(batch, em)
		}
	}
	var endSeq uint64
	if len(batch) > 0 {
		seqs, err := d.bus.EmitAll(ctx, batch)
		if err != nil {
			return 0, err
		}
		if end >= 0 {
			endSeq = seqs[end]
		}
	}
	for _, e := range releases {
		if err := d.release(ctx, e); err != nil {
			return 0, err
		}
	}
	for _, e := range effects {
		if e.Kind == run.EffectTimer && e.Timer.Name != run.AdmittedAlarm {
			// A schedule of the run is stored: an admission alarm held
			// is not needed.
			d.deferred.superseded(st.RunID)
			break
		}
	}
	return endSeq, nil
}

// stateHeadroom is kept below the server's max payload for the headers of
// a key-value write.
const stateHeadroom = 4 << 10

// stateTooLarge returns a payload_too_large error when a run state of that
// encoding could not be stored (it would exceed the server's max payload),
// and nil otherwise.
func (d *Dispatcher) stateTooLarge(state []byte) *actionbus.Error {
	return bus.OverPayload(d.js.Conn(), "run state", int64(len(state)), stateHeadroom)
}

// publishOrFail publishes effects. An event the server would refuse (over
// its max payload) can never be published, so retrying is pointless: the
// run is failed at once with payload_too_large, naming the event and its
// size, instead of waiting for its deadline.
func (d *Dispatcher) publishOrFail(ctx context.Context, st *run.State, effects []run.Effect) error {
	err := d.publish(ctx, st, effects)
	tooLarge := overPayload(err)
	if tooLarge == nil {
		return err
	}
	d.log.Warn("an event of the run is over the server's max payload; failing the run", "run_id", st.RunID, "err", tooLarge.Message)
	return d.failStored(ctx, st.RunID, tooLarge)
}

// overPayload is err's payload_too_large error, if it is one.
func overPayload(err error) *actionbus.Error {
	var tooLarge *actionbus.Error
	if errors.As(err, &tooLarge) && tooLarge.Code == actionbus.CodePayloadTooLarge {
		return tooLarge
	}
	return nil
}

// failStored ends the stored run with abErr (replacing a terminal event
// that could not be published) and publishes its run.failed.
func (d *Dispatcher) failStored(ctx context.Context, runID string, abErr *actionbus.Error) error {
	for attempt := 0; attempt < 10; attempt++ {
		st, entry, adopted, fence, err := d.loadOwned(ctx, runID)
		if err != nil {
			return err
		}
		if adopted {
			// Its end is stored: nothing is left to fail.
			return d.commitAdopted(ctx, st, entry.Revision(), fence)
		}
		if t := st.Terminal; t != nil && t.Error != nil && t.Error.Code == actionbus.CodePayloadTooLarge {
			return d.publish(ctx, st, st.Outbox)
		}
		wasTerminal := st.IsTerminal()
		// Only the failure goes out: whatever else the outbox held is what
		// could not be published.
		st.Outbox = run.Arm(st, d.machine.FailWith(st, abErr), time.Now()) // a run that ended keeps no timers
		st.UpdatedAt, st.Fence = time.Now().UTC(), fence
		val, err := st.Encode()
		if err != nil {
			return bus.Permanent(err)
		}
		uctx, cancel := bus.Bounded(ctx)
		rev, err := d.runs.Update(uctx, runID, val, entry.Revision())
		cancel()
		if bus.IsRevisionConflict(err) {
			d.stateConflict(runID)
			continue
		}
		if err != nil {
			return err
		}
		if !wasTerminal {
			d.cfg.Metrics.RunEnded(string(st.Kind), string(st.Status), st.UpdatedAt.Sub(st.CreatedAt))
		}
		if err := d.publish(ctx, st, st.Outbox); err != nil {
			return err
		}
		// The outbox stays stored, as every published outbox does (see
		// carriedOutbox): the cache knows it sent.
		d.cache.put(st, rev, fence)
		return nil
	}
	return fmt.Errorf("dispatch: run %s: too many concurrent updates", runID)
}

// CheckReady reports whether the streams, consumers and buckets the
// dispatcher needs exist (the /readyz probe).
func (d *Dispatcher) CheckReady(ctx context.Context) error {
	return d.topo.Check(ctx, d.js, d.topo.Needs("dispatcher", ""))
}
