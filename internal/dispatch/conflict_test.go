package dispatch_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/bus"
)

// A name held by two pools' entries is refused: the run that calls it
// ends with catalog_conflict naming both pools, promptly, not at its
// deadline. The registrar never records such a pair (TestARegistrar...);
// a catalog written before the registrar existed, or by an operator, may
// still hold one.
func TestCatalogConflictEndsTheRunPromptly(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{Pools: []string{"default", "gpu"}})
	st := srv.StartStack(t, actionbustest.StackOptions{Scenarios: echoScenario, Register: echoExecutor, Limits: events.RunLimits{RunDeadline: 5 * time.Minute}})
	setup, cancelSetup := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelSetup()
	catKV, err := srv.JS.KeyValue(setup, bus.Topology{}.BucketCatalog())
	require.NoError(t, err)
	entry, err := catKV.Get(setup, "default.test.echo")
	require.NoError(t, err)
	var def map[string]any
	require.NoError(t, json.Unmarshal(entry.Value(), &def))
	def["pool"] = "gpu"
	legacy, err := json.Marshal(def)
	require.NoError(t, err)
	// With its hash (docs/protocol.md R-HASH): an entry with a stale hash
	// would be refused as invalid_record, not held against the other.
	def["hash"], err = actions.EntryHash(legacy)
	require.NoError(t, err)
	legacy, err = json.Marshal(def)
	require.NoError(t, err)
	_, err = catKV.Put(setup, "gpu.test.echo", legacy) // as admin
	require.NoError(t, err)

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
