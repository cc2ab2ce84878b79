// Package metrics holds the Prometheus metrics of the actionbus services
// and the HTTP server that exposes them with /healthz and /readyz.
//
// It is not a tracing or logging package. A nil *Metrics is valid and
// records nothing, so services and tests that do not scrape pay nothing.
package metrics

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics are the collectors of one process (one or several services).
type Metrics struct {
	// Registry holds every collector below plus the Go and process ones.
	Registry *prometheus.Registry

	handled       *prometheus.CounterVec
	handleSeconds *prometheus.HistogramVec
	inFlight      *prometheus.GaugeVec
	redeliveries  *prometheus.CounterVec
	rejected      *prometheus.CounterVec

	runs       *prometheus.CounterVec
	runSeconds *prometheus.HistogramVec

	decisions       *prometheus.CounterVec
	decisionSeconds *prometheus.HistogramVec

	actions         *prometheus.CounterVec
	actionSeconds   *prometheus.HistogramVec
	actionsInFlight prometheus.Gauge

	auditRecords *prometheus.CounterVec

	capacityWaiting *prometheus.GaugeVec
	capacityWaits   *prometheus.CounterVec

	stateConflicts  prometheus.Counter
	partitionsOwned prometheus.Gauge
	partitionMoves  *prometheus.CounterVec
}

// latency buckets from 0.5 ms to ~2 min.
var buckets = prometheus.ExponentialBuckets(0.0005, 2.5, 14)

// New returns metrics on a new registry.
func New() *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{
		Registry: r,
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "actionbus_events_handled_total",
			Help: "Events handled per consumer and outcome (ok, retry, permanent)."}, []string{"consumer", "outcome"}),
		handleSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "actionbus_event_handle_seconds",
			Help: "Time to handle one event, per consumer.", Buckets: buckets}, []string{"consumer"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "actionbus_events_in_flight",
			Help: "Events being handled now, per consumer."}, []string{"consumer"}),
		redeliveries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "actionbus_redeliveries_total",
			Help: "Events delivered more than once, per consumer."}, []string{"consumer"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "actionbus_events_rejected_total",
			Help: "Events rejected as malformed or invalid, per consumer."}, []string{"consumer"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "actionbus_runs_total",
			Help: "Runs by state reached: started, completed, failed, canceled."}, []string{"kind", "state"}),
		runSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "actionbus_run_duration_seconds",
			Help: "Run duration from start to terminal state.", Buckets: buckets}, []string{"kind", "state"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "actionbus_decisions_total",
			Help: "Planner decisions by type (action, plan, clarify, final, error) and provider."}, []string{"type", "provider"}),
		decisionSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "actionbus_decision_seconds",
			Help: "Time to make one planner decision.", Buckets: buckets}, []string{"provider"}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "actionbus_actions_total",
			Help: "Action executions by action and outcome (succeeded, failed, replayed)."}, []string{"action", "outcome"}),
		actionSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "actionbus_action_seconds",
			Help: "Handler time of one action execution.", Buckets: buckets}, []string{"action"}),
		actionsInFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "actionbus_actions_in_flight",
			Help: "Actions running now in this process's executors."}),
		auditRecords: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "actionbus_audit_records_total",
			Help: "Audit records written, by kind."}, []string{"kind"}),
		capacityWaiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "actionbus_capacity_waiting",
			Help: "Calls waiting for a slot of the action's concurrency key or rate limit, as last seen by this dispatcher."}, []string{"action"}),
		capacityWaits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "actionbus_capacity_waits_total",
			Help: "Times a call was told to wait for capacity, per action."}, []string{"action"}),
		stateConflicts: prometheus.NewCounter(prometheus.CounterOpts{Name: "actionbus_run_state_conflicts_total",
			Help: "Run state writes refused because another writer changed the state first (with partitioned dispatchers, only while partitions move)."}),
		partitionsOwned: prometheus.NewGauge(prometheus.GaugeOpts{Name: "actionbus_partitions_owned",
			Help: "Partitions of the runs this dispatcher serves."}),
		partitionMoves: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "actionbus_partition_moves_total",
			Help: "Partitions this dispatcher took (acquired) or handed on (released)."}, []string{"direction"}),
	}
	r.MustRegister(m.handled, m.handleSeconds, m.inFlight, m.redeliveries, m.rejected, m.runs, m.runSeconds,
		m.decisions, m.decisionSeconds, m.actions, m.actionSeconds, m.actionsInFlight, m.auditRecords, m.capacityWaiting, m.capacityWaits,
		m.stateConflicts, m.partitionsOwned, m.partitionMoves,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// HandleStarted implements bus.ServeObserver.
func (m *Metrics) HandleStarted(consumer string, redelivered bool) {
	if m == nil {
		return
	}
	m.inFlight.WithLabelValues(consumer).Inc()
	if redelivered {
		m.redeliveries.WithLabelValues(consumer).Inc()
	}
}

// HandleDone implements bus.ServeObserver.
func (m *Metrics) HandleDone(consumer, outcome string, took time.Duration) {
	if m == nil {
		return
	}
	m.inFlight.WithLabelValues(consumer).Dec()
	m.handled.WithLabelValues(consumer, outcome).Inc()
	m.handleSeconds.WithLabelValues(consumer).Observe(took.Seconds())
}

// Rejected implements bus.ServeObserver.
func (m *Metrics) Rejected(consumer string) {
	if m != nil {
		m.rejected.WithLabelValues(consumer).Inc()
	}
}

// CapacityWait records the queue of an action's limit key as a dispatcher
// last saw it: waiting calls (0 when a call got its slot), and one wait
// more when some wait.
func (m *Metrics) CapacityWait(action string, waiting int) {
	if m != nil {
		m.capacityWaiting.WithLabelValues(action).Set(float64(waiting))
		if waiting > 0 {
			m.capacityWaits.WithLabelValues(action).Inc()
		}
	}
}

// Value returns the value of the metric name, a gauge or a counter without
// labels (the sum over its series otherwise), and false when no series of
// it was recorded.
func (m *Metrics) Value(name string) (float64, bool) {
	families, err := m.Registry.Gather()
	if err != nil {
		return 0, false
	}
	total, found := 0.0, false
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, mt := range f.GetMetric() {
			switch {
			case mt.GetGauge() != nil:
				total, found = total+mt.GetGauge().GetValue(), true
			case mt.GetCounter() != nil:
				total, found = total+mt.GetCounter().GetValue(), true
			}
		}
	}
	return total, found
}

