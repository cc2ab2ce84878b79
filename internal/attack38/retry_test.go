package attack38_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/accounts"
)

// TestAttack38_TenantClientRetriesARunThatCalledNothingWithAnotherAction:
// row 88 says a one-action run is retried only with the action it
// called. The check compares the retry's action with the prior run's
// first call, and a run that failed before its call (its action is not
// in the catalog, or policy or its arguments refused it) has none: a
// tenant's NATS client retries such a run with any other action, which
// runs, claims the failed run and is recorded as its retry. Safe: the
// retry is refused retry_refused and the other action never runs.
func TestAttack38_TenantClientRetriesARunThatCalledNothingWithAnotherAction(t *testing.T) {
	srv := operatorServer(t, 0)
	const tenant = "acme"
	nc := srv.TenantAdd(t, tenant, accounts.Limits{})
	var deletes atomic.Int32
	srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "files.delete", Description: "Delete files."},
			func(context.Context, struct{}, executor.Call) (executor.Result[string], error) {
				deletes.Add(1)
				return executor.Result[string]{Output: "deleted"}, nil
			})
	}})
	c, err := client.New(nc, client.Options{Prefix: srv.Prefix, Tenant: tenant})
	require.NoError(t, err)
	ctx := ctxFor(t, 90*time.Second)

	first, err := c.Run(ctx, client.RunRequest{UserID: "ada", Action: &client.ActionCall{Name: "files.read", Args: map[string]any{}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, first.Status, "files.read is in no catalog")

	retry, err := c.Run(ctx, client.RunRequest{UserID: "ada", RetryOf: first.RunID,
		Action: &client.ActionCall{Name: "files.delete", Args: map[string]any{}}}, nil)
	require.NoError(t, err)
	assert.Equal(t, client.StatusFailed, retry.Status, "a retry of a files.read run that asks for files.delete is refused")
	if assert.NotNil(t, retry.Error) {
		assert.Equal(t, actionbus.CodeRetryRefused, retry.Error.Code, "%+v", retry.Error)
	}
	assert.Zero(t, deletes.Load(), "files.delete never runs as the retry of files.read")
}
