// Package stack runs the four services (dispatcher, planner, auditor and
// executors) in one process against one NATS connection, for `actionbus
// dev`, the actionbustest kit and benchmarks.
//
// It is not how production runs: there each service is its own process
// (cmd/<service>), scaled on its own.
package stack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/audit"
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/metrics"
	"github.com/actionbus/actionbus/internal/planner"
	"github.com/actionbus/actionbus/internal/registrar"
)

// Config configures a stack.
type Config struct {
	// Prefix is the subject prefix; default "ab".
	Prefix string
	// Provider is the planner provider. Required.
	Provider planner.Provider
	// Executors is the number of executor instances; default 1.
	Executors int
	// Pool of the executors; default "default".
	Pool string
	// Slots per executor; default 8.
	Slots int
	// Register registers the actions of each executor instance.
	Register func(*executor.Executor) error
	// Executor is the base configuration of every executor instance
	// (MaxOutputBytes, DefaultTimeout, ShutdownGrace, ...); its ID, Pool,
	// Prefix, Logger and Observer are the stack's, and Slots, when set,
	// wins over it.
	Executor executor.Config
	// NoAuditor leaves the auditor out.
	NoAuditor bool
	// Audit configures the auditor's payload policy and sinks (Prefix and
	// Logger are the stack's).
	Audit audit.Config
	// Metrics, when set, is what every service records into.
	Metrics *metrics.Metrics
	// NoPlanner leaves the planner out (decision requests go unanswered).
	NoPlanner bool
	// NoExecutors starts no executor (they run elsewhere).
	NoExecutors bool
	// NoDispatcher starts no dispatcher (it runs elsewhere).
	NoDispatcher bool
	// Dispatcher overrides dispatcher settings (Prefix and Logger are set
	// from this Config).
	Dispatcher dispatch.Config
	// Logger receives every service's logs; nil discards them.
	Logger *slog.Logger
	// Connect, when set, gives each service a connection of its own as
	// its own NATS user ("dispatcher", "planner", "auditor", "executor"
	// or "executor-<pool>"), as deployed services have (operator mode:
	// the user's creds; the connection must use the service's inbox
	// prefix _INBOX_<service>). The stack closes them after Stop. Unset,
	// every service shares the nc given to Start.
	Connect func(user string) (*nats.Conn, error)
}

// Stack is a running set of services.
type Stack struct {
	// Executors are the executor instances, in start order.
	Executors []*executor.Executor
	auditor   *audit.Service
	cancel    context.CancelFunc
	conns     []*nats.Conn
	wg        sync.WaitGroup
	mu        sync.Mutex
	errs      []error
}

// AuditorKey is the auditor's public key ("" without an auditor).
func (s *Stack) AuditorKey() string {
	if s.auditor == nil {
		return ""
	}
	return s.auditor.PublicKey()
}

type runner interface{ Run(context.Context) error }

