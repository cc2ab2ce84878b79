// Package process runs actionbus the way an operator does: each service as
// its own process (the binaries of cmd/), against a real nats-server, and
// follows the README's hand-written example literally.
package process

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

func repoRoot(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// buildServices compiles the four service binaries once per test.
func buildServices(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+string(os.PathSeparator),
		"./cmd/dispatcher", "./cmd/planner", "./cmd/executor", "./cmd/auditor")
	cmd.Dir = repoRoot(t)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return dir
}

// startService starts a service binary; it is stopped with SIGTERM (and
// must exit 0) in t.Cleanup.
func startService(t *testing.T, bin, natsURL string, args ...string) *actionbustest.LogBuffer {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "NATS_URL="+natsURL)
	out := &actionbustest.LogBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			assert.NoError(t, err, "%s did not exit cleanly:\n%s", filepath.Base(bin), out.String())
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("%s did not stop on SIGTERM:\n%s", filepath.Base(bin), out.String())
		}
		assert.NotContains(t, strings.ToLower(out.String()), "permissions violation", "%s was refused something", filepath.Base(bin))
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(bin), out.String())
		}
	})
	return out
}

// readmeExample is the `nats pub` command of the README, parsed.
type readmeExample struct {
	subject string
	headers nats.Header
	body    string
}

func parseReadme(t *testing.T) readmeExample {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	require.NoError(t, err)
	block := regexp.MustCompile("(?s)<!-- readme-publish-example -->\\s*```sh\\n(.*?)```").FindSubmatch(b)
	require.NotNil(t, block, "README.md has no publish example block")
	cmdline := strings.ReplaceAll(string(block[1]), "\\\n", " ")
	ex := readmeExample{headers: nats.Header{}}
	m := regexp.MustCompile(`^nats pub (\S+)`).FindStringSubmatch(strings.TrimSpace(cmdline))
	require.NotNil(t, m, "no `nats pub SUBJECT` in %q", cmdline)
	ex.subject = m[1]
	for _, h := range regexp.MustCompile(`-H "([^"]*)"`).FindAllStringSubmatch(cmdline, -1) {
		k, v, ok := strings.Cut(h[1], ":")
		require.True(t, ok, "header %q is not K:V", h[1])
		ex.headers[k] = append(ex.headers[k], v)
	}
	body := regexp.MustCompile(`'([^']*)'\s*$`).FindStringSubmatch(strings.TrimSpace(cmdline))
	require.NotNil(t, body, "no quoted body in %q", cmdline)
	ex.body = body[1]
	return ex
}

func TestReadmeExampleHeadersAreWhatTheCodecWrites(t *testing.T) {
	ex := parseReadme(t)
	runID := ex.headers.Get("ce-runid")
	e := event.New()
	e.SetID(runID)
	e.SetSource("/my-app")
	e.SetType(events.TypeRunRequested)
	e.SetDataContentType("application/json")
	e.SetExtension("runid", runID)
	e.SetExtension("tenant", events.DefaultTenant)
	e.DataEncoded = []byte(ex.body)
	msg, err := bus.Encode(ex.subject, &e, bus.ModeBinary)
	require.NoError(t, err)
	assert.Equal(t, msg.Header, ex.headers, "the README's headers are byte-for-byte what actionbus publishes")
	assert.Equal(t, events.MustSubjects("ab").Run(events.DefaultTenant, runID, "requested"), ex.subject)
	require.NoError(t, events.Validate(&e), "the README's body is a valid run.requested")
}

func TestReadmeExampleRunsAgainstServiceProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts four processes")
	}
	bin := buildServices(t)
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	for _, svc := range []string{"dispatcher", "planner", "auditor"} {
		startService(t, filepath.Join(bin, svc), srv.URL)
	}
	startService(t, filepath.Join(bin, "executor"), srv.URL, "--id", "ex-1")
	startService(t, filepath.Join(bin, "executor"), srv.URL, "--id", "ex-2")

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.New(srv.Conn, client.Options{})
	require.NoError(t, err)
	// The executors publish the catalog when they are up.
	require.Eventually(t, func() bool {
		list, err := c.Actions(ctx)
		for _, a := range list {
			if a.Name == "demo.echo" {
				return err == nil
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond, "executors did not publish the catalog")

	// Exactly what `nats pub` sends: a core NATS message with these headers.
	ex := parseReadme(t)
	require.NoError(t, srv.Conn.PublishMsg(&nats.Msg{Subject: ex.subject, Header: ex.headers, Data: []byte(ex.body)}))
	res, err := c.Wait(ctx, ex.headers.Get("ce-runid"))
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, "hello from the nats CLI", res.Answer)

	// A plan spread over both executor processes.
	res, err = c.Run(ctx, client.RunRequest{Scenario: "delivery-triage", Prompt: "triage"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Contains(t, res.Answer, "Retryable now: job_1041, job_1043")
}

func TestTheDispatcherRefusesABadPlanLimitAtStart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the service binaries")
	}
	bin := buildServices(t)
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	for _, bad := range []string{"21", "0", "1.5"} {
		cmd := exec.Command(filepath.Join(bin, "dispatcher"))
		cmd.Env = append(os.Environ(), "NATS_URL="+srv.URL, "ACTIONBUS_MAX_PLAN_ACTIONS="+bad)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "ACTIONBUS_MAX_PLAN_ACTIONS=%s: %s", bad, out)
		assert.Equal(t, 2, exit.ExitCode(), "%s", out)
		assert.Contains(t, string(out), "max plan actions", "%s", out)
	}
}
