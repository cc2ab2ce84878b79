package client_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
)

// A retry of another tenant's run is run_not_found for the retrying
// tenant, word for word the answer for a run that never was: nothing
// suggests the run exists (not "no longer stored").
func TestARetryOfAnotherTenantsRunIsRunNotFoundForThatTenant(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{Users: true, Tenants: []string{"acme", "globex"}})
	srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "t.fail"},
			func(context.Context, map[string]any, executor.Call) (executor.Result[map[string]any], error) {
				return executor.Result[map[string]any]{}, actionbus.Errorf("t_failed", "always")
			})
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	globex, err := client.New(srv.TenantConnect(t, "client-globex", "globex"), client.Options{Tenant: "globex"})
	require.NoError(t, err)
	acme, err := client.New(srv.TenantConnect(t, "client-acme", "acme"), client.Options{Tenant: "acme"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		list, _ := globex.Actions(ctx)
		return len(list) > 0
	}, 30*time.Second, 50*time.Millisecond, "the catalog")
	res, err := globex.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "t.fail", Args: map[string]any{}}, UserID: "u"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusFailed, res.Status, "globex's run fails, so that it could be retried")

	_, foreign := acme.Retry(ctx, res.RunID)
	var abErr *actionbus.Error
	require.ErrorAs(t, foreign, &abErr)
	assert.Equal(t, actionbus.CodeRunNotFound, abErr.Code)
	assert.Contains(t, abErr.Message, "no run "+res.RunID+" in tenant acme")
	assert.NotContains(t, foreign.Error(), "no longer stored")
	missing := events.NewID()
	_, never := acme.Retry(ctx, missing)
	require.ErrorAs(t, never, &abErr)
	assert.Equal(t, actionbus.CodeRunNotFound, abErr.Code)
	assert.Equal(t, never.Error(), replaceID(foreign.Error(), res.RunID, missing), "another tenant's run is answered as a run that never was")
}

func replaceID(s, from, to string) string {
	return strings.ReplaceAll(s, from, to)
}
