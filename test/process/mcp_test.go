package process

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/executor"
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
