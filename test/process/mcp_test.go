package process

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/httpapi"
	"github.com/actionbus/actionbus/internal/policy"
)

// `actionbus mcp serve` as its own process, speaking MCP on stdio to a
// real SDK client: it lists the catalog's actions as tools and runs a call
// through the services.
func TestMCPServeOverStdio(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts the CLI")
	}
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "greet", Description: "Greet someone."},
			func(_ context.Context, in struct {
				Name string `json:"name"`
			}, _ executor.Call) (executor.Result[map[string]any], error) {
				return executor.Result[map[string]any]{Output: map[string]any{"greeting": "hello " + in.Name}}, nil
			})
	}})
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", dir+"/", "./cmd/actionbus")
	build.Dir = repoRoot(t)
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stderr actionbustest.LogBuffer
	cmd := exec.Command(filepath.Join(dir, "actionbus"), "--nats", srv.URL, "mcp", "serve", "--user", "mcp-test")
	cmd.Stderr = &stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	session, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	require.NoError(t, err, "stderr: %s", stderr.String())
	defer session.Close()

	tools, err := session.ListTools(ctx, nil)
	require.NoError(t, err, "stderr: %s", stderr.String())
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
	}
	assert.Contains(t, names, "greet")
	res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: "greet", Arguments: map[string]any{"name": "ann"}})
	require.NoError(t, err)
	require.False(t, res.IsError, "%v", res.Content)
	assert.Equal(t, map[string]any{"greeting": "hello ann"}, res.StructuredContent)
}

// bearer adds a bearer token to every request.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// `actionbus mcp serve --http` as its own process: it refuses to start
// without tokens or on a non-loopback address in plain HTTP; an
// unauthenticated initialize is answered 401, a reader lists but cannot
// call, a runner's call is refused the role its token does not grant, and
// a call runs for the token's user, holding its token entry's grants (the
// policy requires the role finance).
func TestMCPServeOverHTTPAuthenticatesEveryCaller(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts the CLI")
	}
	gatewayKey := []byte("fedcba9876543210fedcba9876543210")
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{
		ApprovalKeys: "mcp-gw:" + base64.StdEncoding.EncodeToString(gatewayKey) + ":*",
		Policy:       `{"requireRoles": {"refund": "finance"}}`,
		Register: func(ex *executor.Executor) error {
			return executor.Register(ex, executor.Action{Name: "refund", Description: "Refund an order."},
				func(_ context.Context, in struct {
					Order string `json:"order"`
				}, _ executor.Call) (executor.Result[map[string]any], error) {
					return executor.Result[map[string]any]{Output: map[string]any{"refunded": in.Order}}, nil
				})
		}})
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", dir+"/", "./cmd/actionbus")
	build.Dir = repoRoot(t)
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	bin := filepath.Join(dir, "actionbus")

	readerTok, reader, err := httpapi.NewToken("rita", httpapi.RoleRead)
	require.NoError(t, err)
	runnerTok, runner, err := httpapi.NewToken("ravi", httpapi.RoleRun)
	require.NoError(t, err)
	financeTok, finance, err := httpapi.NewToken("fiona", httpapi.RoleRun)
	require.NoError(t, err)
	finance.Grants = policy.Grants{Roles: []string{"finance"}}
	doc, err := json.Marshal(httpapi.Tokens{Tokens: []httpapi.Token{reader, runner, finance}})
	require.NoError(t, err)
	tokens := filepath.Join(dir, "tokens.json")
	require.NoError(t, os.WriteFile(tokens, doc, 0o600))

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	refused := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, bin, append([]string{"--nats", srv.URL, "mcp", "serve"}, args...)...)
		cmd.Env = append(os.Environ(), "ACTIONBUS_APPROVAL_KEY=")
		out, err := cmd.CombinedOutput()
		require.Error(t, err, "mcp serve %v started: %s", args, out)
		return string(out)
	}
	assert.Contains(t, refused("--http", "0.0.0.0:0", "--tokens", tokens), "not a loopback address")
	assert.Contains(t, refused("--http", "127.0.0.1:0"), "--tokens")

	cmd := exec.CommandContext(ctx, bin, "--nats", srv.URL, "mcp", "serve", "--http", "127.0.0.1:0", "--tokens", tokens)
	cmd.Env = append(os.Environ(), "ACTIONBUS_APPROVAL_KEY=mcp-gw:"+base64.StdEncoding.EncodeToString(gatewayKey))
	var stderr actionbustest.LogBuffer
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	addr := regexp.MustCompile(`serving MCP on (http://\S+)`)
	var endpoint string
	require.Eventually(t, func() bool {
		m := addr.FindStringSubmatch(stderr.String())
		if m != nil {
			endpoint = m[1]
		}
		return m != nil
	}, 30*time.Second, 20*time.Millisecond, "stderr: %s", stderr.String())

	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(initialize))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "an unauthenticated initialize was served")

	session := func(token string) *mcp.ClientSession {
		t.Helper()
		c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
		s, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: &http.Client{Transport: bearer{token}}}, nil)
		require.NoError(t, err, "stderr: %s", stderr.String())
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	refund := map[string]any{"order": "O-1"}
	rs := session(readerTok)
	tools, err := rs.ListTools(ctx, nil)
	require.NoError(t, err)
	require.NotEmpty(t, tools.Tools, "a reader lists the tools")
	res, err := rs.CallTool(ctx, &mcp.CallToolParams{Name: "refund", Arguments: refund})
	require.NoError(t, err)
	require.True(t, res.IsError, "a reader's call ran")
	assert.Contains(t, res.Content[0].(*mcp.TextContent).Text, "forbidden")

	res, err = session(runnerTok).CallTool(ctx, &mcp.CallToolParams{Name: "refund", Arguments: refund})
	require.NoError(t, err)
	require.True(t, res.IsError, "a runner without the finance grant refunded")
	assert.Contains(t, res.Content[0].(*mcp.TextContent).Text, "policy_rejected")

	res, err = session(financeTok).CallTool(ctx, &mcp.CallToolParams{Name: "refund", Arguments: refund})
	require.NoError(t, err)
	require.False(t, res.IsError, "%v", res.Content)
	runID, _ := res.Meta["actionbus/runId"].(string)
	recs, err := st.Client.AuditRecords(ctx, runID)
	require.NoError(t, err)
	require.NotEmpty(t, recs)
	assert.Equal(t, "fiona", recs[0].UserID, "the call's run acts for the token's user")
}
