package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/client"
)

// TestTheResultNamesItsTerminalEvent: Result.EventID is the id of the
// run's terminal event, the one its terminal audit record names.
func TestTheResultNamesItsTerminalEvent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, stop := startDeployment(ctx, `scenarios: {}`, registerEcho)
	defer stop()
	c, err := client.New(nc, client.Options{})
	require.NoError(t, err)
	began := time.Now()
	res, err := c.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "demo.echo", Args: map[string]any{"message": "hi"}}}, nil)
	require.NoError(t, err)
	require.NotEmpty(t, res.EventID)
	var audited string
	stopped := assert.AnError
	err = c.AuditStream(ctx, client.AuditQuery{RunID: res.RunID, Since: began, Live: true}, func(_ uint64, rec client.AuditRecord) error {
		if rec.Kind == "run" && rec.Status == "completed" {
			audited = rec.EventID
			return stopped
		}
		return nil
	})
	require.ErrorIs(t, err, stopped)
	assert.Equal(t, res.EventID, audited)
	again, err := c.Wait(ctx, res.RunID)
	require.NoError(t, err)
	assert.Equal(t, res.EventID, again.EventID, "Wait reads the same terminal event")
}
