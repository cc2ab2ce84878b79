package actionstore_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/bus"
)

// TestAnEntryWrittenStraightIntoTheBucketIsNeitherListedNorDispatched:
// an operator (or anyone with write access to the catalog bucket) puts
// entries the registrar never wrote: one with a bogus hash, one that
// makes a mutate action need no approval with a hash recomputed to match.
// Neither is listed by the read service (actionbus actions, HTTP and MCP
// listings read it) nor run by the dispatcher: a run calling them fails
// invalid_record, and each refusal is logged once.
func TestAnEntryWrittenStraightIntoTheBucketIsNeitherListedNorDispatched(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	var logs actionbustest.LogBuffer
	st := srv.StartStack(t, actionbustest.StackOptions{NoAuditor: true,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Register: func(ex *executor.Executor) error {
			type in struct {
				Q string `json:"q"`
			}
			return executor.Register(ex, executor.Action{Name: "docs.search", Description: "Search the docs."},
				func(_ context.Context, x in, _ executor.Call) (executor.Result[in], error) {
					return executor.Result[in]{Output: x}, nil
				})
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := srv.JS.KeyValue(ctx, bus.Topology{}.BucketCatalog())
	require.NoError(t, err)

	forge := func(name string, mode actions.Mode, hash func(m map[string]any) string) {
		def := actions.Definition{Name: name, Description: "Forged.", Pool: bus.DefaultPool, Mode: mode,
			InputSchema: json.RawMessage(`{"type":"object"}`)}
		require.NoError(t, def.Normalize())
		def.Permission.NeedsApproval = false
		b, _ := json.Marshal(actions.Entry{Definition: def, PublishedAt: time.Now().UTC(), PublishedBy: "operator"})
		var m map[string]any
		require.NoError(t, json.Unmarshal(b, &m))
		m["hash"] = hash(m)
		b, _ = json.Marshal(m)
		_, err := kv.Put(ctx, actions.CatalogKey(bus.DefaultPool, name), b)
		require.NoError(t, err)
	}
	forge("docs.bogus", actions.ModeRead, func(map[string]any) string { return strings.Repeat("ab", 32) })
	forge("pay.refund", actions.ModeMutate, func(m map[string]any) string {
		b, _ := json.Marshal(m)
		h, err := actions.EntryHash(b)
		require.NoError(t, err)
		return h
	})

	list, err := st.Client.Actions(ctx)
	require.NoError(t, err)
	var names []string
	for _, a := range list {
		names = append(names, a.Name)
	}
	assert.Contains(t, names, "docs.search", "the registrar's entry is listed")
	assert.NotContains(t, names, "docs.bogus")
	assert.NotContains(t, names, "pay.refund")

	for _, name := range []string{"docs.bogus", "pay.refund"} {
		res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: name, Args: map[string]any{}},
			AllowedModes: []string{"read", "mutate"}}, nil)
		require.NoError(t, err)
		require.Equal(t, client.StatusFailed, res.Status, name)
		require.NotNil(t, res.Error, name)
		assert.Equal(t, "invalid_record", string(res.Error.Code), name)
	}
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "docs.search", Args: map[string]any{"q": "x"}}}, nil)
	require.NoError(t, err)
	assert.Equal(t, client.StatusCompleted, res.Status, "the valid entry still runs")

	// Listing again, and every view of the stack, logs no refusal twice.
	_, err = st.Client.Actions(ctx)
	require.NoError(t, err)
	out := logs.String()
	assert.Contains(t, out, "key=default.docs.bogus")
	assert.Contains(t, out, "key=default.pay.refund")
	for _, key := range []string{"default.docs.bogus", "default.pay.refund"} {
		perView := map[string]int{}
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, "catalog entry refused") && strings.Contains(line, "key="+key+" ") {
				perView[serviceOf(line)]++
			}
		}
		for svc, n := range perView {
			assert.Equal(t, 1, n, "%s logs the refusal of %s once", svc, key)
		}
	}
}

// serviceOf is the service= attribute of a text log line.
func serviceOf(line string) string {
	_, rest, ok := strings.Cut(line, "service=")
	if !ok {
		return ""
	}
	svc, _, _ := strings.Cut(rest, " ")
	return svc
}
