// Package planner is the planner service: it turns a run's observations
// into exactly one decision per cycle (action, plan, clarify or final) with
// a pluggable provider, and publishes it as a decision.made event.
//
// The service is stateless: every decision request carries what the
// provider needs, so planners scale by starting more. It does not validate
// decisions against the catalog or policy; the dispatcher does.
package planner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/actions/actionstore"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/limits"
	"github.com/actionbus/actionbus/internal/limits/limitstore"
	"github.com/actionbus/actionbus/internal/metrics"
	"github.com/actionbus/actionbus/internal/tracing"
)

// Provider decides the next step of a run and writes the parts of a
// per-action synthesis.
type Provider interface {
	// Name identifies the provider in decision events ("script", "openai").
	Name() string
	// Decide returns one decision. An *actionbus.Error fails the run with
	// its code; other errors are retried.
	Decide(ctx context.Context, in Input) (events.Decision, error)
	// Synthesize writes one section, intro or outro as markdown. An
	// *actionbus.Error makes the part a "section failed" comment; other
	// errors are retried.
	Synthesize(ctx context.Context, req *events.SynthesisRequested) (string, error)
}

// Input is what a provider decides from.
type Input struct {
	// Request is the run's decision request: prompt, cycle, observations.
	Request *events.DecisionRequested
	// Actions are the planner-visible actions of the catalog, sorted by
	// name.
	Actions []actions.Entry
	// Stream, when set, receives the tokens of a final answer while the
	// provider writes it.
	Stream func(delta string)

	diagnostics *[]actionbus.Error
}

// Diagnose records planning evidence (a repaired or refused reply) that
// travels with the decision; it is not executed work.
func (in Input) Diagnose(e *actionbus.Error) {
	if in.diagnostics != nil && e != nil {
		*in.diagnostics = append(*in.diagnostics, *e)
	}
}

// Config configures a [Service].
type Config struct {
	// Prefix is the subject prefix; default "ab".
	Prefix string
	// Provider makes the decisions. Required.
	Provider Provider
	// Concurrency bounds decisions made at once; default 16.
	Concurrency int
	// Logger receives the planner's logs; nil discards them.
	Logger *slog.Logger
	// NoStream turns off publishing final-answer tokens on core NATS.
	NoStream bool
	// Metrics records decisions and event handling; nil records nothing.
	Metrics *metrics.Metrics
	// LLMLimit, when set, limits the provider's calls (decisions and
	// synthesis parts) across every planner process, like an action's
	// limit (docs/limits.md): its key sees {{.tenant}} and {{.action}},
	// which is "llm:<provider>:<model>"; the default key is that name, one
	// limit per model. A request waits for a slot (bounded by the run's
	// decision deadline). Nil limits nothing.
	LLMLimit *limits.Spec
}

// Service is the planner service.
type Service struct {
	// llm is the store of LLMLimit (nil without one); llmAction the name
	// its calls are limited under.
	llm       *limitstore.Store
	book      *spendBook
	llmAction string
	nc        *nats.Conn
	cfg       Config
	js        jetstream.JetStream
	bus       *bus.Bus
	topo      bus.Topology
	log       *slog.Logger
	cat       *actionstore.View
	// ready is closed once Run has loaded the catalog (cat is set).
	ready chan struct{}
}

// New returns a planner service using nc.
// DefaultConcurrency is how many decisions a planner makes at once unless
// configured.
const DefaultConcurrency = 16

