package process

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
)

// buildActionbus compiles the actionbus command line.
func buildActionbus(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "actionbus")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/actionbus")
	cmd.Dir = repoRoot(t)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// runKit runs `actionbus conformance executor --pool conformance` against
// url and returns its table's rows (rule, case, result), its output and
// its exit code.
func runKit(t *testing.T, bin, url string) (rows [][3]string, out string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, bin, "--nats", url, "conformance", "executor", "--pool", "conformance")
	b, err := cmd.CombinedOutput()
	out = string(b)
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("conformance kit: %v\n%s", err, out)
	}
	assert.Less(t, time.Since(start), 30*time.Second, "the whole kit runs well under a minute")
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || !strings.HasPrefix(f[0], "E-") {
			continue
		}
		res := "?"
		for _, w := range f {
			if w == "pass" || w == "FAIL" {
				res = w
				break
			}
		}
		rows = append(rows, [3]string{f[0], line, res})
	}
	t.Logf("conformance kit (exit %d):\n%s", code, out)
	return rows, out, code
}

// The Go executor, as a process (`actionbus conformance serve`), passes
// every case of the conformance kit, run as a process: exit status 0,
// every row "pass".
func TestTheGoExecutorPassesTheConformanceKit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := buildActionbus(t)
	srv := actionbustest.NewServer(t, actionbustest.Options{Pools: []string{"default", "conformance"}})
	serveRegistrar(t, srv)
	serve := exec.Command(bin, "--nats", srv.URL, "conformance", "serve", "--pool", "conformance", "--slots", "3")
	logs := &actionbustest.LogBuffer{}
	serve.Stdout, serve.Stderr = logs, logs
	require.NoError(t, serve.Start())
	exited := make(chan error, 1)
	go func() { exited <- serve.Wait() }()
	t.Cleanup(func() {
		_ = serve.Process.Signal(os.Interrupt)
		assert.NoError(t, <-exited, "conformance serve exits 0 on interrupt")
		if t.Failed() {
			t.Logf("conformance serve output:\n%s", logs.String())
		}
	})
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "serving the conformance catalog") },
		30*time.Second, 20*time.Millisecond, "the executor never served")

	rows, out, code := runKit(t, bin, srv.URL)
	assert.Equal(t, 0, code, out)
	require.Len(t, rows, 17, out)
	for _, r := range rows {
		assert.Equal(t, "pass", r[2], r[1])
	}
	assert.Contains(t, out, "all 17 cases passed")
}

// A deliberately broken executor (fresh result ids, no input validation,
// no announcement) fails the kit, on the rows of the rules it breaks,
// while the rows it keeps pass: the kit can fail, and fails precisely.
func TestTheConformanceKitFailsABrokenExecutorOnTheRulesItBreaks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := buildActionbus(t)
	srv := actionbustest.NewServer(t, actionbustest.Options{Pools: []string{"default", "conformance"}})
	startTestExecutor(t, buildTestExecutor(t), srv.URL, t.TempDir(), "broken", "BROKEN=1", "POOL=conformance")

	rows, out, code := runKit(t, bin, srv.URL)
	assert.Equal(t, 1, code, "a failing case makes the exit status non-zero")
	require.Len(t, rows, 17, out)
	results := map[string][]string{}
	for _, r := range rows {
		results[r[0]] = append(results[r[0]], r[2])
	}
	assert.Equal(t, []string{"FAIL", "FAIL"}, results["E-RESULT-ID"], "fresh result ids: the id formula and the duplicate request both fail")
	assert.Equal(t, []string{"FAIL", "FAIL", "FAIL"}, results["E-INPUT"], "no input validation")
	assert.Equal(t, []string{"FAIL"}, results["E-OUTPUT"], "no output validation")
	assert.Equal(t, []string{"FAIL"}, results["E-ANNOUNCE"], "no announcement")
	assert.Equal(t, []string{"pass"}, results["E-RESULT"], "its result shape is right")
	assert.Contains(t, out, "expected event id")
	assert.Contains(t, out, "expected 1 stored result for a call answered twice, got 2")
	assert.Contains(t, out, "expected action.failed action_args_invalid, got action.completed")
}

// `actionbus conformance client`, as a process, passes the Go client's
// start of a run: it prints that it listens, the client starts a run,
// and the kit exits 0 with every C-START check passed.
func TestTheGoClientPassesTheClientConformanceKit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := buildActionbus(t)
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	srv.ServeIngress(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kit := exec.CommandContext(ctx, bin, "--nats", srv.URL, "conformance", "client", "--wait", "20s")
	out := &actionbustest.LogBuffer{}
	kit.Stdout, kit.Stderr = out, out
	require.NoError(t, kit.Start())
	exited := make(chan error, 1)
	go func() { exited <- kit.Wait() }()
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "listening") }, 20*time.Second, 10*time.Millisecond, out.String())

	c, err := client.New(srv.Connect(t), client.Options{})
	require.NoError(t, err)
	_, err = c.Start(ctx, client.RunRequest{Prompt: "conformance"})
	require.NoError(t, err)
	require.NoError(t, <-exited, out.String())
	t.Logf("client conformance kit:\n%s", out.String())
	assert.Contains(t, out.String(), "all 4 checks passed")
	assert.NotContains(t, out.String(), "FAIL")
}