// StateConflict counts a run state write refused by its revision check.
func (m *Metrics) StateConflict() {
	if m != nil {
		m.stateConflicts.Inc()
	}
}

// PartitionMoved counts a partition acquired (true) or released, and sets
// how many the dispatcher now owns.
func (m *Metrics) PartitionMoved(acquired bool, owned int) {
	if m == nil {
		return
	}
	direction := "released"
	if acquired {
		direction = "acquired"
	}
	m.partitionMoves.WithLabelValues(direction).Inc()
	m.partitionsOwned.Set(float64(owned))
}

// RunStarted counts a run the dispatcher accepted.
func (m *Metrics) RunStarted(kind string) {
	if m != nil {
		m.runs.WithLabelValues(kind, "started").Inc()
	}
}

// RunEnded counts a run reaching a terminal state.
func (m *Metrics) RunEnded(kind, state string, took time.Duration) {
	if m == nil {
		return
	}
	m.runs.WithLabelValues(kind, state).Inc()
	m.runSeconds.WithLabelValues(kind, state).Observe(took.Seconds())
}

// Decision counts a planner decision.
func (m *Metrics) Decision(typ, provider string, took time.Duration) {
	if m == nil {
		return
	}
	m.decisions.WithLabelValues(typ, provider).Inc()
	m.decisionSeconds.WithLabelValues(provider).Observe(took.Seconds())
}

// ActionStarted marks an action running.
func (m *Metrics) ActionStarted() {
	if m != nil {
		m.actionsInFlight.Inc()
	}
}

// ActionDone counts an action execution.
func (m *Metrics) ActionDone(action, outcome string, took time.Duration) {
	if m == nil {
		return
	}
	m.actionsInFlight.Dec()
	m.actions.WithLabelValues(action, outcome).Inc()
	m.actionSeconds.WithLabelValues(action).Observe(took.Seconds())
}

// AuditRecord counts a written audit record.
func (m *Metrics) AuditRecord(kind string) {
	if m != nil {
		m.auditRecords.WithLabelValues(kind).Inc()
	}
}

// Server serves /metrics, /healthz and /readyz.
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// Serve starts the endpoints on addr ("127.0.0.1:9090", ":0" for any free
// port). healthy says whether the process works at all (its NATS
// connection); ready whether it can do its job (what it needs exists).
// Both are asked on every request, with the request's context.
func Serve(addr string, m *Metrics, healthy, ready func(context.Context) error, log *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry}))
	probe := func(check func(context.Context) error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
			defer cancel()
			if err := check(ctx); err != nil {
				http.Error(w, "not ok: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
			_, _ = w.Write([]byte("ok\n"))
		}
	}
	mux.Handle("/healthz", probe(healthy))
	mux.Handle("/readyz", probe(ready))
	s := &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, ln: ln}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && log != nil {
			log.Error("metrics server", "addr", addr, "err", err)
		}
	}()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server.
func (s *Server) Close() error { return s.srv.Close() }