func (c *Config) setDefaults() {
	if c.Prefix == "" {
		c.Prefix = events.DefaultPrefix
	}
	if c.Concurrency <= 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports configuration errors: a missing provider, a prefix
// that is not a subject token.
func (c *Config) Validate() error {
	if c.Provider == nil {
		return errors.New("planner: Config.Provider is required")
	}
	if c.LLMLimit != nil {
		if err := c.LLMLimit.Validate(); err != nil {
			return fmt.Errorf("planner: LLMLimit: %w", err)
		}
	}
	return bus.Topology{Prefix: c.Prefix}.Validate()
}

func New(nc *nats.Conn, cfg Config) (*Service, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger.With("service", "planner", "provider", cfg.Provider.Name())
	eb, err := bus.Open(nc, bus.BusConfig{Prefix: cfg.Prefix, Source: "/actionbus/planner", Logger: log, ReceiverValidates: true})
	if err != nil {
		return nil, err
	}
	js := eb.JetStream()
	return &Service{nc: nc, cfg: cfg, js: js, bus: eb, topo: bus.Topology{Prefix: cfg.Prefix}, log: log, llmAction: llmAction(cfg.Provider),
		ready: make(chan struct{})}, nil
}

// Run serves decision requests until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	if err := s.topo.Check(ctx, s.js, s.topo.Needs("planner", "")); err != nil {
		return err
	}
	catKV, err := s.js.KeyValue(ctx, s.topo.BucketCatalog())
	if err != nil {
		return err
	}
	if s.cat, err = actionstore.NewCatalog(catKV, actionstore.WithLogger(s.log)).Follow(ctx, s.js, 0); err != nil {
		return err
	}
	close(s.ready)
	limitsKV, err := s.js.KeyValue(ctx, s.topo.BucketPlannerLimits())
	if err != nil {
		return fmt.Errorf("planner: the planner limits bucket: %w", err)
	}
	s.book = &spendBook{kv: limitsKV, now: time.Now}
	if s.cfg.LLMLimit != nil && !s.cfg.LLMLimit.IsZero() {
		s.llm = limitstore.New(limitsKV)
	}
	cons, err := s.js.Consumer(ctx, s.topo.StreamRuns(), bus.ConsumerPlanner)
	if err != nil {
		return err
	}
	s.log.Info("planner serving")
	opts := bus.ServeOptions{Name: bus.ConsumerPlanner, Concurrency: s.cfg.Concurrency}
	if s.cfg.Metrics != nil {
		opts.Observer = s.cfg.Metrics
	}
	return s.bus.Serve(ctx, cons, opts, s.handle)
}

func (s *Service) handle(ctx context.Context, r *events.Received, msg jetstream.Msg) error {
	// The planner's span (GenAI invoke_agent), a child of the dispatcher's
	// span that asked; each LLM call is a chat span within it.
	ctx, span := tracing.Tracer().Start(tracing.Parent(ctx, tracing.RunOfEvent(r.Event)), "invoke_agent "+s.cfg.Provider.Name(),
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(semconv.GenAIOperationNameInvokeAgent, semconv.GenAIAgentName(s.cfg.Provider.Name()),
			tracing.RunIDKey.String(r.RunID()), tracing.TenantKey.String(r.Tenant), tracing.EventTypeKey.String(r.Event.Type())))
	defer span.End()
	ctx = tracing.WithRun(ctx, tracing.RunOfEvent(r.Event))
	switch data := r.Data.(type) {
	case *events.DecisionRequested:
		if data.Replay != nil {
			return s.decide(ctx, r.Tenant, r.Event.ID(), data) // no model is asked
		}
		release, err := s.acquireLLM(ctx, r.Tenant, data.RunID, r.Event.ID(), msg)
		if err != nil {
			return err
		}
		defer release()
		return s.decide(ctx, r.Tenant, r.Event.ID(), data)
	case *events.SynthesisRequested:
		release, err := s.acquireLLM(ctx, r.Tenant, data.RunID, r.Event.ID(), msg)
		if err != nil {
			return err
		}
		defer release()
		return s.synthesize(ctx, r.Tenant, r.Event.ID(), data)
	}
	return bus.Permanent(fmt.Errorf("planner: unexpected %s", r.Event.Type()))
}

