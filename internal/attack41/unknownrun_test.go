package attack41_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
)

// TestAttack41_CancelRightAfterTheRequestIsNotLost: a tenant's client
// starts runs and cancels each at once, as `actionbus run` followed by
// Ctrl-C does. The dispatcher reads both from the requests stream and
// handles them concurrently; a cancel handled before its run's state is
// created finds no state and asks the stream whether the run was
// requested (dispatch.unknownRun): while it was, the cancel is retried.
// That lookup names the published five-token subject, which the stream
// no longer stores (it stores the partition token too), so it finds
// nothing and the cancel is rejected run_not_found: the run goes on
// (here until its decision timeout) although the client canceled it.
// Safe: every run ends canceled, and no cancel of a requested run is
// rejected.
func TestAttack41_CancelRightAfterTheRequestIsNotLost(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{Partitions: 4})
	srv.ServeIngress(t)
	rec := srv.Record(t, "")
	ctx := ctxFor(t, 60*time.Second)
	c, err := client.New(srv.Connect(t), client.Options{Prefix: srv.Prefix})
	require.NoError(t, err)

	// A request that takes the dispatcher a while to decode and validate,
	// so that its cancel, right behind it, is usually handled first.
	meta := map[string]any{}
	for i := range 2000 {
		meta["k"+strings.Repeat("x", i%50)+strconv.Itoa(i)] = map[string]any{"a": []any{i, "b", true, map[string]any{"c": i}}}
	}
	const runs = 12
	var ids []string
	for range runs {
		id, err := c.Start(ctx, client.RunRequest{Prompt: "wait for the planner", UserID: "ada", Metadata: meta})
		require.NoError(t, err)
		require.NoError(t, c.Cancel(ctx, id, "changed my mind"))
		ids = append(ids, id)
	}
	// The dispatcher starts with every request and cancel stored.
	srv.StartStack(t, actionbustest.StackOptions{NoPlanner: true, NoAuditor: true, NoExecutors: true})

	ours := map[string]bool{}
	for _, id := range ids {
		ours[id] = true
	}
	rejected := func(r actionbustest.Recorded) bool {
		var rej events.EventRejected
		return r.Type() == events.TypeEventRejected && json.Unmarshal(r.Event.Data(), &rej) == nil && ours[rej.RunID]
	}
	canceled := func(r actionbustest.Recorded) bool {
		return r.Type() == events.TypeRunCanceled && ours[runIDOf(r)]
	}
	ok := assert.Eventually(t, func() bool { return rec.Count(canceled)+rec.Count(rejected) >= runs }, 30*time.Second, 50*time.Millisecond)
	for _, r := range rec.All() {
		if rejected(r) {
			var rej events.EventRejected
			_ = json.Unmarshal(r.Event.Data(), &rej)
			t.Errorf("the cancel of requested run %s was rejected %s: %s", rej.RunID, rej.Reason.Code, rej.Reason.Message)
		}
	}
	if ok {
		assert.Equal(t, runs, rec.Count(canceled), "every run the client canceled ends canceled")
	}
}
