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

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/events"
)

// Provider decides the next step of a run.
type Provider interface {
	// Name identifies the provider in decision events ("script", "openai").
	Name() string
	// Decide returns one decision. An *actionbus.Error fails the run with
	// its code; other errors are retried.
	Decide(ctx context.Context, in Input) (events.Decision, error)
}

// Input is what a provider decides from.
type Input struct {
	// Request is the run's decision request: prompt, cycle, observations.
	Request *events.DecisionRequested
	// Actions are the planner-visible actions of the catalog, sorted by
	// name.
	Actions []actions.Entry
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
}

// Service is the planner service.
type Service struct {
	cfg  Config
	js   jetstream.JetStream
	bus  *events.Bus
	topo events.Topology
	log  *slog.Logger
	cat  *actions.View
}

// New returns a planner service using nc.
func New(nc *nats.Conn, cfg Config) (*Service, error) {
	if cfg.Provider == nil {
		return nil, errors.New("planner: Config.Provider is required")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = events.DefaultPrefix
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 16
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	log := cfg.Logger.With("service", "planner", "provider", cfg.Provider.Name())
	bus, err := events.Open(nc, events.BusConfig{Prefix: cfg.Prefix, Source: "/actionbus/planner", Logger: log})
	if err != nil {
		return nil, err
	}
	js := bus.JetStream()
	return &Service{cfg: cfg, js: js, bus: bus, topo: events.Topology{Prefix: cfg.Prefix}, log: log}, nil
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
	if s.cat, err = actions.NewCatalog(catKV).Watch(ctx); err != nil {
		return err
	}
	cons, err := s.js.Consumer(ctx, s.topo.StreamRuns(), events.ConsumerPlanner)
	if err != nil {
		return err
	}
	s.log.Info("planner serving")
	return s.bus.Serve(ctx, cons, events.ServeOptions{Name: events.ConsumerPlanner, Concurrency: s.cfg.Concurrency}, s.handle)
}

func (s *Service) handle(ctx context.Context, r *events.Received, _ jetstream.Msg) error {
	req, ok := r.Data.(*events.DecisionRequested)
	if !ok {
		return events.Permanent(fmt.Errorf("planner: unexpected %s", r.Event.Type()))
	}
	dm := &events.DecisionMade{RunID: req.RunID, Cycle: req.Cycle, Planner: s.cfg.Provider.Name()}
	dec, err := s.cfg.Provider.Decide(ctx, Input{Request: req, Actions: s.cat.ListForPlanner()})
	if err != nil {
		var abErr *actionbus.Error
		if !errors.As(err, &abErr) {
			return err
		}
		dm.Error = abErr
		dm.Decision = events.Decision{Type: events.DecisionFinal}
	} else {
		dm.Decision = dec
	}
	_, err = s.bus.Emit(ctx, events.TypeDecisionMade, events.DerivedID(req.RunID, "decision", req.Cycle), req.RunID, "", dm,
		events.Extension{Name: events.ExtCycle, Value: req.Cycle})
	return err
}
