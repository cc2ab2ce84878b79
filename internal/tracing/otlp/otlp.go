// Package otlp installs OpenTelemetry's SDK with an OTLP/HTTP trace
// exporter when the standard OTEL_* environment asks for one: the
// services' mains and the command line call [Setup].
package otlp

import (
	"context"
	"errors"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

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
