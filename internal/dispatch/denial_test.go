package dispatch_test

import (
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/policy"
)

// TestADeniedRunNeverRunsItsMutationWhenItsDispatcherDiesBeforeTheEnd: an
// exec run of a mutation waits for its approval. An approver denies it;
// the dispatcher stores the ended state and dies before publishing its
// run.failed. Another approver's grant of the same approval arrives
// before the denial is redelivered: it finds the run ended, so the
// mutation is never requested. The redelivered denial publishes the stored
// end: the client is told the approval was denied, and the stream holds
// one end.
//
// This is why a run's state is written before its end is published: with
// the end first (tried and withdrawn, see docs/architecture.md "Messages
// per run"), the grant was applied on the stored state, still waiting for
// its approval, and the mutation ran after the client was told it was
// denied.
func TestADeniedRunNeverRunsItsMutationWhenItsDispatcherDiesBeforeTheEnd(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "")
	ops := &opsActions{}
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: ops.register})
	js, err := jetstream.New(srv.Connect(t))
	require.NoError(t, err)
	ctx := ctxT(t)

	var (
		mu       sync.Mutex
		target   string // the run whose denial crashes
		approval string
		once     sync.Once
	)
	grantErr := make(chan error, 1)
	crash := func(runID string) bool {
		mu.Lock()
		defer mu.Unlock()
		if runID != target {
			return false
		}
		// The process dies after writing the ended state; meanwhile the
		// other approver's grant is on its way, and reaches the
		// dispatcher before the denial is redelivered (after its nak
		// delay).
		crashed := false
		once.Do(func() {
			crashed = true
			go func() { grantErr <- st.Client.Approve(ctx, approval, "k1", approvalKey) }()
		})
		return crashed
	}
	startDispatcher(t, srv, dispatch.Config{ApprovalKeys: policy.Keys{"k1": {Secret: approvalKey, Holder: "alice"}}, InstanceID: "crashing"},
		func(d *dispatch.Dispatcher) { dispatch.SetCrashAfterWrite(d, crash) })

	runID, err := st.Client.Start(ctx, restart("read", "mutate"))
	require.NoError(t, err)
	id := awaitingApproval(t, rec, runID)
	mu.Lock()
	target, approval = runID, id
	mu.Unlock()

	require.NoError(t, st.Client.Deny(ctx, id, "k1", approvalKey, "not now"))
	res, err := st.Client.Wait(ctx, runID)
	require.NoError(t, err)
	require.NotNil(t, res.Error)
	assert.Equal(t, actionbus.CodeApprovalDenied, res.Error.Code, "the client is told the approval was denied")
	// The grant reached the stored denial: refused, already answered.
	var refused *actionbus.Error
	require.ErrorAs(t, <-grantErr, &refused)
	assert.Equal(t, actionbus.CodeApprovalReplayed, refused.Code, "%v", refused)
	assert.Equal(t, map[string]uint64{"failed": 1}, storedEnds(t, js, runID))
	assert.Empty(t, ops.ran(), "a run whose approval was denied ran its mutation")
}

// storedEnds returns the terminal events stored for run runID of the
// default tenant, by type: what the stream holds, not what a subscriber
// saw (a second copy of an end would have the first's id).
func storedEnds(t *testing.T, js jetstream.JetStream, runID string) map[string]uint64 {
	t.Helper()
	s, err := js.Stream(ctxT(t), "AB_RUNS")
	require.NoError(t, err)
	info, err := s.Info(ctxT(t), jetstream.WithSubjectFilter("ab.run.default."+runID+".>"))
	require.NoError(t, err)
	ends := map[string]uint64{}
	for subject, n := range info.State.Subjects {
		for _, typ := range []string{"completed", "failed", "canceled"} {
			if events.MustSubjects("ab").Canonical(subject) == "ab.run.default."+runID+"."+typ {
				ends[typ] += n
			}
		}
	}
	return ends
}
