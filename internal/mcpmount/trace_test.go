package mcpmount_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/mcpmount"
	"github.com/actionbus/actionbus/internal/tracing"
)

// TestACallCarriesItsTraceToTheServer: a mounted tool's call sends the
// call's span context in params._meta, so the MCP server's own spans join
// the run's trace.
func TestACallCarriesItsTraceToTheServer(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(prev); _ = tp.Shutdown(context.Background()) })

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	seen := make(chan string, 1)
	server := mcp.NewServer(&mcp.Implementation{Name: "traced", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "look", Description: "Looks.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, req *mcp.CallToolRequest, _ textIn) (*mcp.CallToolResult, map[string]any, error) {
			p, _ := req.Params.GetMeta()["traceparent"].(string)
			select {
			case seen <- p:
			default:
			}
			return nil, map[string]any{"ok": true}, nil
		})
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	hs := httptest.NewServer(handler)
	t.Cleanup(func() { cancel(); hs.CloseClientConnections(); hs.Close() })
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		_, err := mcpmount.Start(ctx, ex, mcpmount.ServerConfig{Name: "traced", URL: hs.URL, Trusted: true}, nil)
		return err
	}})
	rctx, span := tracing.Tracer().Start(ctx, "caller")
	defer span.End()
	rctx, rcancel := context.WithTimeout(rctx, 30*time.Second)
	defer rcancel()
	res, err := st.Client.Run(rctx, client.RunRequest{Action: &client.ActionCall{Name: "traced.look", Args: map[string]any{"text": "x"}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	select {
	case p := <-seen:
		assert.True(t, strings.Contains(p, span.SpanContext().TraceID().String()), "traceparent %q is not in the caller's trace", p)
	case <-rctx.Done():
		t.Fatal("the server was not called")
	}
}
