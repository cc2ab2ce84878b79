package mcpserve_test

import (
	"context"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/mcpserve"
)

var key = []byte("0123456789abcdef0123456789abcdef")

type stockIn struct {
	SKU string `json:"sku"`
}

type stockOut struct {
	SKU       string `json:"sku"`
	Available int    `json:"available"`
}

func register(ex *executor.Executor) error {
	if err := executor.Register(ex, executor.Action{Name: "inv.stock", Description: "Units available for a SKU."},
		func(_ context.Context, in stockIn, _ executor.Call) (executor.Result[stockOut], error) {
			return executor.Result[stockOut]{Output: stockOut{SKU: in.SKU, Available: 12}, Summary: "12 available"}, nil
		}); err != nil {
		return err
	}
	if err := executor.Register(ex, executor.Action{Name: "inv.reorder", Description: "Reorder a SKU.", Mode: executor.ModeMutate, Tier: 2},
		func(_ context.Context, in stockIn, call executor.Call) (executor.Result[map[string]any], error) {
			if call.Approval == nil {
				return executor.Result[map[string]any]{}, actionbus.Errorf(actionbus.CodeApprovalRequired, "no approval")
			}
			return executor.Result[map[string]any]{Output: map[string]any{"reordered": in.SKU}}, nil
		}); err != nil {
		return err
	}
	return executor.Register(ex, executor.Action{Name: "inv.internal", Description: "Hidden.", Planner: &executor.PlannerMeta{Hidden: true}},
		func(context.Context, stockIn, executor.Call) (executor.Result[stockOut], error) {
			return executor.Result[stockOut]{}, nil
		})
}

// connect serves s over streamable HTTP on loopback and connects a real
// SDK client to it.
func connect(t *testing.T, s *mcpserve.Server, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.MCP() }, nil))
	t.Cleanup(hs.Close)
	c := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "1"}, opts)
	session, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: hs.URL}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = session.Close() })
	return session
}

func TestAnMCPClientListsCallsAndIsToldAboutApprovals(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	recorded := srv.Record(t, "ab.run.>")
	st := srv.StartStack(t, actionbustest.StackOptions{Register: register, ApprovalKeys: "k1:" + base64.StdEncoding.EncodeToString(key)})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s := mcpserve.New(mcpserve.Config{Client: st.Client, CallTimeout: 20 * time.Second})
	require.NoError(t, s.Sync(ctx))

	told := make(chan string, 4)
	session := connect(t, s, &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
		told <- req.Params.Message
	}})

	tools, err := session.ListTools(ctx, nil)
	require.NoError(t, err)
	byName := map[string]*mcp.Tool{}
	for _, tl := range tools.Tools {
		byName[tl.Name] = tl
	}
	require.Contains(t, byName, "inv.stock")
	require.Contains(t, byName, "inv.reorder")
	assert.NotContains(t, byName, "inv.internal", "only planner-visible actions")
	assert.True(t, byName["inv.stock"].Annotations.ReadOnlyHint)
	assert.True(t, *byName["inv.reorder"].Annotations.DestructiveHint)
	assert.Contains(t, byName["inv.stock"].InputSchema.(map[string]any)["properties"], "sku")

	// The caller's trace context in params._meta: the run joins its trace.
	res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: "inv.stock", Arguments: map[string]any{"sku": "A-1"},
		Meta: mcp.Meta{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}})
	require.NoError(t, err)
	require.False(t, res.IsError, "%v", res.Content)
	assert.Equal(t, map[string]any{"sku": "A-1", "available": 12.0}, res.StructuredContent)
	runID, _ := res.Meta[mcpserve.MetaRunID].(string)
	require.NotEmpty(t, runID)
	completed := recorded.WaitForType(t, 10*time.Second, "io.actionbus.run.completed", runID)
	assert.Contains(t, completed.Header.Get("ce-traceparent"), "0af7651916cd43dd8448eb211c80319c", "the run carries the MCP caller's trace")
	recs, err := st.Client.AuditRecords(ctx, runID)
	require.NoError(t, err)
	var action *client.AuditRecord
	for i := range recs {
		if recs[i].Action == "inv.stock" && recs[i].Status == "succeeded" {
			action = &recs[i]
		}
	}
	require.NotNil(t, action, "the call is audited")
	assert.Equal(t, "mcp", recs[0].UserID, "as the served user")

	// A mutation: the client is told the approval id at once; an approver
	// gives it while the call waits, and the call completes.
	type outcome struct {
		res *mcp.CallToolResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		r, err := session.CallTool(ctx, &mcp.CallToolParams{Name: "inv.reorder", Arguments: map[string]any{"sku": "A-1"},
			Meta: mcp.Meta{"progressToken": "reorder-1"}})
		done <- outcome{r, err}
	}()
	var msg string
	select {
	case msg = <-told:
	case <-ctx.Done():
		t.Fatal("the client was not told about the approval")
	}
	m := regexp.MustCompile(`awaiting approval (\S+) .*actionbus approve (\S+)`).FindStringSubmatch(msg)
	require.NotNil(t, m, msg)
	require.NoError(t, st.Client.Approve(ctx, m[1], "k1", key))
	out := <-done
	require.NoError(t, out.err)
	require.False(t, out.res.IsError, "%v", out.res.Content)
	assert.Equal(t, map[string]any{"reordered": "A-1"}, out.res.StructuredContent)

	// Not approved before the call's deadline: the call says so, with the
	// approval id, instead of hanging.
	short := mcpserve.New(mcpserve.Config{Client: st.Client, CallTimeout: 2 * time.Second})
	require.NoError(t, short.Sync(ctx))
	res, err = connect(t, short, nil).CallTool(ctx, &mcp.CallToolParams{Name: "inv.reorder", Arguments: map[string]any{"sku": "B-2"}})
	require.NoError(t, err)
	assert.True(t, res.IsError)
	sc := res.StructuredContent.(map[string]any)
	assert.Equal(t, "awaiting_approval", sc["status"])
	assert.NotEmpty(t, sc["approvalId"])

	// A call the dispatcher refuses is an error result with its code.
	res, err = session.CallTool(ctx, &mcp.CallToolParams{Name: "inv.stock", Arguments: map[string]any{"sku": 7}})
	require.NoError(t, err)
	assert.True(t, res.IsError)
	assert.Equal(t, string(actionbus.CodeActionArgsInvalid), res.StructuredContent.(map[string]any)["code"], "%v", res.StructuredContent)
}