// decide answers one decision request. The decision's id derives from the
// request's id, which the dispatcher keys with a per-run secret: whoever
// cannot read the request cannot predict the answer's id (and so cannot
// have it dropped as a duplicate).
func (s *Service) decide(ctx context.Context, tenant, requestID string, req *events.DecisionRequested) error {
	dm := &events.DecisionMade{RunID: req.RunID, Cycle: req.Cycle, Planner: s.cfg.Provider.Name()}
	in := Input{Request: req, Actions: surface(s.cat.ListForPlanner(events.TenantOr(tenant)), s.cat.HasSkills(), req), diagnostics: &dm.Diagnostics}
	var provider interface {
		Decide(context.Context, Input) (events.Decision, error)
	} = s.cfg.Provider
	if req.Replay != nil {
		provider, dm.Planner = replayProvider{req.Replay}, "replay"
	}
	if !s.cfg.NoStream && req.Synthesize != "" {
		in.Stream = s.streamer(tenant, req.RunID)
	}
	started := time.Now()
	m := newMeter(tenant, s.book, req.Budget, req.TenantBudget, req.Used)
	dec, err := provider.Decide(withMeter(ctx, m), in)
	dm.Usage = m.made()
	if in.Stream != nil {
		in.Stream("") // the end of the stream, whatever the outcome
	}
	if err != nil {
		var abErr *actionbus.Error
		if !errors.As(err, &abErr) {
			return err
		}
		dm.Error = abErr
		dm.Decision = events.Decision{Type: events.DecisionFinal}
		s.log.Warn("planner could not decide", "run", req.RunID, "cycle", req.Cycle, "code", abErr.Code, "error", abErr.Message)
	} else {
		dm.Decision = dec
	}
	kind := dm.Decision.Type
	if dm.Error != nil {
		kind = "error"
	}
	s.cfg.Metrics.Decision(kind, dm.Planner, time.Since(started))
	_, err = s.bus.Emit(ctx, events.TypeDecisionMade, events.DerivedID(requestID, "decision"), tenant, req.RunID, "", dm,
		events.Extension{Name: events.ExtCycle, Value: req.Cycle})
	return err
}

func (s *Service) synthesize(ctx context.Context, tenant, requestID string, req *events.SynthesisRequested) error {
	sc := &events.SynthesisCompleted{RunID: req.RunID, Cycle: req.Cycle, Part: req.Part, Index: req.Index}
	m := newMeter(tenant, s.book, req.Budget, req.TenantBudget, req.Used)
	md, err := s.cfg.Provider.Synthesize(withMeter(ctx, m), req)
	sc.Usage = m.made()
	if err != nil {
		var abErr *actionbus.Error
		if !errors.As(err, &abErr) {
			return err
		}
		sc.Error = abErr
	} else {
		sc.Markdown = md
	}
	_, err = s.bus.Emit(ctx, events.TypeSynthesisCompleted, events.DerivedID(requestID, "synthesized"), tenant, req.RunID, "", sc,
		events.Extension{Name: events.ExtCycle, Value: req.Cycle})
	return err
}

func (s *Service) streamer(tenant, runID string) func(string) {
	subject := s.topo.Subjects().Stream(tenant, runID)
	seq := 0
	return func(delta string) {
		seq++
		msg := nats.NewMsg(subject)
		msg.Header.Set(events.StreamSeqHeader, strconv.Itoa(seq))
		if delta == "" {
			msg.Header.Set(events.StreamEndHeader, "true")
		}
		msg.Data = []byte(delta)
		if err := s.nc.PublishMsg(msg); err != nil {
			s.log.Debug("stream publish failed", "run", runID, "error", err)
		}
	}
}

// replayProvider answers cycle N with the recorded decision N.
type replayProvider struct{ rec *events.Replay }

func (r replayProvider) Decide(_ context.Context, in Input) (events.Decision, error) {
	n := in.Request.Cycle
	if n < 1 || n > len(r.rec.Decisions) {
		return events.Decision{}, actionbus.Errorf(actionbus.CodeReplayDiverged,
			"replay of run %s asked for a decision in cycle %d; the recording has %d", r.rec.RunID, n, len(r.rec.Decisions)).
			WithDetail("recordedRun", r.rec.RunID).WithDetail("cycle", n)
	}
	return r.rec.Decisions[n-1], nil
}

// Ready is closed once Run has loaded the catalog.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// CatchUp waits, after [Service.Ready], until the planner's view of the
// catalog holds every action the catalog had stored when it was called
// (or ctx ends, or a second passes): a stack that starts its executors
// and then runs at once offers the model every action they announced.
func (s *Service) CatchUp(ctx context.Context) {
	select {
	case <-s.ready:
		s.cat.CatchUp(ctx)
	case <-ctx.Done():
	}
}

// CheckReady reports whether the streams, consumers and buckets the
// planner needs exist (the /readyz probe).
func (s *Service) CheckReady(ctx context.Context) error {
	return s.topo.Check(ctx, s.js, s.topo.Needs("planner", ""))
}
