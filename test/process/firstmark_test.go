package process

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	natsconf "github.com/actionbus/actionbus/deploy/nats"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/ingress"
)

// The ingress marks a run's first request (ingress.FirstOfRunHeader), and
// the dispatcher admits a request so marked without reading the requests
// stream: had a tenant's client a way to have a later request of its
// run stored marked, its completed run, ended without a state stored,
// would run again. Here acme's deployed client user, against the real
// dispatcher and executor binaries, sends its completed run's request
// again carrying the mark itself and the JetStream expectation that would
// have the stream store it as the run's first. The ingress drops both
// (only CloudEvents headers cross): the request is stored unmarked, the
// action ran once, and the run ended once. Globex, sending a request of
// its own under acme's run id with the same headers, runs its own run:
// acme's is untouched.
func TestATenantCannotMarkARequestFirstOfItsRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts service processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Duplicate windows short enough to pass within the test, still
	// covering twice the ack wait (so that admissions hand their work out
	// early and a run may end without a state stored): past them, nothing
	// but the dispatcher's admission keeps a run from running again.
	const window = 3 * time.Second
	srv := actionbustest.NewServer(t, actionbustest.Options{Users: true, Tenants: []string{"acme", "globex"}, AckWait: time.Second, DuplicateWindow: window})
	bin := buildServices(t)
	startService(t, filepath.Join(bin, "dispatcher"), srv.UserURL("dispatcher"))
	dir := t.TempDir()
	startTestExecutor(t, buildTestExecutor(t), srv.UserURL("executor"), dir, "ex-1")

	acmeNC, _ := connectAs(t, srv.UserURL(natsconf.ClientUser("acme")), client.InboxPrefix("acme"))
	acme, err := client.New(acmeNC, client.Options{Tenant: "acme"})
	require.NoError(t, err)
	globexNC, _ := connectAs(t, srv.UserURL(natsconf.ClientUser("globex")), client.InboxPrefix("globex"))
	admin, err := client.New(srv.Conn, client.Options{})
	require.NoError(t, err)
	waitCatalog(t, ctx, admin, "test.other")

	runID := events.NewID()
	res, err := acme.Run(ctx, client.RunRequest{RunID: runID, Action: &client.ActionCall{Name: "test.other", Args: map[string]any{}}, UserID: "a1"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	require.Equal(t, 1, invocations(t, dir, "other a1"))
	requestsHandled(t, ctx, srv.JS)
	ended := time.Now()
	kv, err := srv.JS.KeyValue(ctx, "ab_runs")
	require.NoError(t, err)
	_, err = kv.Get(ctx, runID)
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "the run ended without a state stored (what the attack needs)")
	// The duplicate windows pass.
	for time.Since(ended) < 2*window {
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(2*window - time.Since(ended)):
		}
	}

	// The run's request again, under a new message id (so that it is not
	// deduplicated), with the mark and the expectation forged.
	request := map[string]any{"runId": runID, "action": map[string]any{"name": "test.other", "args": map[string]any{}}, "userId": "a1"}
	forgedFirst := func(tenant string) map[string]string {
		return map[string]string{
			ingress.FirstOfRunHeader:                "1",
			jetstream.ExpectedLastSubjSeqHeader:     "0",
			jetstream.ExpectedLastSubjSeqSubjHeader: "ab.run." + tenant + "." + runID + ".>",
		}
	}
	again := forged(t, "ab.run.acme."+runID+".requested", events.TypeRunRequested, runID, events.NewID(), request)
	for k, v := range forgedFirst("acme") {
		again.Header.Set(k, v)
	}
	ack, raw := r37Publish(t, acmeNC, again)
	require.Nil(t, ack.Error, "the request is stored, as any repeated request is: %s", raw)
	requestsHandled(t, ctx, srv.JS)

	stored := storedMessages(t, ctx, srv.JS, "AB_REQUESTS")
	require.Len(t, stored, 2, "both of acme's requests are stored")
	assert.NotEmpty(t, stored[0].Headers().Get(ingress.FirstOfRunHeader), "the run's first request is stored marked")
	assert.Empty(t, stored[1].Headers().Get(ingress.FirstOfRunHeader), "the forged mark was stored")
	assert.Empty(t, stored[1].Headers().Get(jetstream.ExpectedLastSubjSeqHeader), "a forged expectation was stored")
	assert.Equal(t, 1, invocations(t, dir, "other a1"), "the action of acme's completed run ran again")
	assert.Equal(t, uint64(1), terminalsStoredOf(t, ctx, srv.JS, "acme", runID), "acme's run ended twice")

	// Globex, knowing acme's run id, sends a request of its own under it
	// with the same forged headers: it is globex's run, on globex's
	// subjects; acme's run keeps its one end and its output.
	theirs := forged(t, "ab.run.globex."+runID+".requested", events.TypeRunRequested, runID, events.NewID(),
		map[string]any{"runId": runID, "action": map[string]any{"name": "test.other", "args": map[string]any{}}, "userId": "g1"})
	for k, v := range forgedFirst("globex") {
		theirs.Header.Set(k, v)
	}
	ack, raw = r37Publish(t, globexNC, theirs)
	require.Nil(t, ack.Error, "%s", raw)
	requestsHandled(t, ctx, srv.JS)
	assert.Eventually(t, func() bool { return invocations(t, dir, "other g1") == 1 }, 20*time.Second, 20*time.Millisecond,
		"globex's run ran its action once")
	assert.Equal(t, 1, invocations(t, dir, "other a1"), "acme's action ran again")
	assert.Equal(t, uint64(1), terminalsStoredOf(t, ctx, srv.JS, "acme", runID), "acme's run ended twice")
	got, err := acme.Ended(ctx, runID)
	require.NoError(t, err)
	require.NotNil(t, got, "acme's run is no longer found ended")
	assert.Equal(t, client.StatusCompleted, got.Status)
}

// invocations counts the lines of the test executor's invocations file
// equal to line.
func invocations(t *testing.T, dir, line string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "invocations"))
	if os.IsNotExist(err) {
		return 0
	}
	require.NoError(t, err)
	n := 0
	for _, l := range strings.Split(string(data), "\n") {
		if l == line {
			n++
		}
	}
	return n
}

// requestsHandled waits until every dispatcher consumer of the requests
// stream has delivered and had acknowledged every stored request (read
// as the admin).
func requestsHandled(t *testing.T, ctx context.Context, js jetstream.JetStream) {
	t.Helper()
	s, err := js.Stream(ctx, "AB_REQUESTS")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := s.Info(ctx)
		if err != nil {
			return false
		}
		last := info.State.LastSeq
		names := s.ConsumerNames(ctx)
		for name := range names.Name() {
			if !strings.HasPrefix(name, "dispatcher-") {
				continue // the auditor's (not running here)
			}
			c, err := s.Consumer(ctx, name)
			if err != nil {
				return false
			}
			ci, err := c.Info(ctx)
			if err != nil || ci.NumAckPending > 0 || ci.NumPending > 0 {
				return false
			}
		}
		return names.Err() == nil && last > 0
	}, 30*time.Second, 20*time.Millisecond, "the dispatcher never settled every stored request")
}
