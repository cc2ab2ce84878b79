package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
)

// TestCheckRunTellsMalformedUnknownAndOtherTenantsRuns: CheckRun is nil
// for a run of the tenant, invalid_run_id for a malformed id,
// run_not_found for an unknown run and for another tenant's; a retry of
// another tenant's run is run_not_found too (not "no longer stored").
func TestCheckRunTellsMalformedUnknownAndOtherTenantsRuns(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{NoPlanner: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mine, err := st.Client.Start(ctx, client.RunRequest{Prompt: "anyone there?", UserID: "u1"})
	require.NoError(t, err)
	acme, err := client.New(srv.Connect(t), client.Options{Tenant: "acme"})
	require.NoError(t, err)

	assert.NoError(t, st.Client.CheckRun(ctx, mine))
	assert.ErrorIs(t, st.Client.CheckRun(ctx, "not-a-run"), actionbus.ErrInvalidRunID)
	assert.ErrorIs(t, client.CheckRunID("not-a-run"), actionbus.ErrInvalidRunID)
	assert.ErrorIs(t, st.Client.CheckRun(ctx, events.NewID()), &actionbus.Error{Code: actionbus.CodeRunNotFound})
	assert.ErrorIs(t, acme.CheckRun(ctx, mine), &actionbus.Error{Code: actionbus.CodeRunNotFound}, "another tenant's run")
	_, err = acme.Retry(ctx, mine)
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeRunNotFound}, "a retry of another tenant's run")

	assert.ErrorIs(t, client.CheckApprovalID("not-an-approval"), actionbus.ErrInvalidRunID)
	assert.ErrorIs(t, client.CheckApprovalID(mine+"-1-x"), actionbus.ErrInvalidRunID)
	assert.NoError(t, client.CheckApprovalID(mine+"-1-0"))
	assert.NoError(t, client.CheckApprovalID(mine+"-2-3-2"))
	_, err = st.Client.Approval(ctx, mine+"-1-0")
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeApprovalNotFound})
}
