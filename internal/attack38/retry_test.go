package attack38_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
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
	nc := srv.TenantAdd(t, tenant, actionbustest.TenantLimits{})
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

// TestAttack38_TenantClientRetriesAOneActionRunWithOtherArguments: row
// 88's threat is a different effect recorded, and claimed, as the retry
// of the first. A one-action retry is checked for its action's name
// only: a tenant's NATS client retries a failed refund of 10 with a
// refund of 10000, which runs as the retry of the first. Safe: the retry
// is refused retry_refused and the other refund never runs.
func TestAttack38_TenantClientRetriesAOneActionRunWithOtherArguments(t *testing.T) {
	srv := operatorServer(t, 0)
	const tenant = "acme"
	nc := srv.TenantAdd(t, tenant, actionbustest.TenantLimits{})
	type refund struct {
		Amount int `json:"amount"`
	}
	var refunded []int
	var mu sync.Mutex
	srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "payments.refund", Description: "Refund an amount."},
			func(_ context.Context, in refund, _ executor.Call) (executor.Result[string], error) {
				mu.Lock()
				defer mu.Unlock()
				refunded = append(refunded, in.Amount)
				if in.Amount == 10 {
					return executor.Result[string]{}, errors.New("the bank did not answer")
				}
				return executor.Result[string]{Output: "refunded"}, nil
			})
	}})
	c, err := client.New(nc, client.Options{Prefix: srv.Prefix, Tenant: tenant})
	require.NoError(t, err)
	ctx := ctxFor(t, 90*time.Second)

	first, err := c.Run(ctx, client.RunRequest{UserID: "ada", Action: &client.ActionCall{Name: "payments.refund", Args: map[string]any{"amount": 10}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, first.Status)

	retry, err := c.Run(ctx, client.RunRequest{UserID: "ada", RetryOf: first.RunID,
		Action: &client.ActionCall{Name: "payments.refund", Args: map[string]any{"amount": 10000}}}, nil)
	require.NoError(t, err)
	assert.Equal(t, client.StatusFailed, retry.Status, "a retry of a refund of 10 that refunds 10000 is refused")
	if assert.NotNil(t, retry.Error) {
		assert.Equal(t, actionbus.CodeRetryRefused, retry.Error.Code, "%+v", retry.Error)
	}
	mu.Lock()
	defer mu.Unlock()
	assert.NotContains(t, refunded, 10000, "no refund of 10000 runs as the retry of a refund of 10")
}
