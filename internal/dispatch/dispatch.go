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
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/events"
	"github.com/actionbus/actionbus/internal/keymutex"
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
	// Concurrency bounds events handled at once; default 64.
	Concurrency int
	// Logger receives the dispatcher's logs; nil discards them.
	Logger *slog.Logger
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
	if c.Concurrency == 0 {
		c.Concurrency = 64
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports configuration errors.
func (c *Config) Validate() error {
	switch {
	case c.MaxPlanActions < 1 || c.MaxPlanActions > MaxPlanActionsCeiling:
		return fmt.Errorf("dispatch: MaxPlanActions must be 1 to %d, got %d", MaxPlanActionsCeiling, c.MaxPlanActions)
	case c.MaxPlanParallel < 1:
		return fmt.Errorf("dispatch: MaxPlanParallel must be at least 1, got %d", c.MaxPlanParallel)
	case c.MaxCycles < 1:
		return fmt.Errorf("dispatch: MaxCycles must be at least 1, got %d", c.MaxCycles)
	case c.Concurrency < 1:
		return fmt.Errorf("dispatch: Concurrency must be at least 1, got %d", c.Concurrency)
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
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger.With("service", "dispatcher")
	bus, err := events.NewBus(js, events.BusConfig{Prefix: cfg.Prefix, Source: "/actionbus/dispatcher", Logger: log})
	if err != nil {
		return nil, err
	}
	return &Dispatcher{cfg: cfg, js: js, bus: bus, topo: events.Topology{Prefix: cfg.Prefix}, log: log, locks: keymutex.New(256), ready: make(chan struct{}), cache: newStateCache(20000), checkers: newCheckerCache(), queues: map[string]*runQueue{}}, nil
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
	cons, err := d.js.Consumer(ctx, d.topo.StreamRuns(), events.ConsumerDispatcher)
	if err != nil {
		return err
	}
	d.log.Info("dispatcher serving")
	close(d.ready)
	return d.bus.Serve(ctx, cons, events.ServeOptions{Name: events.ConsumerDispatcher, Concurrency: d.cfg.Concurrency}, d.handle)
}

// emission is an event a state transition publishes once the new state is
// stored.
type emission struct {
	typ, id, pool string
	data          any
	ext           []events.Extension
}

func (d *Dispatcher) handle(ctx context.Context, r *events.Received, msg jetstream.Msg) error {
	redelivered := false
	if md, err := msg.Metadata(); err == nil {
		redelivered = md.NumDelivered > 1
	}
	switch data := r.Data.(type) {
	case *events.RunRequested:
		return d.onRunRequested(ctx, data, redelivered)
	case *events.DecisionMade:
		return d.transition(ctx, data.RunID, redelivered, func(st *RunState) ([]emission, error) {
			return d.onDecision(ctx, st, data)
		})
	case *events.ActionCompleted:
		return d.transition(ctx, data.RunID, redelivered, func(st *RunState) ([]emission, error) {
			return d.onResult(st, data.CallID, data.Executor, true, data.Output, data.Summary, data.Complete, nil)
		})
	case *events.ActionFailed:
		errCopy := data.Error
		return d.transition(ctx, data.RunID, redelivered, func(st *RunState) ([]emission, error) {
			return d.onResult(st, data.CallID, data.Executor, false, nil, "", false, &errCopy)
		})
	case *events.CancelRequested:
		return d.transition(ctx, data.RunID, redelivered, func(st *RunState) ([]emission, error) {
			if st.IsTerminal() {
				return nil, nil
			}
			return d.terminate(st, &Terminal{Type: events.TypeRunCanceled, Reason: data.Reason}), nil
		})
	}
	d.log.Warn("ignoring an event the dispatcher does not handle", "type", r.Event.Type(), "subject", r.Subject)
	return nil
}

func (d *Dispatcher) onRunRequested(ctx context.Context, req *events.RunRequested, redelivered bool) error {
	unlock := d.locks.Lock(req.RunID)
	defer unlock()
	now := time.Now().UTC()
	st := &RunState{
		RunID: req.RunID, Status: StatusRunning, Kind: "agent", Prompt: req.Prompt, Scenario: req.Scenario,
		UserID: req.UserID, AllowedModes: req.AllowedModes, Metadata: req.Metadata,
		Observations: []events.Observation{}, CreatedAt: now, UpdatedAt: now,
	}
	var out []emission
	if req.Action != nil {
		st.Kind = "exec"
	}
	out = append(out, emission{typ: events.TypeRunStarted, id: events.DerivedID(req.RunID, "started"),
		data: &events.RunStarted{RunID: req.RunID, Kind: st.Kind, Scenario: req.Scenario, Prompt: req.Prompt}})
	if req.Action != nil {
		st.Cycle = 1
		more, err := d.startCalls(ctx, st, []events.Decision{{Type: events.DecisionAction, Name: req.Action.Name, Args: req.Action.Args}}, events.OriginHost, false, false)
		if err != nil {
			return err
		}
		out = append(out, more...)
	} else {
		out = append(out, d.askPlanner(st)...)
	}
	val, err := json.Marshal(st)
	if err != nil {
		return events.Permanent(err)
	}
	// Create-only: the first request of a run creates it; a republished
	// request, or another dispatcher that got there first, finds it.
	rev, err := d.runs.Create(ctx, req.RunID, val)
	if errors.Is(err, jetstream.ErrKeyExists) {
		if !redelivered {
			return nil
		}
		// This very message is redelivered: we may have crashed between
		// storing the run and publishing what it implies.
		entry, err := d.runs.Get(ctx, req.RunID)
		if err != nil {
			return err
		}
		var cur RunState
		if err := json.Unmarshal(entry.Value(), &cur); err != nil {
			return events.Permanent(fmt.Errorf("dispatch: corrupt state of run %s: %w", req.RunID, err))
		}
		return d.publish(ctx, &cur, d.pending(&cur))
	}
	if err != nil {
		return err
	}
	d.cache.put(req.RunID, val, rev, st.IsTerminal())
	return d.publish(ctx, st, out)
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
		if !ok || attempt > 0 {
			entry, err := d.runs.Get(ctx, runID)
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
			d.cache.put(runID, before, revision, st.IsTerminal())
			if republish {
				return d.publish(ctx, &st, d.pending(&st))
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
		rev, err := d.runs.Update(ctx, runID, after, revision)
		if err != nil {
			d.cache.drop(runID)
			if isConflict(err) {
				continue
			}
			return err
		}
		d.cache.put(runID, after, rev, st.IsTerminal())
		return d.publish(ctx, &st, dedupe(out))
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
		batch[i] = events.Emission{Type: e.typ, ID: e.id, RunID: st.RunID, Pool: e.pool, Data: e.data, Ext: e.ext}
	}
	return d.bus.EmitAll(ctx, batch)
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
	parts := []any{"step", name, st.Cycle}
	if planIndex != nil {
		parts = append(parts, *planIndex)
	}
	return emission{typ: events.TypeRunStep, id: events.DerivedID(st.RunID, parts...),
		data: &events.RunStep{RunID: st.RunID, Name: name, Cycle: st.Cycle, PlanIndex: planIndex, Action: action,
			Message: message, Status: status, Details: details}}
}

func (d *Dispatcher) askPlanner(st *RunState) []emission {
	st.Cycle++
	st.Phase = PhaseDeciding
	st.Calls = nil
	if st.Cycle > d.cfg.MaxCycles {
		return d.terminate(st, &Terminal{Type: events.TypeRunFailed, Error: actionbus.Errorf(actionbus.CodeMaxCycles,
			"run used its %d planner cycles without a final answer", d.cfg.MaxCycles)})
	}
	return []emission{step(st, "decide", nil, "", fmt.Sprintf("asking the planner (cycle %d)", st.Cycle), ""), d.decisionRequest(st)}
}

func (d *Dispatcher) decisionRequest(st *RunState) emission {
	return emission{typ: events.TypeDecisionRequested, id: events.DerivedID(st.RunID, "decide", st.Cycle),
		data: &events.DecisionRequested{RunID: st.RunID, Cycle: st.Cycle, Prompt: st.Prompt, Scenario: st.Scenario,
			Observations: st.Observations, Feedback: st.Feedback},
		ext: []events.Extension{{Name: events.ExtCycle, Value: st.Cycle}}}
}

func (d *Dispatcher) actionRequest(st *RunState, c CallState) emission {
	return emission{typ: events.TypeActionRequested, id: c.CallID, pool: c.Pool,
		data: &events.ActionRequested{RunID: st.RunID, CallID: c.CallID, Cycle: st.Cycle, PlanIndex: c.PlanIndex, Attempt: 1,
			Action: c.Action, Args: nonNilArgs(c.Args), Origin: c.Origin, UserID: st.UserID},
		ext: []events.Extension{{Name: events.ExtCycle, Value: st.Cycle}, {Name: events.ExtPlanIndex, Value: c.PlanIndex}, {Name: events.ExtPool, Value: c.Pool}}}
}

func nonNilArgs(a map[string]any) map[string]any {
	if a == nil {
		return map[string]any{}
	}
	return a
}

func terminalEmission(st *RunState) emission {
	t := st.Terminal
	e := emission{typ: t.Type, id: events.TerminalID(st.RunID)}
	switch t.Type {
	case events.TypeRunCompleted:
		e.data = &events.RunCompleted{RunID: st.RunID, Answer: t.Answer, Output: t.Output, Citations: t.Citations, Cycles: st.Cycle}
	case events.TypeRunCanceled:
		e.data = &events.RunCanceled{RunID: st.RunID, Reason: t.Reason, Cycles: st.Cycle}
	default:
		e.data = &events.RunFailed{RunID: st.RunID, Error: *t.Error, Cycles: st.Cycle}
	}
	return e
}

// terminate ends the run: it stores its terminal event and returns it.
func (d *Dispatcher) terminate(st *RunState, t *Terminal) []emission {
	st.Terminal = t
	st.Phase = ""
	switch t.Type {
	case events.TypeRunCompleted:
		st.Status = StatusCompleted
	case events.TypeRunCanceled:
		st.Status = StatusCanceled
	default:
		st.Status = StatusFailed
	}
	return []emission{terminalEmission(st)}
}

func (d *Dispatcher) fail(st *RunState, err error) []emission {
	var abErr *actionbus.Error
	if !errors.As(err, &abErr) {
		abErr = &actionbus.Error{Code: actionbus.CodeInternal, Message: err.Error()}
	}
	return d.terminate(st, &Terminal{Type: events.TypeRunFailed, Error: abErr})
}

func (d *Dispatcher) onDecision(ctx context.Context, st *RunState, dm *events.DecisionMade) ([]emission, error) {
	if st.IsTerminal() || st.Phase != PhaseDeciding || dm.Cycle != st.Cycle {
		return nil, nil // stale or duplicate decision
	}
	if dm.Error != nil {
		return d.fail(st, dm.Error), nil
	}
	st.Feedback = nil
	dec := dm.Decision
	switch dec.Type {
	case events.DecisionFinal:
		out := []emission{step(st, "final", nil, "", dec.Answer, "ok")}
		return append(out, d.terminate(st, &Terminal{Type: events.TypeRunCompleted, Answer: dec.Answer, Citations: dec.Citations})...), nil
	case events.DecisionAction:
		return d.startCalls(ctx, st, []events.Decision{dec}, events.OriginModel, false, false)
	case events.DecisionPlan:
		if len(dec.Actions) == 0 {
			return d.fail(st, actionbus.Errorf(actionbus.CodePlanRejected, "a plan needs at least one action")), nil
		}
		if len(dec.Actions) > d.cfg.MaxPlanActions {
			return d.fail(st, actionbus.Errorf(actionbus.CodePlanRejected, "plan has %d actions; at most %d are allowed", len(dec.Actions), d.cfg.MaxPlanActions)), nil
		}
		for i, a := range dec.Actions {
			if a.Type != events.DecisionAction {
				return d.fail(st, actionbus.Errorf(actionbus.CodePlanRejected, "plan action %d has type %q; only action envelopes are allowed in a plan", i, a.Type)), nil
			}
		}
		return d.startCalls(ctx, st, dec.Actions, events.OriginModel, true, dec.PartialOK)
	case events.DecisionClarify:
		return d.fail(st, actionbus.Errorf(actionbus.CodeInvalidDecision, "clarify decisions are not supported by this dispatcher version")), nil
	}
	return d.fail(st, actionbus.Errorf(actionbus.CodeInvalidDecision, "unknown decision type %q", dec.Type)), nil
}

// startCalls validates every action up front (catalog, mode, arguments),
// then records the calls and dispatches the first MaxPlanParallel of them.
// Arguments that fail their schema are not executed: the planner gets them
// back as action_args_invalid observations to correct itself. In a plan
// without partial_ok one invalid action holds back the whole plan; with
// partial_ok the valid actions run and the invalid ones are recorded as
// failed results.
func (d *Dispatcher) startCalls(ctx context.Context, st *RunState, decs []events.Decision, origin string, isPlan, partialOK bool) ([]emission, error) {
	var out []emission
	if isPlan {
		out = append(out, step(st, "plan-validating", nil, "", fmt.Sprintf("%d actions", len(decs)), ""))
	}
	calls := make([]CallState, 0, len(decs))
	invalid := 0
	for i, dec := range decs {
		var pi *int
		if isPlan {
			pi = &i
		}
		entry, err := d.cat.Get(ctx, dec.Name)
		if err != nil {
			if errors.Is(err, actionbus.ErrActionNotFound) {
				abErr := actionbus.Errorf(actionbus.CodeActionNotFound, "action %q is not in the catalog", dec.Name).WithDetail("action", dec.Name)
				if isPlan {
					abErr = abErr.WithDetail("planIndex", i)
				}
				return append(out, d.fail(st, abErr)...), nil
			}
			return nil, err
		}
		if err := policy.CheckMode(st.AllowedModes, entry.Name, entry.Mode); err != nil {
			if isPlan {
				err = err.WithDetail("planIndex", i)
			}
			return append(out, d.fail(st, err)...), nil
		}
		checker, err := d.checkers.get(entry.Definition, entry.Hash)
		if err != nil {
			return nil, events.Permanent(err)
		}
		args, report, issues := checker.Prepare(dec.Args, origin)
		out = append(out, d.recordArgsReport(st, pi, dec.Name, report)...)
		call := CallState{PlanIndex: i, CallID: events.DerivedID(st.RunID, "call", st.Cycle, i, 1),
			Action: dec.Name, Pool: entry.Pool, Args: args, Origin: origin}
		if issues != nil {
			for k := range issues {
				issues[k].PlanIndex = pi
			}
			abErr := actions.ArgsError(dec.Name, issues)
			out = append(out, stepWith(st, "action-args-invalid", pi, dec.Name, abErr.Message, "failed",
				map[string]any{"issues": issues}))
			call.Dispatched, call.Done, call.Error = true, true, abErr
			invalid++
		}
		calls = append(calls, call)
	}
	if invalid > 0 && (!isPlan || !partialOK) {
		if isPlan {
			out = append(out, step(st, "plan-validation-failed", nil, "", fmt.Sprintf("%d of %d actions have invalid arguments; nothing ran", invalid, len(decs)), "failed"))
		}
		var first *actionbus.Error
		for _, c := range calls {
			if c.Error == nil {
				continue
			}
			if first == nil {
				first = c.Error
			}
			obs := events.Observation{Cycle: st.Cycle, Action: c.Action, OK: false, Error: c.Error}
			if isPlan {
				pi := c.PlanIndex
				obs.PlanIndex = &pi
			}
			st.Observations = append(st.Observations, obs)
		}
		if st.Kind == "exec" {
			return append(out, d.fail(st, first)...), nil
		}
		st.Feedback = first
		return append(out, d.askPlanner(st)...), nil
	}
	st.Phase = PhaseActing
	st.Calls = calls
	if isPlan {
		out = append(out, step(st, "plan-executing", nil, "", fmt.Sprintf("%d actions, at most %d at once", len(calls), d.cfg.MaxPlanParallel), ""))
	}
	out = append(out, d.dispatchMore(st)...)
	if st.allDone() {
		out = append(out, d.evaluate(st)...)
	}
	return out, nil
}

// recordArgsReport records alias rewrites and stripped keys as steps and
// run diagnostics.
func (d *Dispatcher) recordArgsReport(st *RunState, pi *int, action string, rep actions.ArgsReport) []emission {
	var out []emission
	note := func(name string, details map[string]any, msg string) {
		st.Diagnostics = append(st.Diagnostics, Diagnostic{Name: name, Cycle: st.Cycle, PlanIndex: pi, Action: action, Details: details})
		out = append(out, stepWith(st, name, pi, action, msg, "", details))
	}
	if len(rep.Rewrites) > 0 {
		note("action-args-alias-rewrite", map[string]any{"rewrites": rep.Rewrites}, fmt.Sprintf("%d alias(es) rewritten", len(rep.Rewrites)))
	}
	if len(rep.Healed) > 0 {
		note("action-args-auto-heal", map[string]any{"keys": rep.Healed}, "flattened arguments lifted: "+strings.Join(rep.Healed, ", "))
	}
	if stripped := append(append([]string{}, rep.Stripped...), rep.HostOnlyStripped...); len(stripped) > 0 {
		note("action.input.unexpected_keys_stripped", map[string]any{"keys": rep.Stripped, "hostOnlyKeys": rep.HostOnlyStripped},
			"stripped "+strings.Join(stripped, ", "))
	}
	return out
}

// dispatchMore dispatches calls in declaration order while fewer than
// MaxPlanParallel are in flight.
func (d *Dispatcher) dispatchMore(st *RunState) []emission {
	var out []emission
	for i := range st.Calls {
		if st.inFlight() >= d.cfg.MaxPlanParallel {
			break
		}
		c := &st.Calls[i]
		if c.Dispatched {
			continue
		}
		c.Dispatched = true
		pi := c.PlanIndex
		out = append(out, step(st, "action-dispatched", &pi, c.Action, "to pool "+c.Pool, ""), d.actionRequest(st, *c))
	}
	return out
}

func (d *Dispatcher) onResult(st *RunState, callID, executor string, ok bool, output any, summary string, complete bool, abErr *actionbus.Error) ([]emission, error) {
	if st.IsTerminal() {
		return nil, nil
	}
	i := st.callIndex(callID)
	if i < 0 || st.Calls[i].Done {
		return nil, nil // a duplicate or a result of an earlier cycle
	}
	c := &st.Calls[i]
	c.Done, c.OK, c.Output, c.Summary, c.Complete, c.Error, c.Executor = true, ok, output, summary, complete, abErr, executor
	pi := c.PlanIndex
	status, msg := "ok", summary
	if !ok {
		status, msg = "failed", string(abErr.Code)+": "+abErr.Message
	}
	out := []emission{step(st, "action-"+map[bool]string{true: "completed", false: "failed"}[ok], &pi, c.Action, msg+" (executor "+executor+")", status)}
	out = append(out, d.dispatchMore(st)...)
	if !st.allDone() {
		return out, nil
	}
	return append(out, d.evaluate(st)...), nil
}

// evaluate runs when every call of the cycle has a result: results are
// recorded in declaration order, whatever order they arrived in.
func (d *Dispatcher) evaluate(st *RunState) []emission {
	var out []emission
	if len(st.Calls) > 1 {
		out = append(out, step(st, "plan-executed", nil, "", fmt.Sprintf("%d actions", len(st.Calls)), ""))
	}
	for _, c := range st.Calls {
		pi := c.PlanIndex
		obs := events.Observation{Cycle: st.Cycle, Action: c.Action, OK: c.OK, Output: c.Output, Summary: c.Summary, Error: c.Error}
		if len(st.Calls) > 1 {
			obs.PlanIndex = &pi
		}
		st.Observations = append(st.Observations, obs)
	}
	if st.Kind == "exec" {
		c := st.Calls[0]
		if !c.OK {
			return append(out, d.terminate(st, &Terminal{Type: events.TypeRunFailed, Error: c.Error})...)
		}
		return append(out, d.terminate(st, &Terminal{Type: events.TypeRunCompleted, Output: c.Output, Answer: c.Summary})...)
	}
	// A handler result with Complete ends the run; declaration order wins.
	for _, c := range st.Calls {
		if c.OK && c.Complete {
			return append(out, d.terminate(st, &Terminal{Type: events.TypeRunCompleted, Output: c.Output, Answer: c.Summary})...)
		}
	}
	return append(out, d.askPlanner(st)...)
}
