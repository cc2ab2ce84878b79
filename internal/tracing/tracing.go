// Package tracing carries W3C trace context across actionbus's services
// and exports spans over OTLP/HTTP when the standard OpenTelemetry
// environment asks for it (docs/operations.md, "Traces").
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
	"errors"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Instrumentation is the tracer's instrumentation scope name.
const Instrumentation = "github.com/actionbus/actionbus"

// Tracer returns actionbus's tracer from the global provider (no-op
// unless [Setup] or a test installed one).
func Tracer() trace.Tracer { return otel.Tracer(Instrumentation) }

// Configured reports whether the environment asks for exported traces:
// an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT), OTEL_SDK_DISABLED is not true and
// OTEL_TRACES_EXPORTER is not none.
func Configured() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") || os.Getenv("OTEL_TRACES_EXPORTER") == "none" {
		return false
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup installs a tracer provider exporting over OTLP/HTTP when
// [Configured], named service (OTEL_SERVICE_NAME wins), and returns its
// shutdown (which flushes the spans). Unconfigured, it installs nothing
// and returns a no-op shutdown. The exporter reads the rest of the
// standard OTEL_EXPORTER_OTLP_* environment (headers, timeout,
// certificates); OTEL_TRACES_SAMPLER picks the sampler.
func Setup(ctx context.Context, service string) (func(context.Context) error, error) {
	if !Configured() {
		return func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, err
	}
	if v := os.Getenv("OTEL_SERVICE_NAME"); v != "" {
		service = v
	}
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithAttributes(semconv.ServiceName(service)))
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// propagator is W3C trace context, whatever the global propagator is:
// the headers are part of the wire format (docs/events.md).
var propagator = propagation.TraceContext{}

// headerCarrier adapts NATS headers to the propagator, keeping the
// lowercase W3C header names as they are.
type headerCarrier nats.Header

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
func Inject(ctx context.Context, h nats.Header) {
	if trace.SpanContextFromContext(ctx).IsValid() {
		propagator.Inject(ctx, headerCarrier(h))
	}
}

// Extract returns ctx with the remote span context of h, when h holds
// one.
func Extract(ctx context.Context, h nats.Header) context.Context {
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
	h := nats.Header{}
	propagator.Inject(ctx, headerCarrier(h))
	r := &Run{Parent: headerCarrier(h).Get("traceparent"), State: headerCarrier(h).Get("tracestate")}
	return r
}

// RunFromExtensions reads the run context of an event's extensions.
func RunFromExtensions(ext map[string]any) *Run {
	p, _ := ext[ExtTraceParent].(string)
	if p == "" {
		return nil
	}
	s, _ := ext[ExtTraceState].(string)
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
