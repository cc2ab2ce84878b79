package dispatch_test

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/policy"
)

// TestADeniedRunNeverRunsItsMutationWhenItsDispatcherDiesMidCommit: an
// exec run of a mutation waits for its approval. An approver denies it,
// and the dispatcher dies halfway through committing the denial. Another
// approver's grant of the same approval arrives before the denial is
// redelivered: it must find the run ended, so the mutation is never
// requested, and the stream holds one end, the denial's.
//
// The denial is committed one of two ways (see end.go): from a state the
// dispatcher wrote itself under its fence, the end first and the state
// after it; from a state it only read (here: after a restart), the state
// first and the end after it. Each has its own crash between the two.
func TestADeniedRunNeverRunsItsMutationWhenItsDispatcherDiesMidCommit(t *testing.T) {
	for _, tc := range []struct {
		name string
		// restarted: the denial reaches a dispatcher that did not write
		// the state it applies to.
		restarted bool
		crash     func(*dispatch.Dispatcher, func(string) bool)
		// refusal is the code the late grant gets. Either way the
		// denial answered it: stored in the state (state first), or
		// stored as the run's end and applied again from the run's log
		// to the state before the denial (end first: see repair).
		refusal actionbus.Code
	}{
		{name: "end first, crash before the state", crash: dispatch.SetCrashAfterEnd, refusal: actionbus.CodeApprovalReplayed},
		{name: "state first after a restart, crash before the end", restarted: true, crash: dispatch.SetCrashAfterWrite, refusal: actionbus.CodeApprovalReplayed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := actionbustest.NewServer(t, actionbustest.Options{})
			rec := srv.Record(t, "")
			ops := &opsActions{}
			st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: ops.register})
			js, err := jetstream.New(srv.Connect(t))
			require.NoError(t, err)
			ctx := ctxT(t)
			keys := policy.Keys{"k1": {Secret: approvalKey, Holder: "alice"}}
			// The run's alarm is held, not stored, until the denial: its
			// state stays the one the dispatcher wrote at admission.
			const alarmDelay = time.Minute

			var (
				mu       sync.Mutex
				target   string // the run whose denial crashes
				approval string
				once     sync.Once
			)
			// crashed is closed when the dispatcher crashes: after it
			// published the end, so the client may hear the end first.
			crashed := make(chan struct{})
			grantErr := make(chan error, 1)
			crash := func(runID string) bool {
				mu.Lock()
				defer mu.Unlock()
				if runID != target {
					return false
				}
				// The process dies mid-commit; meanwhile the other
				// approver's grant is on its way, and reaches the
				// dispatcher before the denial is redelivered (after its
				// nak delay).
				now := false
				once.Do(func() {
					now = true
					close(crashed)
					go func() { grantErr <- st.Client.Approve(ctx, approval, "k1", approvalKey) }()
				})
				return now
			}
			var stopFirst func()
			if tc.restarted {
				stopFirst = startDispatcher(t, srv, dispatch.Config{ApprovalKeys: keys, InstanceID: "first", AlarmDelay: alarmDelay})
			} else {
				startDispatcher(t, srv, dispatch.Config{ApprovalKeys: keys, InstanceID: "crashing", AlarmDelay: alarmDelay},
					func(d *dispatch.Dispatcher) { tc.crash(d, crash) })
			}

			runID, err := st.Client.Start(ctx, restart("read", "mutate"))
			require.NoError(t, err)
			id := awaitingApproval(t, rec, runID)
			if tc.restarted {
				stopFirst()
				startDispatcher(t, srv, dispatch.Config{ApprovalKeys: keys, InstanceID: "crashing", AlarmDelay: alarmDelay},
					func(d *dispatch.Dispatcher) { tc.crash(d, crash) })
			}
			mu.Lock()
			target, approval = runID, id
			mu.Unlock()

			require.NoError(t, st.Client.Deny(ctx, id, "k1", approvalKey, "not now"))
			res, err := st.Client.Wait(ctx, runID)
			require.NoError(t, err)
			require.NotNil(t, res.Error)
			assert.Equal(t, actionbus.CodeApprovalDenied, res.Error.Code, "the client is told the approval was denied")
			select {
			case <-crashed:
			case <-ctx.Done():
				t.Fatal("the dispatcher never crashed mid-commit")
			}
			var refused *actionbus.Error
			require.ErrorAs(t, <-grantErr, &refused)
			assert.Equal(t, tc.refusal, refused.Code, "%v", refused)
			assert.Equal(t, map[string]uint64{"failed": 1}, storedEnds(t, js, runID))
			assert.Empty(t, ops.ran(), "a run whose approval was denied ran its mutation")
		})
	}
}

// storedEnds returns the terminal events stored for run runID of the
// default tenant, by type: what the stream holds, not what a subscriber
// saw (a second copy of an end would have the first's id).
//
// A client hears a run's end as the server routes it, which may be before
// the stream has stored it: the stream is read until it holds an end, for
// up to 5 s, so that a test asking right after its client's result sees
// the end stored.
func storedEnds(t *testing.T, js jetstream.JetStream, runID string) map[string]uint64 {
	t.Helper()
	s, err := js.Stream(ctxT(t), "AB_RUNS")
	require.NoError(t, err)
	ends := map[string]uint64{}
	assert.Eventually(t, func() bool {
		info, err := s.Info(ctxT(t), jetstream.WithSubjectFilter("ab.run.default."+runID+".>"))
		if err != nil {
			return false
		}
		ends = map[string]uint64{}
		for subject, n := range info.State.Subjects {
			for _, typ := range []string{"completed", "failed", "canceled"} {
				if events.MustSubjects("ab").Canonical(subject) == "ab.run.default."+runID+"."+typ {
					ends[typ] += n
				}
			}
		}
		return len(ends) > 0
	}, 5*time.Second, 10*time.Millisecond, "an end of run %s is stored", runID)
	return ends
}
