package audit_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/audit"
)

// TestAnOversizedRecordIsStoredHashedAndTheChainStaysWhole: an executor
// (a party the auditor does not trust) answers a call again, twice, with
// an output of 100 000 '<' — 600 KB once JSON escapes them — for an
// action whose audit policy keeps its output whole. Each record fits the
// server's 1 MiB max payload, the two together do not. The chain still
// holds every record, each payload over the record bound as its hash,
// and verifies; and the auditor goes on auditing the runs after it.
func TestAnOversizedRecordIsStoredHashedAndTheChainStaysWhole(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	runs := srv.Record(t, "ab.run.>")
	st := srv.StartStack(t, actionbustest.StackOptions{Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "page.render", Description: "Render a page.",
			AuditPolicy: &executor.AuditPolicy{Output: "full"}},
			func(context.Context, struct{}, executor.Call) (executor.Result[string], error) {
				return executor.Result[string]{Output: "<p>"}, nil
			})
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	render := client.NewWorkflow("page").Step("one", "page.render", map[string]any{}).Build()
	res, err := st.Client.Run(ctx, client.RunRequest{UserID: "ada", Workflow: render}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	var done events.ActionCompleted
	runs.WaitFor(t, 0, func(r actionbustest.Recorded) bool {
		return r.Event != nil && r.Type() == events.TypeActionCompleted && events.DataAs(r.Event, &done) == nil && done.RunID == res.RunID
	})

	forgeResults(ctx, t, srv, done, strings.Repeat("<", 100_000), 2)
	recs := waitForResults(ctx, t, st, res.RunID, 3)
	v := audit.Check(recs, st.AuditorKey)
	require.Nil(t, v.Broken, "%+v", v.Broken)
	results := resultRecords(recs)
	assert.Equal(t, "<p>", results[0].Output, "a record within the bound keeps what the policy keeps")
	for _, r := range results[1:] {
		assert.Equal(t, audit.StatusDuplicate, r.Status)
		out, ok := r.Output.(map[string]any)
		require.True(t, ok, "the output is its hash: %T", r.Output)
		assert.Len(t, out["hash"], 64)
		assert.Equal(t, audit.ModeOversize, r.PayloadModes["output"])
	}

	// The auditor is not held: the next run is audited whole.
	next, err := st.Client.Run(ctx, client.RunRequest{UserID: "ada", Workflow: render}, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		recs, err = st.Client.AuditRecords(ctx, next.RunID)
		return err == nil && audit.HasTerminal(recs)
	}, 30*time.Second, 50*time.Millisecond)
}
