package dispatch_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/dispatch"
)

// total is the number of executions of every call together.
func (c *hitCounter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, h := range c.hits {
		n += h
	}
	return n
}

// storedCount is the last sequence of stream name: how many messages it ever
// stored (a deduplicated publish stores none).
func storedCount(t *testing.T, js jetstream.JetStream, name string) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), name)
	require.NoError(t, err)
	return s.CachedInfo().State.LastSeq
}

// TestAnAdmissionThatDiesAfterHandingOutItsWorkRunsItOnce: an admission
// hands its work out while its state is written, and its dispatcher dies
// after the work is stored and before the state is. The work runs (the
// executor does not wait), its result finds no run and is handed back; the
// request, delivered again, admits the run again with the same ids (they
// are derived from the run, not drawn), so its work item is deduplicated,
// and the result is applied. Every call ran once, every run ended once —
// for a host run (a work item) and an agent run (a decision request, then
// a plan).
func TestAnAdmissionThatDiesAfterHandingOutItsWorkRunsItOnce(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	counted := &hitCounter{hits: map[string]int{}}
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, Scenarios: pairScenario, Slots: 4, Register: counted.register})
	var crashes atomic.Int32
	first := onceEach()
	startDispatcher(t, srv, dispatch.Config{InstanceID: "handing-out"}, func(d *dispatch.Dispatcher) {
		dispatch.SetCrashHandingOut(d, func(runID string) bool {
			if first(runID) {
				crashes.Add(1)
				return true
			}
			return false
		})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "count.hit", Args: map[string]any{"n": 1}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.EqualValues(t, 1, crashes.Load(), "the admission handed its work out early and died")
	assert.Equal(t, 1, counted.total(), "the call ran once: its second admission's work item was deduplicated")
	assert.EqualValues(t, 1, storedCount(t, srv.JS, "AB_WORK"), "one work item was stored")

	res, err = st.Client.Run(ctx, client.RunRequest{Scenario: "pair"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, "done", res.Answer)
	assert.EqualValues(t, 2, crashes.Load())
	assert.Equal(t, 3, counted.total(), "the plan's two calls ran once each")
	for call, n := range counted.hits {
		assert.Equal(t, 1, n, call)
	}
}

// TestARequestStoredAgainForAnAdmittedRunHandsNothingOut: a client that
// publishes a run's request again past the duplicate window (here, under
// another message id, with the work stream's window shortened and passed)
// gets it stored again, and its first delivery may hand work out early.
// The admission reads the run's state first: the run exists, so nothing
// is handed out and the call does not run again.
func TestARequestStoredAgainForAnAdmittedRunHandsNothingOut(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	counted := &hitCounter{hits: map[string]int{}}
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: counted.register})
	startDispatcher(t, srv, dispatch.Config{InstanceID: "readmit"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "count.hit", Args: map[string]any{"n": 1}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	require.Equal(t, 1, counted.total())
	require.EqualValues(t, 1, storedCount(t, srv.JS, "AB_WORK"))

	// The work stream forgets the work item's id.
	work, err := srv.JS.Stream(ctx, "AB_WORK")
	require.NoError(t, err)
	cfg := work.CachedInfo().Config
	const window = time.Second
	cfg.Duplicates = window
	_, err = srv.JS.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	storedAt := time.Now()
	subjects := events.MustSubjects("ab")
	stored, err := srv.JS.Stream(ctx, "AB_REQUESTS")
	require.NoError(t, err)
	var request *jetstream.RawStreamMsg
	for _, subject := range subjects.StoredForms("default", res.RunID, "requested") {
		if m, err := stored.GetLastMsgForSubject(ctx, subject); err == nil {
			request = m
		}
	}
	require.NotNil(t, request, "the run's request is stored")
	require.Eventually(t, func() bool { return time.Since(storedAt) > 2*window }, 10*time.Second, 50*time.Millisecond)

	// The same request, stored again under another message id.
	before := storedCount(t, srv.JS, "AB_REQUESTS")
	again := &nats.Msg{Subject: subjects.Run("default", res.RunID, "requested"), Header: nats.Header{}, Data: request.Data}
	for k, v := range request.Header {
		if k != jetstream.MsgIDHeader {
			again.Header[k] = v
		}
	}
	again.Header.Set(jetstream.MsgIDHeader, "stored-again")
	_, err = srv.Connect(t).RequestMsg(again, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, before+1, storedCount(t, srv.JS, "AB_REQUESTS"), "the request is stored again")

	// Handled: the dispatcher's requests consumer has acknowledged it.
	cons, err := srv.JS.Consumer(ctx, "AB_REQUESTS", "dispatcher-requests-p0")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.AckFloor.Stream >= before+1
	}, 20*time.Second, 20*time.Millisecond)
	assert.EqualValues(t, 1, storedCount(t, srv.JS, "AB_WORK"), "no work item was handed out again")
	assert.Equal(t, 1, counted.total(), "the call did not run again")
}

// TestDispatchersDeriveOneRunsIDKeyAlike: every dispatcher derives a run's
// id key from the secret the first one stored in the runs bucket, so a run
// admitted again by another dispatcher gets the same ids; another tenant's
// run of the same id gets another key.
func TestDispatchersDeriveOneRunsIDKeyAlike(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true})
	var a, b *dispatch.Dispatcher
	startDispatcher(t, srv, dispatch.Config{InstanceID: "a"}, func(d *dispatch.Dispatcher) { a = d })
	startDispatcher(t, srv, dispatch.Config{InstanceID: "b"}, func(d *dispatch.Dispatcher) { b = d })
	const runID = "01J00000000000000000000RUN"
	assert.Equal(t, dispatch.IDKey(a, "acme", runID), dispatch.IDKey(b, "acme", runID))
	assert.Len(t, dispatch.IDKey(a, "acme", runID), 32)
	assert.NotEqual(t, dispatch.IDKey(a, "acme", runID), dispatch.IDKey(a, "globex", runID))
	assert.Equal(t, dispatch.IDKey(a, "", runID), dispatch.IDKey(b, "default", runID), "no tenant is the default tenant")
	kv, err := srv.JS.KeyValue(context.Background(), "ab_runs")
	require.NoError(t, err)
	_, err = kv.Get(context.Background(), dispatch.IDSecretKey)
	require.NoError(t, err, "the secret is kept where only dispatchers read")
}

// TestAShortDuplicateWindowKeepsWorkBehindTheState: a deployment whose work
// stream deduplicates for less than twice the ack wait would not
// deduplicate the work of an admission made again after its dispatcher
// died, so admissions there hand their work out after their state.
func TestAShortDuplicateWindowKeepsWorkBehindTheState(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	counted := &hitCounter{hits: map[string]int{}}
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoPlanner: true, Register: counted.register})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	work, err := srv.JS.Stream(ctx, "AB_WORK")
	require.NoError(t, err)
	cfg := work.CachedInfo().Config
	cfg.Duplicates = 30 * time.Second
	_, err = srv.JS.UpdateStream(ctx, cfg)
	require.NoError(t, err)
	var handedOut atomic.Int32
	startDispatcher(t, srv, dispatch.Config{InstanceID: "short-window"}, func(d *dispatch.Dispatcher) {
		dispatch.SetCrashHandingOut(d, func(string) bool { handedOut.Add(1); return false })
	})
	res, err := st.Client.Run(ctx, client.RunRequest{Action: &client.ActionCall{Name: "count.hit", Args: map[string]any{"n": 1}}}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Zero(t, handedOut.Load(), "no work was handed out before its state")
	assert.Equal(t, 1, counted.total())
}
