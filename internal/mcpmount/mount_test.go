package mcpmount_test

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/mcpmount"
)

var key = []byte("0123456789abcdef0123456789abcdef")

type textIn struct {
	Text string `json:"text"`
}

// testServer is an MCP server built with the SDK: echo (read-only), delete
// (destructive), fail (isError) and crash (the process dies mid-call).
func testServer() *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "files", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Echo a text.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, in textIn) (*mcp.CallToolResult, map[string]any, error) {
			return nil, map[string]any{"echo": in.Text}, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "delete", Description: "Delete a file."},
		func(_ context.Context, _ *mcp.CallToolRequest, in textIn) (*mcp.CallToolResult, map[string]any, error) {
			return nil, map[string]any{"deleted": in.Text}, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "fail", Description: "Always fails.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest, textIn) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "disk on fire"}}}, nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "crash", Description: "Dies.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest, textIn) (*mcp.CallToolResult, any, error) {
			os.Exit(3)
			return nil, nil, nil
		})
	return s
}

// TestMain doubles as the stdio MCP server the tests mount.
func TestMain(m *testing.M) {
	if os.Getenv("MCPMOUNT_TEST_SERVER") == "stdio" {
		if err := testServer().Run(context.Background(), &mcp.StdioTransport{}); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func exec(t *testing.T, c *client.Client, name string, args map[string]any) *client.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: name, Args: args}, AllowedModes: []string{"read", "mutate"}}, nil)
	require.NoError(t, err)
	return res
}

func TestAStdioServersToolsRunAsActions(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "ab.run.>")
	st := srv.StartStack(t, actionbustest.StackOptions{ApprovalKeys: "k1:" + base64.StdEncoding.EncodeToString(key),
		Register: func(ex *executor.Executor) error {
			_, err := mcpmount.Start(ctx, ex, mcpmount.ServerConfig{Name: "files", Command: []string{os.Args[0], "-test.run=^$"},
				Env: map[string]string{"MCPMOUNT_TEST_SERVER": "stdio"}, Trusted: true}, nil)
			return err
		}})
	list, err := st.Client.Actions(ctx)
	require.NoError(t, err)
	modes := map[string]string{}
	for _, a := range list {
		modes[a.Name] = a.Mode
	}
	assert.Equal(t, "read", modes["files.echo"], "readOnlyHint: read")
	assert.Equal(t, "mutate", modes["files.delete"], "no annotations: the conservative mutate")

	res := exec(t, st.Client, "files.echo", map[string]any{"text": "hi"})
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, map[string]any{"echo": "hi"}, res.Output)

	res = exec(t, st.Client, "files.fail", map[string]any{"text": "x"})
	require.Equal(t, client.StatusFailed, res.Status)
	assert.Equal(t, actionbus.CodeMCPToolError, res.Error.Code)
	assert.Contains(t, res.Error.Message, "disk on fire")

	// A destructive tool waits for an approval.
	runID, err := st.Client.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: "files.delete", Args: map[string]any{"text": "a.txt"}},
		AllowedModes: []string{"read", "mutate"}})
	require.NoError(t, err)
	var step events.RunStep
	rec.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
		return events.IsRunStep(r.Type()) && events.DataAs(r.Event, &step) == nil && step.RunID == runID && step.Name == "awaiting-approval"
	})

	// The server dies mid-call: a typed failure; it is started again, and
	// a later call works.
	res = exec(t, st.Client, "files.crash", map[string]any{"text": "x"})
	require.Equal(t, client.StatusFailed, res.Status)
	assert.Equal(t, actionbus.CodeMCPUnavailable, res.Error.Code)
	require.Eventually(t, func() bool {
		return exec(t, st.Client, "files.echo", map[string]any{"text": "again"}).Status == client.StatusCompleted
	}, 20*time.Second, 100*time.Millisecond, "the server came back")
}

func TestAnHTTPServerIsUntrustedAndFollowedWhenItsToolsChange(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	server := testServer()
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer t0ken" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		handler.ServeHTTP(w, r)
	}))
	// The mount holds a standing SSE stream: it ends with ctx, and the
	// server's connections are cut before it closes.
	t.Cleanup(func() { cancel(); hs.CloseClientConnections(); hs.Close() })
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "ab.run.>")
	st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		_, err := mcpmount.Start(ctx, ex, mcpmount.ServerConfig{Name: "remote", URL: hs.URL, Headers: map[string]string{"Authorization": "Bearer t0ken"}}, nil)
		return err
	}})
	// Untrusted: even a read-only tool asks for an approval.
	runID, err := st.Client.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: "remote.echo", Args: map[string]any{"text": "hi"}}})
	require.NoError(t, err)
	var step events.RunStep
	rec.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
		return events.IsRunStep(r.Type()) && events.DataAs(r.Event, &step) == nil && step.RunID == runID && step.Name == "awaiting-approval"
	})

	// The server's tool list changes: the catalog follows.
	mcp.AddTool(server, &mcp.Tool{Name: "added", Description: "A new tool.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest, textIn) (*mcp.CallToolResult, any, error) {
			return nil, nil, nil
		})
	server.RemoveTools("crash")
	require.Eventually(t, func() bool {
		list, err := st.Client.Actions(ctx)
		if err != nil {
			return false
		}
		names := map[string]bool{}
		for _, a := range list {
			names[a.Name] = true
		}
		return names["remote.added"] && !names["remote.crash"]
	}, 20*time.Second, 50*time.Millisecond, "the catalog followed the tool list")
}
