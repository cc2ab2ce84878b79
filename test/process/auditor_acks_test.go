package process

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/internal/bus"
)

// buildAuditor builds the auditor binary.
func buildAuditor(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "auditor")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/auditor")
	cmd.Dir = repoRoot(t)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// The auditor acknowledges by position (one acknowledgement covers every
// event before it), so it must never acknowledge past an event whose
// record is not stored: here run A's request waits in a batch (FlushAfter
// an hour) while run B's six events, stored after it, have their records
// appended three by three (MaxBatch 3). The consumer's ack floor stays before
// A's request. The auditor is then SIGKILLed with A's record unstored: a
// new auditor records A's request once (it was not acknowledged, so it
// comes again) and B's events not again — they come again too, since the
// acknowledgement waited for A, and the first three have their records in
// B's first append, not its last — and both chains verify. The auditor
// runs as the deployed auditor user.
func TestAnAuditorKilledWithARecordUnstoredLosesNoneAndRecordsNoneTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and kills the auditor process")
	}
	srv := actionbustest.NewServer(t, actionbustest.Options{AckWait: 2 * time.Second, Users: true})
	srv.ServeIngress(t)
	bin := buildAuditor(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	out := &actionbustest.LogBuffer{}
	cmd := exec.Command(bin, "--flush-after", "1h", "--max-batch", "3", "--ack-every", "10ms", "--key-file", filepath.Join(t.TempDir(), "k.nk"))
	cmd.Env = append(os.Environ(), "NATS_URL="+srv.UserURL("auditor"))
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() {
			t.Logf("auditor output:\n%s", out.String())
		}
	})
	// The auditor reads in bursts (a no-wait fetch per linger), so no pull
	// request waits at the server to show it is reading: it logs that it
	// serves once its consumers are bound and read.
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "auditor serving") },
		30*time.Second, 20*time.Millisecond, "the auditor serves")
	cons, err := srv.JS.Consumer(ctx, "AB_REQUESTS", bus.ConsumerAuditorRequests)
	require.NoError(t, err)

	c, err := client.New(srv.Conn, client.Options{})
	require.NoError(t, err)
	runA, err := c.Start(ctx, client.RunRequest{Prompt: "a"})
	require.NoError(t, err)
	runB, err := c.Start(ctx, client.RunRequest{Prompt: "b"})
	require.NoError(t, err)
	for i := range 5 {
		require.NoError(t, c.Input(ctx, runB, "more"))
		if i == 1 {
			require.Eventually(t, func() bool { return srv.Stored(t, "AB_AUDIT", "ab.audit.default."+runB+".*") == 1 },
				20*time.Second, 10*time.Millisecond, "run B's first records are appended")
		}
	}
	seqA := lastSeq(t, ctx, srv.JS, "AB_REQUESTS") - 6 // A's request was stored before B's six events

	// B's records are stored, in two appends; A's wait.
	require.Eventually(t, func() bool { return srv.Stored(t, "AB_AUDIT", "ab.audit.default."+runB+".*") == 2 },
		20*time.Second, 10*time.Millisecond, "run B's records are appended")
	assert.Zero(t, srv.Stored(t, "AB_AUDIT", "ab.audit.default."+runA+".*"), "run A's record waits")
	// For a while (100 acknowledgement intervals) the ack floor stays
	// before A's request, and the server holds the seven events.
	require.Never(t, func() bool {
		info, err := cons.Info(ctx)
		return err != nil || info.AckFloor.Stream >= seqA || info.NumAckPending != 7
	}, time.Second, 20*time.Millisecond, "acknowledged past run A's unstored record (or the server no longer holds the seven events)")

	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	killed = true
	// The new auditor batches two records at most: the events come again
	// in other groups than they were appended in, which JetStream's
	// duplicate window (the id of an append names its events) does not
	// catch.
	startService(t, bin, srv.UserURL("auditor"), "--key-file", filepath.Join(t.TempDir(), "k2.nk"), "--max-batch", "2")

	n := requireAuditComplete(t, ctx, srv.JS, map[string]bool{runA: true, runB: true}, 30*time.Second)
	assert.Equal(t, 7, n, "the seven stored events were checked")
	require.Eventually(t, func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending == 0 && info.AckFloor.Stream == seqA+6
	}, 30*time.Second, 20*time.Millisecond, "the new auditor acknowledges every event")
}

// lastSeq returns the last stream sequence of stream.
func lastSeq(t *testing.T, ctx context.Context, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	st, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	return info.State.LastSeq
}
