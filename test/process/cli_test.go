package process

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
)

// cliNeverWaits bounds how long the actionbus binary may take to refuse a
// malformed or unknown run id. The bound is the property under test
// ("never waits for nothing"), not a tolerance: these commands used to
// wait for ever or to report success.
const cliNeverWaits = time.Second

// TestTheCLIBinaryRefusesUnknownRunsAtOnceAndNamesItselfInHints: the
// built actionbus binary, against its own dev server: dev's hints name
// the binary (not go run), and watch and cancel of an unknown or
// malformed run id exit non-zero with the typed code within a second; a
// cancel another client sends for an unknown run is rejected once by
// dev's least-privilege dispatcher.
func TestTheCLIBinaryRefusesUnknownRunsAtOnceAndNamesItselfInHints(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "actionbus")
	build := exec.Command("go", "build", "-o", bin, "./cmd/actionbus")
	build.Dir = repoRoot(t)
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	dev := exec.Command(bin, "dev", "--port", "-1", "--store", t.TempDir(), "--no-demo")
	logs := &actionbustest.LogBuffer{}
	dev.Stdout, dev.Stderr = logs, logs
	require.NoError(t, dev.Start())
	exited := make(chan error, 1)
	go func() { exited <- dev.Wait() }()
	t.Cleanup(func() {
		_ = dev.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = dev.Process.Kill()
		}
	})
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "Ctrl-C stops") }, 60*time.Second, 50*time.Millisecond,
		"dev printed: %s", logs.String())
	hint := regexp.MustCompile(`(?m)^  (\S+) --nats (\S+)(?: --creds (\S+))? actions$`).FindStringSubmatch(logs.String())
	require.NotNil(t, hint, "dev's hints: %s", logs.String())
	assert.Equal(t, bin, hint[1], "the hint names the binary that runs")
	assert.NotContains(t, logs.String(), "go run")
	conn := []string{"--nats", hint[2]}
	if hint[3] != "" {
		conn = append(conn, "--creds", hint[3])
	}

	unknown := events.NewID()
	for _, tc := range []struct {
		args []string
		code string
	}{
		{[]string{"watch", unknown}, "run_not_found"},
		{[]string{"watch", "not-a-run"}, "invalid_run_id"},
		{[]string{"cancel", unknown}, "run_not_found"},
		{[]string{"cancel", "not-a-run"}, "invalid_run_id"},
		{[]string{"input", unknown, "yes"}, "run_not_found"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			cmd := exec.Command(bin, append(append([]string{}, conn...), tc.args...)...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			start := time.Now()
			err := cmd.Run()
			elapsed := time.Since(start)
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "stdout %q stderr %q", stdout.String(), stderr.String())
			assert.Equal(t, 1, exit.ExitCode())
			assert.Contains(t, stderr.String(), tc.code)
			assert.NotContains(t, stdout.String(), "cancel requested")
			assert.Less(t, elapsed, cliNeverWaits, "a command naming a malformed or unknown run answers at once")
		})
	}

	// A cancel sent for an unknown run by another client than the CLI
	// reaches dev's dispatcher (its own least-privilege user in operator
	// mode), which rejects it once, run_not_found: no redelivery loop.
	opts := []nats.Option{nats.CustomInboxPrefix(client.InboxPrefix(""))}
	if hint[3] != "" {
		opts = append(opts, nats.UserCredentials(hint[3]))
	}
	nc, err := nats.Connect(hint[2], opts...)
	require.NoError(t, err)
	defer nc.Close()
	c, err := client.New(nc, client.Options{})
	require.NoError(t, err)
	ghost := events.NewID()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, c.Cancel(ctx, ghost, "test"))
	rejections := func() int {
		n := 0
		for _, line := range strings.Split(logs.String(), "\n") {
			if strings.Contains(line, "event rejected") && strings.Contains(line, ghost) && strings.Contains(line, "run_not_found") {
				n++
			}
		}
		return n
	}
	require.Eventually(t, func() bool { return rejections() == 1 }, 10*time.Second, 20*time.Millisecond, "dev logged: %s", logs.String())
	assert.Never(t, func() bool { return rejections() > 1 || strings.Contains(logs.String(), ghost+": no such run") }, time.Second, 50*time.Millisecond,
		"the cancel is rejected once and not redelivered")
}

// TestDevUnderGoRunHintsGoRun: only under go run do dev's hints say
// "go run ./cmd/actionbus".
func TestDevUnderGoRunHintsGoRun(t *testing.T) {
	dev := exec.Command("go", "run", "./cmd/actionbus", "dev", "--port", "-1", "--store", t.TempDir(), "--no-demo")
	dev.Dir = repoRoot(t)
	// Its own process group: go run and the program it built stop together.
	dev.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	logs := &actionbustest.LogBuffer{}
	dev.Stdout, dev.Stderr = logs, logs
	require.NoError(t, dev.Start())
	exited := make(chan error, 1)
	go func() { exited <- dev.Wait() }()
	t.Cleanup(func() {
		_ = syscall.Kill(-dev.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-dev.Process.Pid, syscall.SIGKILL)
		}
	})
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "Ctrl-C stops") }, 120*time.Second, 50*time.Millisecond,
		"dev printed: %s", logs.String())
	assert.Regexp(t, `(?m)^  go run ./cmd/actionbus --nats \S+.* actions$`, logs.String())
	assert.Regexp(t, `go run ./cmd/actionbus --nats \S+.* approve APPROVAL_ID`, logs.String())
}