// Start starts every service and returns once the dispatcher has loaded
// the catalog, every executor has published its actions and the planner
// has them in its view. Services run
// until ctx ends or Stop is called.
func Start(ctx context.Context, nc *nats.Conn, cfg Config) (*Stack, error) {
	if cfg.Provider == nil && !cfg.NoPlanner {
		return nil, errors.New("stack: Provider is required")
	}
	if cfg.Executors <= 0 {
		cfg.Executors = 1
	}
	if cfg.NoExecutors {
		cfg.Executors = 0
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Stack{cancel: func() {}}
	conn := func(user string) (*nats.Conn, error) {
		if cfg.Connect == nil {
			return nc, nil
		}
		c, err := cfg.Connect(user)
		if err != nil {
			return nil, fmt.Errorf("stack: connect as %s: %w", user, err)
		}
		s.conns = append(s.conns, c)
		return c, nil
	}
	started := false
	defer func() {
		if !started {
			s.closeConns()
		}
	}()
	dnc, err := conn("dispatcher")
	if err != nil {
		return nil, err
	}
	dcfg := cfg.Dispatcher
	dcfg.Prefix, dcfg.Logger, dcfg.Metrics = cfg.Prefix, cfg.Logger, cfg.Metrics
	disp, err := dispatch.New(dnc, dcfg)
	if err != nil {
		return nil, err
	}
	var services []runner
	if !cfg.NoDispatcher {
		services = append(services, disp)
	} else if cfg.Executors > 0 {
		// The executors announce their actions to a registrar, which the
		// dispatchers host; without one here, the stack hosts it.
		services = append(services, registrarRunner{nc: nc, prefix: cfg.Prefix, log: cfg.Logger})
	}
	var plan *planner.Service
	if !cfg.NoPlanner {
		pnc, err := conn("planner")
		if err != nil {
			return nil, err
		}
		if plan, err = planner.New(pnc, planner.Config{Prefix: cfg.Prefix, Provider: cfg.Provider, Logger: cfg.Logger, Metrics: cfg.Metrics}); err != nil {
			return nil, err
		}
		services = append(services, plan)
	}
	var auditor *audit.Service
	if !cfg.NoAuditor {
		ac := cfg.Audit
		ac.Prefix, ac.Logger, ac.Metrics = cfg.Prefix, cfg.Logger, cfg.Metrics
		anc, err := conn("auditor")
		if err != nil {
			return nil, err
		}
		aud, err := audit.New(anc, ac)
		if err != nil {
			return nil, err
		}
		services = append(services, aud)
		auditor = aud
	}
	s.auditor = auditor
	for i := 0; i < cfg.Executors; i++ {
		ecfg := cfg.Executor
		ecfg.Prefix, ecfg.Pool, ecfg.ID, ecfg.Logger = cfg.Prefix, cfg.Pool, fmt.Sprintf("executor-%d", i+1), cfg.Logger
		if cfg.Slots > 0 {
			ecfg.Slots = cfg.Slots
		}
		if cfg.Metrics != nil { // a nil *Metrics must not become a non-nil Observer
			ecfg.Observer = cfg.Metrics
		}
		enc, err := conn(executorUser(cfg.Pool))
		if err != nil {
			return nil, err
		}
		ex, err := executor.New(enc, ecfg)
		if err != nil {
			return nil, err
		}
		if cfg.Register != nil {
			if err := cfg.Register(ex); err != nil {
				return nil, err
			}
		}
		s.Executors = append(s.Executors, ex)
		services = append(services, ex)
	}
	runCtx, cancel := context.WithCancel(ctx)
	s.cancel = cancel
	started = true
	failed := make(chan struct{})
	var failOnce sync.Once
	for _, svc := range services {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			// A service stopped while still starting up returns the
			// cancellation: that is a clean stop too.
			if err := svc.Run(runCtx); err != nil && !(runCtx.Err() != nil && errors.Is(err, context.Canceled)) {
				s.mu.Lock()
				s.errs = append(s.errs, err)
				s.mu.Unlock()
				failOnce.Do(func() { close(failed) })
			}
		}()
	}
	var waitFor []<-chan struct{}
	if !cfg.NoDispatcher {
		waitFor = append(waitFor, disp.Ready())
	}
	for _, ex := range s.Executors {
		waitFor = append(waitFor, ex.Ready())
	}
	if plan != nil {
		waitFor = append(waitFor, plan.Ready())
	}
	for _, ch := range waitFor {
		select {
		case <-ch:
		case <-failed:
			err := s.Stop()
			return nil, fmt.Errorf("stack: a service failed to start: %w", err)
		case <-ctx.Done():
			s.Stop()
			return nil, ctx.Err()
		}
	}
	if plan != nil {
		// The executors' announcements are in the catalog (they are
		// ready): the planner offers their actions from the first run on.
		plan.CatchUp(ctx)
	}
	return s, nil
}

// Stop stops every service, waits for them to drain and returns their
// errors.
func (s *Stack) Stop() error {
	s.cancel()
	s.wg.Wait()
	s.closeConns()
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
}

func (s *Stack) closeConns() {
	s.mu.Lock()
	conns := s.conns
	s.conns = nil
	s.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// executorUser is the NATS user of pool's executors: "executor" for the
// default pool (or none named), "executor-<pool>" otherwise.
func executorUser(pool string) string {
	if pool == "" || pool == "default" {
		return "executor"
	}
	return "executor-" + pool
}

// registrarRunner serves a registrar (registrar.Run) as a stack service.
type registrarRunner struct {
	nc     *nats.Conn
	prefix string
	log    *slog.Logger
}

func (r registrarRunner) Run(ctx context.Context) error {
	return registrar.Run(ctx, r.nc, r.prefix, r.log)
}
