package attack42_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/bus"
)

// TestAttack42_TenantLearnsAnotherTenantsRunExistsFromACancel: tenant
// acme's NATS client sends a cancel, on its own subjects, for a run id of
// the default tenant (a completed run, whose state the dispatcher keeps,
// keyed by run id alone), and one for a run id nobody has. The first is
// rejected invalid_tenant ("names a run of another tenant"), the second
// run_not_found: the rejection code says whether the id is another
// tenant's run. Safe: both are rejected alike (run_not_found, acme never
// requested either), once each. (The difference is in the rejections
// stream; acme's own user may not subscribe to the prefix, so whether
// the code reaches acme depends on who reads acme's rejections: the test
// logs what acme received.)
func TestAttack42_TenantLearnsAnotherTenantsRunExistsFromACancel(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{Operator: true})
	acme := srv.TenantAdd(t, "acme", actionbustest.TenantLimits{})
	rejected := srv.Record(t, srv.Prefix+".rejected.>")
	// What acme itself sees of the rejections (logged: whether the code
	// reaches the prober, or only the operator's records).
	seen := make(chan string, 16)
	sub, err := acme.Subscribe(srv.Prefix+".>", func(m *nats.Msg) {
		if strings.Contains(m.Subject, "rejected") {
			seen <- m.Subject
		}
	})
	t.Logf("acme subscribes to %s.>: %v", srv.Prefix, err)
	if err == nil {
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	_ = acme.Flush()
	t.Cleanup(func() {
		t.Logf("rejections acme received: %d (last error on acme: %v)", len(seen), acme.LastError())
	})
	st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "inv.count", Description: "Count the inventory."},
			func(context.Context, struct{}, executor.Call) (executor.Result[string], error) {
				return executor.Result[string]{Output: "42"}, nil
			})
	}})
	ctx := ctxFor(t, 60*time.Second)
	res, err := st.Client.Run(ctx, client.RunRequest{UserID: "ada", Action: &client.ActionCall{Name: "inv.count", Args: map[string]any{}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status)

	b, err := bus.Open(acme, bus.BusConfig{Source: "/client"})
	require.NoError(t, err)
	unknown := events.NewID()
	codeFor := func(runID string) string {
		_, err := b.Emit(ctx, events.TypeCancelRequested, events.NewID(), "acme", runID, "",
			&events.CancelRequested{RunID: runID, Reason: "probe", RequestedBy: "client"})
		require.NoError(t, err)
		r := rejected.WaitFor(t, 20*time.Second, func(r actionbustest.Recorded) bool {
			return r.Event != nil && strings.Contains(string(r.Event.Data()), runID)
		})
		var rej events.EventRejected
		require.NoError(t, json.Unmarshal(r.Event.Data(), &rej))
		t.Logf("cancel of %s: rejected by %s %s: %s", runID, rej.Consumer, rej.Reason.Code, rej.Reason.Message)
		return string(rej.Reason.Code)
	}
	other, none := codeFor(res.RunID), codeFor(unknown)
	assert.Equal(t, none, other, "a cancel for another tenant's run is rejected as one for a run that does not exist")
}
