package dispatch_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
)

// TestTheDeployedDispatcherReadsARunsLog: a dispatcher reads a run's
// stored log — its request, results and fired timers, from three streams —
// to repair a run's end that its writer published and did not store, and
// to replay a run. Connected as the deployed dispatcher user, it read them
// through ordered consumers, which the user may not create: the repair
// waited out its deadline and adopted the end instead, and a replay
// failed. It reads them with direct gets, which the user may make.
func TestTheDeployedDispatcherReadsARunsLog(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{Users: true})
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: echoAction})
	d := deployedDispatcher(t, srv)

	res, err := st.Client.Run(ctxT(t), client.RunRequest{Action: &client.ActionCall{Name: "test.echo", Args: map[string]any{"a": 1.0}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)

	rep, err := d.ReplayLog(ctxT(t), events.DefaultTenant, res.RunID)
	require.NoError(t, err, "the deployed dispatcher reads the run's log")
	assert.Equal(t, []string{events.TypeRunRequested, events.TypeActionCompleted}, rep.Events)
	require.NotNil(t, rep.Replayed.Terminal)
	assert.Equal(t, map[string]any{"a": 1.0}, rep.Replayed.Terminal.Output)
}
