package bus_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/internal/bus"
)

// TestANewPoolsExecutorIsToldToProvisionIt: docs/protocol.md E-PROVISION.
// On a deployment provisioned for pool default only, an executor of pool
// payments (whose start checks Needs("executor", "payments")) is refused
// with missing_topology naming its work consumer and the command that
// creates it, `actionbus provision --pool payments`; after that command's
// work (Provision with the pool) it starts.
func TestANewPoolsExecutorIsToldToProvisionIt(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	topo := bus.Topology{}
	err := topo.Check(ctx, srv.JS, topo.Needs("executor", "payments"))
	require.ErrorIs(t, err, actionbus.ErrMissingTopology)
	var typed *actionbus.Error
	require.True(t, errors.As(err, &typed))
	assert.Equal(t, "actionbus provision --nats <url> --pool payments", typed.Details["command"])
	assert.Contains(t, typed.Message, "consumer AB_WORK/"+bus.PoolConsumer("payments"))
	assert.Contains(t, typed.Message, "`actionbus provision --nats <url> --pool payments`")

	require.NoError(t, bus.Topology{Pools: []string{"payments"}}.Provision(ctx, srv.JS))
	assert.NoError(t, topo.Check(ctx, srv.JS, topo.Needs("executor", "payments")))
	assert.NoError(t, topo.Check(ctx, srv.JS, topo.Needs("executor", "default")), "provisioning one pool leaves the others as they are")
}
