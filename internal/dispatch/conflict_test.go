package dispatch_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
)

// A name published by two pools is refused: the run that calls it ends
// with catalog_conflict naming both pools, promptly, not at its deadline.
func TestCatalogConflictEndsTheRunPromptly(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{Pools: []string{"default", "gpu"}})
	gpu, err := executor.New(srv.Connect(t), executor.Config{Pool: "gpu", ID: "gpu-1"})
	require.NoError(t, err)
	require.NoError(t, echoExecutor(gpu))
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- gpu.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	select {
	case <-gpu.Ready():
	case err := <-done:
		t.Fatalf("gpu executor: %v", err)
	}

	st := srv.StartStack(t, actionbustest.StackOptions{Scenarios: echoScenario, Register: echoExecutor, RunDeadline: 5 * time.Minute})
	// Well under the run's deadline: the conflict is answered, not redelivered.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "echo"}, nil)
	require.NoError(t, err)
	assert.Equal(t, client.StatusFailed, res.Status)
	require.NotNil(t, res.Error)
	assert.ErrorIs(t, res.Error, actionbus.ErrCatalogConflict)
	assert.Contains(t, res.Error.Message, "default")
	assert.Contains(t, res.Error.Message, "gpu")
	assert.Equal(t, "test.echo", res.Error.Details["action"])
}
