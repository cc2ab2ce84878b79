// Package tracing carries W3C trace context across actionbus's services
// (package otlp exports spans over OTLP/HTTP when the standard
// OpenTelemetry environment asks for it; docs/operations.md, "Traces").
// This package needs only the OpenTelemetry API, so the client and
// executor packages link no exporter.
//
// Each hop carries the context of the span that sent it in lowercase
// traceparent/tracestate NATS headers; every event of a run also carries
// the run's starting context in the CloudEvents distributed-tracing
// extension (ce-traceparent, ce-tracestate), so that an event sent by a
// caller that does not trace (an approver, a timer) still lands in the
// run's trace. Tracing is off unless configured: the global tracer
// provider is then OpenTelemetry's no-op one, and spans cost nothing but
// a context lookup.
package tracing

import (
	"context"

	"github.com/cloudevents/sdk-go/v2/event"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/actionbus/actionbus/events"
)

// Instrumentation is the tracer's instrumentation scope name.
const Instrumentation = "github.com/actionbus/actionbus"

// Tracer returns actionbus's tracer from the global provider (no-op
// unless otlp.Setup, the embedding program or a test installed one).
func Tracer() trace.Tracer { return otel.Tracer(Instrumentation) }

// propagator is W3C trace context, whatever the global propagator is:
// the headers are part of the wire format (docs/events.md).
var propagator = propagation.TraceContext{}

// Header is a message's headers: a NATS header (nats.Header) is one, and
// so is an http.Header. This package takes the map rather than a NATS
// type so that the run core, which traces, links no NATS client.
type Header = map[string][]string

// headerCarrier adapts message headers to the propagator, keeping the
// lowercase W3C header names as they are.
type headerCarrier Header

func (h headerCarrier) Get(key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func (h headerCarrier) Set(key, value string) { h[key] = []string{value} }

func (h headerCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// Inject writes the span context of ctx into h (traceparent, tracestate);
// nothing when ctx holds none.
func Inject(ctx context.Context, h Header) {
	if trace.SpanContextFromContext(ctx).IsValid() {
		propagator.Inject(ctx, headerCarrier(h))
	}
}

// Extract returns ctx with the remote span context of h, when h holds
// one.
func Extract(ctx context.Context, h Header) context.Context {
	if h == nil || (len(h["traceparent"]) == 0) {
		return ctx
	}
	return propagator.Extract(ctx, headerCarrier(h))
}

// Run is a run's starting trace context: the W3C traceparent and
// tracestate of the span that started it. Events carry it in their
// traceparent/tracestate CloudEvent extensions; run state keeps it.
type Run struct {
	Parent string `json:"traceparent"`
	State  string `json:"tracestate,omitempty"`
}

// CloudEvent extension names of the distributed-tracing extension.
const (
	ExtTraceParent = "traceparent"
	ExtTraceState  = "tracestate"
)

// RunOf returns the run context of a span context (nil when invalid).
func RunOf(ctx context.Context) *Run {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	h := Header{}
	propagator.Inject(ctx, headerCarrier(h))
	r := &Run{Parent: headerCarrier(h).Get("traceparent"), State: headerCarrier(h).Get("tracestate")}
	return r
}

// RunOfEvent reads the run context of an event's extensions (traceparent,
// tracestate); nil when it has none.
func RunOfEvent(e *event.Event) *Run {
	return runOf(events.StringExtension(e, ExtTraceParent), events.StringExtension(e, ExtTraceState))
}

// runOf is the run trace of a traceparent and tracestate, nil without a
// traceparent.
func runOf(p, s string) *Run {
	if p == "" {
		return nil
	}
	return &Run{Parent: p, State: s}
}

// remote returns ctx with r as its remote parent (ctx unchanged when r is
// nil or malformed).
func (r *Run) remote(ctx context.Context) context.Context {
	if r == nil {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier{"traceparent": r.Parent, "tracestate": r.State})
}

// Parent returns the context a span handling an event of the run starts
// from: the hop's (the span that sent the event) when ctx holds one, else
// the run's starting context.
func Parent(ctx context.Context, run *Run) context.Context {
	if trace.SpanContextFromContext(ctx).IsValid() {
		return ctx
	}
	return run.remote(ctx)
}

type runKey struct{}

// WithRun returns ctx carrying the run context that events published
// with it carry in their extensions.
func WithRun(ctx context.Context, r *Run) context.Context {
	if r == nil {
		return ctx
	}
	return context.WithValue(ctx, runKey{}, r)
}

// RunFromContext returns the run context [WithRun] put in ctx.
func RunFromContext(ctx context.Context) *Run {
	r, _ := ctx.Value(runKey{}).(*Run)
	return r
}

// Attribute keys of actionbus's own span attributes.
const (
	RunIDKey     = attribute.Key("actionbus.run_id")
	TenantKey    = attribute.Key("actionbus.tenant")
	EventTypeKey = attribute.Key("cloudevents.event_type")
	EventIDKey   = attribute.Key("cloudevents.event_id")
	CycleKey     = attribute.Key("actionbus.cycle")
	ExecutorKey  = attribute.Key("actionbus.executor")
	AttemptKey   = attribute.Key("actionbus.attempt")
	RecordsKey   = attribute.Key("actionbus.audit.records")
)

// Fail marks span failed with an error's stable code as error.type and
// as the status description (never the message: it may quote input).
func Fail(span trace.Span, code string) {
	span.SetAttributes(semconv.ErrorTypeKey.String(code))
	span.SetStatus(codes.Error, code)
}

// ToMeta returns the W3C trace context of ctx as MCP request metadata
// (params._meta: "traceparent", "tracestate"), nil when ctx holds none.
func ToMeta(ctx context.Context) map[string]any {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	c := propagation.MapCarrier{}
	propagator.Inject(ctx, c)
	m := make(map[string]any, len(c))
	for k, v := range c {
		m[k] = v
	}
	return m
}

// FromMeta returns ctx with the remote span context of MCP request
// metadata, when it holds one.
func FromMeta(ctx context.Context, meta map[string]any) context.Context {
	p, _ := meta["traceparent"].(string)
	if p == "" {
		return ctx
	}
	s, _ := meta["tracestate"].(string)
	return propagator.Extract(ctx, propagation.MapCarrier{"traceparent": p, "tracestate": s})
}
