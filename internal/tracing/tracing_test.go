package tracing_test

import (
	"context"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/actionbus/actionbus/internal/tracing"
)

const (
	hopParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	runParent = "00-11111111111111111111111111111111-2222222222222222-01"
)

func TestTheParentIsTheHopElseTheRun(t *testing.T) {
	run := &tracing.Run{Parent: runParent}
	for _, tc := range []struct {
		name   string
		header nats.Header
		run    *tracing.Run
		want   string // trace id, "" for none
	}{
		{"the hop's header wins", nats.Header{"traceparent": {hopParent}}, run, "0af7651916cd43dd8448eb211c80319c"},
		{"no header: the run's context", nats.Header{}, run, "11111111111111111111111111111111"},
		{"a malformed header: the run's context", nats.Header{"traceparent": {"00-zz-yy-01"}}, run, "11111111111111111111111111111111"},
		{"neither: a root", nats.Header{}, nil, ""},
		{"a malformed run context: a root", nil, &tracing.Run{Parent: "nonsense"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := trace.SpanContextFromContext(tracing.Parent(tracing.Extract(context.Background(), tc.header), tc.run))
			if tc.want == "" {
				assert.False(t, sc.IsValid())
				return
			}
			assert.Equal(t, tc.want, sc.TraceID().String())
			assert.True(t, sc.IsRemote())
		})
	}
}

func TestContextTravelsInHeadersExtensionsAndMCPMeta(t *testing.T) {
	ctx := tracing.Extract(context.Background(), nats.Header{"traceparent": {hopParent}, "tracestate": {"k=v"}})

	h := nats.Header{}
	tracing.Inject(ctx, h)
	assert.Equal(t, hopParent, h.Get("traceparent"), "lowercase W3C header")
	assert.Equal(t, "k=v", h.Get("tracestate"))

	r := tracing.RunOf(ctx)
	assert.Equal(t, &tracing.Run{Parent: hopParent, State: "k=v"}, r)
	traced := event.New()
	require.NoError(t, traced.Context.SetExtension("traceparent", hopParent))
	require.NoError(t, traced.Context.SetExtension("tracestate", "k=v"))
	assert.Equal(t, r, tracing.RunOfEvent(&traced))
	untraced := event.New()
	require.NoError(t, untraced.Context.SetExtension("tenant", "default"))
	assert.Nil(t, tracing.RunOfEvent(&untraced))
	assert.Equal(t, r, tracing.RunFromContext(tracing.WithRun(context.Background(), r)))

	meta := tracing.ToMeta(ctx)
	assert.Equal(t, hopParent, meta["traceparent"])
	back := trace.SpanContextFromContext(tracing.FromMeta(context.Background(), meta))
	assert.Equal(t, "0af7651916cd43dd8448eb211c80319c", back.TraceID().String())

	// Nothing to carry: nothing written.
	empty := nats.Header{}
	tracing.Inject(context.Background(), empty)
	assert.Empty(t, empty)
	assert.Nil(t, tracing.RunOf(context.Background()))
	assert.Nil(t, tracing.ToMeta(context.Background()))
}
