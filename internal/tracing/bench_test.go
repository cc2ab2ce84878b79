package tracing_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/actionbus/actionbus/internal/tracing"
)

// BenchmarkAHopWithTracingOff is what tracing costs a hop when nothing is
// configured: extract from the headers, start and end a span (no-op), and
// inject into the next message's headers (nothing is written).
func BenchmarkAHopWithTracingOff(b *testing.B) {
	ctx := context.Background()
	in := nats.Header{"Nats-Msg-Id": []string{"x"}}
	b.ReportAllocs()
	for b.Loop() {
		c := tracing.Extract(ctx, in)
		c, span := tracing.Tracer().Start(c, "execute_tool echo", trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(tracing.RunIDKey.String("01JAAAAAAAAAAAAAAAAAAAAAAA")))
		out := nats.Header{}
		tracing.Inject(c, out)
		span.End()
		if len(out) != 0 {
			b.Fatal("a header was written with tracing off")
		}
	}
}
