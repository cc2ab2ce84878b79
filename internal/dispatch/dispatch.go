// Package dispatch is the dispatcher service: it owns run state (observe,
// orient, decide, act, evaluate), asks the planner for decisions, validates
// them, fans actions out to executor pools with bounded parallelism,
// reassembles results in declaration order, and ends every run with exactly
// one terminal event.
//
// Run state lives in a JetStream key-value bucket and is only updated with
// revision checks, so a restarted dispatcher finishes what it started and
// two dispatchers can share the work without driving a run twice. The
// package does not execute actions (executors do) and does not plan
// (planners do).
package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/events"
	"github.com/actionbus/actionbus/internal/keymutex"
	"github.com/actionbus/actionbus/internal/metrics"
	"github.com/actionbus/actionbus/internal/policy"
)

// Plan limits.
const (
	DefaultMaxPlanActions  = 10
	MaxPlanActionsCeiling  = 20
	DefaultMaxPlanParallel = 8
	DefaultMaxCycles       = 12
)

// Config configures a [Dispatcher].
type Config struct {
	// Prefix is the subject prefix; default "ab".
	Prefix string
	// MaxCycles bounds planner cycles per run; default 12.
	MaxCycles int
	// MaxPlanActions bounds the actions of one plan; default 10, at most 20.
	MaxPlanActions int
	// MaxPlanParallel bounds a plan's actions in flight; default 8.
	MaxPlanParallel int
	// MaxSectionParallel bounds the synthesis requests of a per-action
	// synthesis in flight; default 4.
	MaxSectionParallel int
	// Concurrency bounds events handled at once; default 64.
	Concurrency int
	// MaxFailedRounds stops the loop when the same action failed this many
	// consecutive rounds; default 2.
	MaxFailedRounds int
	// RunDeadline bounds a whole run unless the request gives its own;
	// default 10 minutes.
	RunDeadline time.Duration
	// DecisionTimeout bounds one planner decision; default 2 minutes.
	DecisionTimeout time.Duration
	// ActionGrace is added to an action's own timeout before the
	// dispatcher declares the action stage stalled (the executor reports
	// timeouts itself; this catches lost executors); default 30 seconds.
	ActionGrace time.Duration
	// InputTimeout bounds the wait for an answer to a clarify question;
	// default 24 hours.
	InputTimeout time.Duration
	// ObservationBytes bounds one observation's output as given to the
	// planner; larger outputs are replaced by a digest; default 4096.
	ObservationBytes int
	// Policy is the operator's policy configuration (explicit per-action
	// policy, required roles and scopes); nil means tier defaults only. A
	// document under the key "config" of the policy bucket replaces it
	// without a restart.
	Policy *policy.Config
	// ExtraPolicies are custom Go policies composed after the configured
	// ones.
	ExtraPolicies []policy.Policy
	// ApprovalKeys verify approval tokens (key id to secret).
	ApprovalKeys policy.Keys
	// ApprovalTTL is how long an approval request stays valid; default 1h.
	ApprovalTTL time.Duration
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
	if c.MaxCycles == 0 {
		c.MaxCycles = DefaultMaxCycles
	}
	if c.MaxPlanActions == 0 {
		c.MaxPlanActions = DefaultMaxPlanActions
	}
	if c.MaxPlanParallel == 0 {
		c.MaxPlanParallel = DefaultMaxPlanParallel
	}
	if c.MaxSectionParallel == 0 {
		c.MaxSectionParallel = 4
	}
	if c.Concurrency == 0 {
		c.Concurrency = 64
	}
	if c.MaxFailedRounds == 0 {
		c.MaxFailedRounds = 2
	}
	if c.RunDeadline == 0 {
		c.RunDeadline = 10 * time.Minute
	}
	if c.DecisionTimeout == 0 {
		c.DecisionTimeout = 2 * time.Minute
	}
	if c.ActionGrace == 0 {
		c.ActionGrace = 30 * time.Second
	}
	if c.InputTimeout == 0 {
		c.InputTimeout = 24 * time.Hour
	}
	if c.ObservationBytes == 0 {
		c.ObservationBytes = 4096
	}
	if c.ApprovalTTL == 0 {
		c.ApprovalTTL = time.Hour
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
	if n < 1 || n > MaxPlanActionsCeiling {
		return 0, fmt.Errorf("dispatch: max plan actions must be 1 to %d (hard ceiling), got %d", MaxPlanActionsCeiling, n)
	}
	return n, nil
}

// Validate reports configuration errors.
func (c *Config) Validate() error {
	switch {
	case c.MaxPlanActions < 1 || c.MaxPlanActions > MaxPlanActionsCeiling:
		return fmt.Errorf("dispatch: MaxPlanActions must be 1 to %d, got %d", MaxPlanActionsCeiling, c.MaxPlanActions)
	case c.MaxPlanParallel < 1:
		return fmt.Errorf("dispatch: MaxPlanParallel must be at least 1, got %d", c.MaxPlanParallel)
	case c.MaxSectionParallel < 1:
		return fmt.Errorf("dispatch: MaxSectionParallel must be at least 1, got %d", c.MaxSectionParallel)
	case c.MaxCycles < 1:
		return fmt.Errorf("dispatch: MaxCycles must be at least 1, got %d", c.MaxCycles)
	case c.Concurrency < 1:
		return fmt.Errorf("dispatch: Concurrency must be at least 1, got %d", c.Concurrency)
	case c.MaxFailedRounds < 1:
		return fmt.Errorf("dispatch: MaxFailedRounds must be at least 1, got %d", c.MaxFailedRounds)
	case c.RunDeadline < time.Second || c.DecisionTimeout < time.Second || c.ActionGrace < 0 || c.InputTimeout < time.Second:
		return fmt.Errorf("dispatch: deadlines must be at least one second (timers have second precision)")
	case c.ObservationBytes < 256:
		return fmt.Errorf("dispatch: ObservationBytes must be at least 256, got %d", c.ObservationBytes)
	}
	return events.Topology{Prefix: c.Prefix}.Validate()
}

// Dispatcher is the dispatcher service.
type Dispatcher struct {
	cfg      Config
	js       jetstream.JetStream
	bus      *events.Bus
	topo     events.Topology
	log      *slog.Logger
	locks    *keymutex.Striped
	runs     jetstream.KeyValue
	cat      *actions.View
	ready    chan struct{}
	cache    *stateCache
	checkers *checkerCache
	policy   atomic.Pointer[policy.Evaluator]

	queueMu sync.Mutex
	queues  map[string]*runQueue
}

// Ready is closed once Run has loaded the catalog and started serving.
func (d *Dispatcher) Ready() <-chan struct{} { return d.ready }

// New returns a dispatcher using nc.
func New(nc *nats.Conn, cfg Config) (*Dispatcher, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger.With("service", "dispatcher")
	bus, err := events.Open(nc, events.BusConfig{Prefix: cfg.Prefix, Source: "/actionbus/dispatcher/" + cfg.InstanceID, Logger: log})
	if err != nil {
		return nil, err
	}
	js := bus.JetStream()
	d := &Dispatcher{cfg: cfg, js: js, bus: bus, topo: events.Topology{Prefix: cfg.Prefix}, log: log, locks: keymutex.New(256), ready: make(chan struct{}), cache: newStateCache(20000), checkers: newCheckerCache(), queues: map[string]*runQueue{}}
	d.policy.Store(&policy.Evaluator{Config: cfg.Policy, Extra: cfg.ExtraPolicies})
	return d, nil
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
	catKV, err := d.js.KeyValue(ctx, d.topo.BucketCatalog())
	if err != nil {
		return err
	}
	if d.cat, err = actions.NewCatalog(catKV).Watch(ctx); err != nil {
		return err
	}
	if err := d.watchPolicy(ctx); err != nil {
		return err
	}
	// Two consumers: what services write (decisions, results, timers)
	// and what clients and approvers write (requests, cancels, inputs,
	// approvals' answers) live in separate streams.
	type served struct {
		cons jetstream.Consumer
		opts events.ServeOptions
	}
	var all []served
	for _, c := range d.topo.Needs("dispatcher", "").Consumers {
		cons, err := d.js.Consumer(ctx, c.Stream, c.Config.Durable)
		if err != nil {
			return err
		}
		opts := events.ServeOptions{Name: c.Config.Durable, Concurrency: d.cfg.Concurrency}
		if d.cfg.Metrics != nil {
			opts.Observer = d.cfg.Metrics
		}
		if c.Config.Durable == events.ConsumerDispatcherRequests {
			opts.OnReject = d.onRejected
		}
		all = append(all, served{cons, opts})
	}
	d.log.Info("dispatcher serving")
	close(d.ready)
	g, gctx := errgroup.WithContext(ctx)
	for _, s := range all {
		g.Go(func() error { return d.bus.Serve(gctx, s.cons, s.opts, d.handle) })
	}
	return g.Wait()
}

// onRejected answers a rejected run request: when its subject names a
// valid run id that no run has yet, the run is created failed, with the
// rejection's code, and its run.failed published, so that whoever waits on
// the id learns why. A run that exists is left alone: junk sent on a live
// run's subject must not end it.
func (d *Dispatcher) onRejected(ctx context.Context, msg jetstream.Msg, reason error) error {
	subjects := d.bus.Subjects()
	runID := subjects.RunIDFromSubject(msg.Subject())
	if !events.ValidRunID(runID) || msg.Subject() != subjects.Run(runID, "requested") {
		return nil
	}
	unlock := d.locks.Lock(runID)
	defer unlock()
	abErr := &actionbus.Error{Code: actionbus.CodeOf(reason), Message: "run.requested rejected"}
	var typed *actionbus.Error
	if errors.As(reason, &typed) {
		abErr.Message = "run.requested rejected: " + typed.Message
	}
	now := time.Now().UTC()
	st := &RunState{RunID: runID, IDKey: newIDKey(), Kind: "rejected", Observations: []events.Observation{}, CreatedAt: now, UpdatedAt: now, Deadline: now}
	out := d.fail(st, abErr)
	return d.admit(ctx, st, out, msg)
}

// emission is an event a state transition publishes once the new state is
// stored.
type emission struct {
	typ, id, pool string
	data          any
	ext           []events.Extension
	// subject and header are set for timer schedules only.
	subject string
	header  nats.Header
}

func (d *Dispatcher) handle(ctx context.Context, r *events.Received, msg jetstream.Msg) error {
	redelivered := false
	if md, err := msg.Metadata(); err == nil {
		redelivered = md.NumDelivered > 1
	}
	switch data := r.Data.(type) {
	case *events.RunRequested:
		return d.onRunRequested(ctx, data, msg)
	case *events.DecisionMade:
		return d.transition(ctx, data.RunID, redelivered, func(st *RunState) ([]emission, error) {
			return d.onDecision(ctx, st, data)
		})
	case *events.ActionCompleted:
		return d.transition(ctx, data.RunID, redelivered, func(st *RunState) ([]emission, error) {
			return d.onResult(ctx, st, data.CallID, data.Executor, true, data.Output, data.Summary, data.Complete, nil)
		})
	case *events.ActionFailed:
		errCopy := data.Error
		return d.transition(ctx, data.RunID, redelivered, func(st *RunState) ([]emission, error) {
			return d.onResult(ctx, st, data.CallID, data.Executor, false, nil, "", false, &errCopy)
		})
	case *events.CancelRequested:
		return d.transition(ctx, data.RunID, redelivered, func(st *RunState) ([]emission, error) {
			if st.IsTerminal() {
				return nil, nil
			}
			if st.waitingRetry() {
				// The seed's rule: a cancel during a retry delay aborts the
				// workflow; the step's handler is not called again.
				err := actionbus.Errorf(actionbus.CodeWorkflowAborted, "workflow canceled during a retry delay: %s", data.Reason)
				return append([]emission{step(st, "workflow-aborted", nil, "", data.Reason, "failed")}, d.fail(st, err)...), nil
			}
			return append([]emission{step(st, "canceled", nil, "", data.Reason, "")},
				d.terminate(st, &Terminal{Type: events.TypeRunCanceled, Reason: data.Reason})...), nil
		})
	case *events.InputProvided:
		return d.transition(ctx, data.RunID, redelivered, func(st *RunState) ([]emission, error) {
			return d.onInput(st, data), nil
		})
	case *events.ApprovalGranted:
		return d.transition(ctx, data.RunID, redelivered, func(st *RunState) ([]emission, error) {
			return d.onApprovalGranted(st, data, r.Event.ID()), nil
		})
	case *events.ApprovalDenied:
		return d.transition(ctx, data.RunID, redelivered, func(st *RunState) ([]emission, error) {
			return d.onApprovalDenied(st, data, r.Event.ID()), nil
		})
	case *events.SynthesisCompleted:
		return d.transition(ctx, data.RunID, redelivered, func(st *RunState) ([]emission, error) {
			return d.onSynthesis(st, data), nil
		})
	case *events.TimerFired:
		return d.transition(ctx, data.RunID, redelivered, func(st *RunState) ([]emission, error) {
			return d.onTimer(ctx, st, data)
		})
	}
	d.log.Warn("ignoring an event the dispatcher does not handle", "type", r.Event.Type(), "subject", r.Subject)
	return nil
}

func (d *Dispatcher) onRunRequested(ctx context.Context, req *events.RunRequested, msg jetstream.Msg) error {
	unlock := d.locks.Lock(req.RunID)
	defer unlock()
	now := time.Now().UTC()
	st := &RunState{
		RunID: req.RunID, IDKey: newIDKey(), Status: StatusRunning, Kind: "agent", Prompt: req.Prompt, Scenario: req.Scenario, Replay: req.Replay,
		UserID: req.UserID, AllowedModes: req.AllowedModes, Metadata: req.Metadata,
		Observations: []events.Observation{}, CreatedAt: now, UpdatedAt: now,
	}
	var out []emission
	if req.Action != nil {
		st.Kind = "exec"
	}
	deadline := d.cfg.RunDeadline
	if req.DeadlineMs > 0 {
		deadline = time.Duration(req.DeadlineMs) * time.Millisecond
	}
	st.Deadline = now.Add(deadline)
	out = append(out, emission{typ: events.TypeRunStarted, id: st.derive("started"),
		data: &events.RunStarted{RunID: req.RunID, Kind: st.Kind, Scenario: req.Scenario, Prompt: req.Prompt}},
		d.timer(st, events.TimerRunDeadline, "run", "", "run", deadline))
	if req.Action != nil {
		st.Cycle = 1
		more, err := d.startCalls(ctx, st, []events.Decision{{Type: events.DecisionAction, Name: req.Action.Name, Args: req.Action.Args, IdempotencyKey: req.Action.IdempotencyKey}}, events.OriginHost, nil)
		if err != nil {
			return err
		}
		out = append(out, more...)
	} else if req.Workflow != nil {
		st.Kind = "workflow"
		more, err := d.startWorkflow(ctx, st, req.Workflow)
		if err != nil {
			return err
		}
		out = append(out, more...)
	} else {
		out = append(out, d.askPlanner(st)...)
	}
	return d.admit(ctx, st, out, msg)
}

// admit creates a new run's state and publishes what it implies. Create
// only: the first request of a run creates it; a republished request, or
// another dispatcher that got there first, finds it and changes nothing.
// When msg itself is redelivered the dispatcher may have crashed between
// storing the run and publishing, so what the stored run waits on is
// published again.
func (d *Dispatcher) admit(ctx context.Context, st *RunState, out []emission, msg jetstream.Msg) error {
	val, err := json.Marshal(st)
	if err != nil {
		return events.Permanent(err)
	}
	if tooLarge := d.stateTooLarge(val); tooLarge != nil {
		// A request that cannot be held as state: the run is created
		// failed, without what made it too large.
		now := time.Now().UTC()
		failed := &RunState{RunID: st.RunID, IDKey: st.IDKey, Kind: st.Kind, UserID: st.UserID, Observations: []events.Observation{},
			CreatedAt: now, UpdatedAt: now, Deadline: st.Deadline}
		st, out = failed, d.fail(failed, tooLarge)
		if val, err = json.Marshal(st); err != nil {
			return events.Permanent(err)
		}
	}
	cctx, cancel := events.Bounded(ctx)
	rev, err := d.runs.Create(cctx, st.RunID, val)
	cancel()
	if errors.Is(err, jetstream.ErrKeyExists) {
		if md, mdErr := msg.Metadata(); mdErr != nil || md.NumDelivered <= 1 {
			return nil
		}
		gctx, cancel := events.Bounded(ctx)
		entry, err := d.runs.Get(gctx, st.RunID)
		cancel()
		if err != nil {
			return err
		}
		var cur RunState
		if err := json.Unmarshal(entry.Value(), &cur); err != nil {
			return events.Permanent(fmt.Errorf("dispatch: corrupt state of run %s: %w", st.RunID, err))
		}
		return d.publishOrFail(ctx, &cur, d.pending(&cur))
	}
	if err != nil {
		return err
	}
	d.cache.put(st.RunID, val, rev, st.IsTerminal())
	d.cfg.Metrics.RunStarted(st.Kind)
	if st.IsTerminal() {
		d.cfg.Metrics.RunEnded(st.Kind, st.Status, 0)
	}
	return d.publishOrFail(ctx, st, out)
}

// transitionFunc applies one event to a run's state and returns what to
// publish. It returns nil emissions exactly when it changed nothing (a
// duplicate or stale event).
type transitionFunc func(*RunState) ([]emission, error)

// job is one event waiting to be applied to its run.
type job struct {
	fn          transitionFunc
	redelivered bool
	done        chan error
}

// transition applies fn to the stored state of runID under a revision
// check and publishes what it emitted. Events of one run that arrive while
// a transition of that run is being stored are applied together in the
// next one (group commit): one read, one revision-checked write and one
// publish batch for all of them, which is what keeps a plan's results from
// queueing behind each other's round trips. A transition that changes
// nothing republishes what the run waits for when its event was
// redelivered.
func (d *Dispatcher) transition(ctx context.Context, runID string, redelivered bool, fn transitionFunc) error {
	j := &job{fn: fn, redelivered: redelivered, done: make(chan error, 1)}
	d.queueMu.Lock()
	q, leading := d.queues[runID]
	if !leading {
		q = &runQueue{}
		d.queues[runID] = q
	}
	q.jobs = append(q.jobs, j)
	d.queueMu.Unlock()
	if !leading {
		d.lead(ctx, runID)
	}
	select {
	case err := <-j.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

type runQueue struct{ jobs []*job }

// lead applies queued jobs of runID batch by batch until none is left.
func (d *Dispatcher) lead(ctx context.Context, runID string) {
	for {
		d.queueMu.Lock()
		q := d.queues[runID]
		batch := q.jobs
		q.jobs = nil
		if len(batch) == 0 {
			delete(d.queues, runID)
			d.queueMu.Unlock()
			return
		}
		d.queueMu.Unlock()
		err := d.applyBatch(ctx, runID, batch)
		for _, j := range batch {
			j.done <- err
		}
	}
}

func (d *Dispatcher) applyBatch(ctx context.Context, runID string, batch []*job) error {
	unlock := d.locks.Lock(runID)
	defer unlock()
	for attempt := 0; attempt < 20; attempt++ {
		// The cached copy saves a read; its revision makes a stale copy
		// (another dispatcher wrote since) fail the update and be reloaded.
		before, revision, ok := d.cache.get(runID)
		fresh := !ok || attempt > 0
		if fresh {
			gctx, cancel := events.Bounded(ctx)
			entry, err := d.runs.Get(gctx, runID)
			cancel()
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				// An event for a run we do not know (yet): the
				// run.requested may still be on its way; retry with
				// backoff, bounded by MaxDeliver.
				return fmt.Errorf("dispatch: run %s not found", runID)
			}
			if err != nil {
				return err
			}
			before, revision = entry.Value(), entry.Revision()
		}
		var st RunState
		if err := json.Unmarshal(before, &st); err != nil {
			return events.Permanent(fmt.Errorf("dispatch: corrupt state of run %s: %w", runID, err))
		}
		var out []emission
		changed, republish := false, false
		wasTerminal := st.IsTerminal()
		for _, j := range batch {
			emitted, err := j.fn(&st)
			if err != nil {
				return err
			}
			if emitted != nil {
				changed = true
				out = append(out, emitted...)
			} else if j.redelivered {
				republish = true
			}
		}
		if !changed {
			if !fresh {
				// "Nothing to do" is only trusted on the stored state: a
				// cached copy may predate what another dispatcher wrote
				// (a result for a call this copy does not know yet).
				continue
			}
			d.cache.put(runID, before, revision, st.IsTerminal())
			if republish {
				return d.publishOrFail(ctx, &st, d.pending(&st))
			}
			return nil
		}
		if republish {
			out = append(out, d.pending(&st)...)
		}
		st.UpdatedAt = time.Now().UTC()
		after, err := json.Marshal(&st)
		if err != nil {
			return events.Permanent(err)
		}
		if tooLarge := d.stateTooLarge(after); tooLarge != nil {
			// The new state could never be stored: the run fails from the
			// state as it is stored, with the limit named.
			d.log.Warn("run state over the server's max payload; failing the run", "run_id", runID, "bytes", len(after))
			st = RunState{}
			if err := json.Unmarshal(before, &st); err != nil {
				return events.Permanent(fmt.Errorf("dispatch: corrupt state of run %s: %w", runID, err))
			}
			st.Terminal = nil
			out = d.fail(&st, tooLarge)
			st.UpdatedAt = time.Now().UTC()
			if after, err = json.Marshal(&st); err != nil {
				return events.Permanent(err)
			}
		}
		uctx, cancel := events.Bounded(ctx)
		rev, err := d.runs.Update(uctx, runID, after, revision)
		cancel()
		if err != nil {
			d.cache.drop(runID)
			if isConflict(err) {
				continue
			}
			return err
		}
		d.cache.put(runID, after, rev, st.IsTerminal())
		if !wasTerminal && st.IsTerminal() {
			d.cfg.Metrics.RunEnded(st.Kind, st.Status, st.UpdatedAt.Sub(st.CreatedAt))
		}
		return d.publishOrFail(ctx, &st, dedupe(out))
	}
	return fmt.Errorf("dispatch: run %s: too many concurrent updates", runID)
}

// dedupe drops emissions with an id already in the batch (the same event
// implied twice, e.g. a republished pending request).
func dedupe(out []emission) []emission {
	seen := make(map[string]bool, len(out))
	kept := out[:0]
	for _, e := range out {
		if !seen[e.id] {
			seen[e.id] = true
			kept = append(kept, e)
		}
	}
	return kept
}

func isConflict(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence)
}

func (d *Dispatcher) publish(ctx context.Context, st *RunState, out []emission) error {
	if len(out) == 0 {
		return nil
	}
	batch := make([]events.Emission, len(out))
	for i, e := range out {
		batch[i] = events.Emission{Type: e.typ, ID: e.id, RunID: st.RunID, Pool: e.pool, Data: e.data, Ext: e.ext,
			Subject: e.subject, Header: e.header}
	}
	return d.bus.EmitAll(ctx, batch)
}

// stateHeadroom is kept below the server's max payload for the headers of
// a key-value write.
const stateHeadroom = 4 << 10

// stateTooLarge returns a payload_too_large error when a run state of that
// encoding could not be stored (it would exceed the server's max payload),
// and nil otherwise.
func (d *Dispatcher) stateTooLarge(state []byte) *actionbus.Error {
	return events.OverPayload(d.js.Conn(), "run state", int64(len(state)), stateHeadroom)
}

// publishOrFail publishes what a stored transition emitted. An event the
// server would refuse (over its max payload) can never be published, so
// retrying is pointless: the run is failed at once with payload_too_large,
// naming the event and its size, instead of waiting for its deadline.
func (d *Dispatcher) publishOrFail(ctx context.Context, st *RunState, out []emission) error {
	err := d.publish(ctx, st, out)
	var tooLarge *actionbus.Error
	if !errors.As(err, &tooLarge) || tooLarge.Code != actionbus.CodePayloadTooLarge {
		return err
	}
	d.log.Warn("an event of the run is over the server's max payload; failing the run", "run_id", st.RunID, "err", tooLarge.Message)
	return d.failStored(ctx, st.RunID, tooLarge)
}

// failStored ends the stored run with abErr (replacing a terminal event
// that could not be published) and publishes its run.failed.
func (d *Dispatcher) failStored(ctx context.Context, runID string, abErr *actionbus.Error) error {
	for attempt := 0; attempt < 10; attempt++ {
		gctx, cancel := events.Bounded(ctx)
		entry, err := d.runs.Get(gctx, runID)
		cancel()
		if err != nil {
			return err
		}
		var st RunState
		if err := json.Unmarshal(entry.Value(), &st); err != nil {
			return events.Permanent(fmt.Errorf("dispatch: corrupt state of run %s: %w", runID, err))
		}
		if t := st.Terminal; t != nil && t.Error != nil && t.Error.Code == actionbus.CodePayloadTooLarge {
			return d.publish(ctx, &st, []emission{terminalEmission(&st)})
		}
		wasTerminal := st.IsTerminal()
		st.Terminal = nil
		out := d.fail(&st, abErr)
		st.UpdatedAt = time.Now().UTC()
		val, err := json.Marshal(&st)
		if err != nil {
			return events.Permanent(err)
		}
		uctx, cancel := events.Bounded(ctx)
		rev, err := d.runs.Update(uctx, runID, val, entry.Revision())
		cancel()
		if isConflict(err) {
			continue
		}
		if err != nil {
			return err
		}
		d.cache.put(runID, val, rev, true)
		if !wasTerminal {
			d.cfg.Metrics.RunEnded(st.Kind, st.Status, st.UpdatedAt.Sub(st.CreatedAt))
		}
		return d.publish(ctx, &st, out)
	}
	return fmt.Errorf("dispatch: run %s: too many concurrent updates", runID)
}

// pending returns the events a run is waiting on in its current state: its
// terminal event, its decision request, or its dispatched calls. All have
// deterministic ids, so republishing them is deduplicated.
func (d *Dispatcher) pending(st *RunState) []emission {
	if st.IsTerminal() {
		return []emission{terminalEmission(st)}
	}
	if st.Phase == PhaseDeciding {
		return []emission{d.decisionRequest(st)}
	}
	var out []emission
	if st.Phase == PhaseSynthesizing && st.Synthesis != nil {
		for _, p := range st.Synthesis.Parts {
			if p.Requested && !p.Done {
				out = append(out, d.synthesisRequest(st, p))
			}
		}
		return out
	}
	for _, c := range st.Calls {
		if c.Dispatched && !c.Done {
			out = append(out, d.actionRequest(st, c))
		}
	}
	return out
}

func step(st *RunState, name string, planIndex *int, action, message, status string) emission {
	return stepWith(st, name, planIndex, action, message, status, nil)
}

func stepWith(st *RunState, name string, planIndex *int, action, message, status string, details map[string]any) emission {
	// Steps are numbered in the run state, so each step has its own id
	// (a retried workflow step repeats names) and a transition recomputed
	// from the same stored state derives the same ids.
	st.StepSeq++
	return emission{typ: events.TypeRunStep, id: st.derive("step", st.StepSeq),
		data: &events.RunStep{RunID: st.RunID, Name: name, Cycle: st.Cycle, PlanIndex: planIndex, Action: action,
			Message: message, Status: status, Details: details}}
}

// CheckReady reports whether the streams, consumers and buckets the
// dispatcher needs exist (the /readyz probe).
func (d *Dispatcher) CheckReady(ctx context.Context) error {
	return d.topo.Check(ctx, d.js, d.topo.Needs("dispatcher", ""))
}
