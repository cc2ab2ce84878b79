// Package process runs actionbus the way an operator does: each service as
// its own process (the binaries of cmd/), against a real nats-server, and
// follows the README's hand-written example literally.
package process

import (
	"context"
	"fmt"
	"io"
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

// The docs' command blocks are tests: every ```sh block of README.md and of
// docs/*.md (docs/http.md's curl examples run in internal/httpapi's
// TestTheHTTPDocsExamplesRun) runs, in order and as written, in one shell
// session against a real `actionbus dev` process started after its demo,
// as a reader's terminal would. What the markdown says for the test, in
// HTML comments between the previous block and this one:
//
//   - <!-- not-run: REASON --> skips the block (a cluster, docker, an LLM
//     key, the nats CLI, a command that serves for ever); the test logs
//     every skipped block with its reason.
//   - <!-- sets NAME /REGEXP/ --> sets the shell variable NAME, for later
//     blocks, to the first group of REGEXP in the block's output (waiting
//     for it, so a run started in the background with & can print it
//     later): the run or approval id a reader copies from the screen.
//
// The session's shell has set -e (a failing command fails the test), works
// in an empty directory, and has from dev's banner the variables the docs
// tell a reader to export: NATS_URL, NATS_CREDS (the default tenant's
// client creds), APPROVER_CREDS, ACTIONBUS_APPROVAL_KEY and TOKEN (the
// console's). Two substitutions keep the docs readable: `go run
// ./cmd/actionbus` is the built binary (`actionbus` on PATH, as after
// make build), and the console address 127.0.0.1:8642 is the one dev
// printed.
func TestTheDocsCommandBlocksRunAgainstDev(t *testing.T) {
	if testing.Short() {
		t.Skip("builds actionbus and runs the docs against a dev process")
	}
	root := repoRoot(t)
	blocks := docsBlocks(t, root)
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+string(os.PathSeparator), "./cmd/actionbus")
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	dev := startDev(t, filepath.Join(bin, "actionbus"))
	sh := startShell(t, append(os.Environ(),
		"PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"NATS_URL="+dev.url, "NATS_CREDS="+dev.clientCreds, "APPROVER_CREDS="+dev.approverCreds,
		"ACTIONBUS_APPROVAL_KEY="+dev.approvalKey, "TOKEN="+dev.token))
	_, curlErr := exec.LookPath("curl")
	ran := 0
	for _, b := range blocks {
		if b.skip == "" && curlErr != nil && strings.Contains(b.script, "curl ") {
			b.skip = "no curl on PATH (.ci/run installs it)"
		}
		if b.skip != "" {
			t.Logf("not run: %s:%d: %s", b.file, b.line, b.skip)
			continue
		}
		script := strings.ReplaceAll(b.script, "go run ./cmd/actionbus", "actionbus")
		script = strings.ReplaceAll(script, "127.0.0.1:8642", dev.console)
		output := sh.run(t, b, script)
		for _, s := range b.sets {
			value := sh.await(t, b, output, s.re)
			sh.run(t, b, s.name+"='"+value+"'")
			t.Logf("%s:%d: %s=%s", b.file, b.line, s.name, value)
		}
		ran++
	}
	t.Logf("ran %d command blocks of %d", ran, len(blocks))
	assert.GreaterOrEqual(t, ran, 6, "the docs' runnable blocks")
}

// docsBlock is one shell block of the docs and what the markdown says
// about it.
type docsBlock struct {
	file   string
	line   int
	script string
	skip   string
	sets   []docsSet
}

type docsSet struct {
	name string
	re   *regexp.Regexp
}

var (
	fence       = regexp.MustCompile("(?ms)^```(\\w*)[^\\n]*\\n(.*?)^```[ \\t]*$")
	notRunNote  = regexp.MustCompile(`<!--\s*not-run:\s*(.*?)\s*-->`)
	setsNote    = regexp.MustCompile(`<!--\s*sets\s+([A-Z_][A-Z0-9_]*)\s+/(.*?)/\s*-->`)
	shellFenced = map[string]bool{"sh": true, "bash": true, "shell": true, "console": true}
)

// docsBlocks reads the shell blocks of README.md, then of docs/*.md but
// http.md, in order.
func docsBlocks(t *testing.T, root string) []docsBlock {
	t.Helper()
	files := []string{"README.md"}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	for _, d := range docs {
		if filepath.Base(d) != "http.md" {
			files = append(files, filepath.Join("docs", filepath.Base(d)))
		}
	}
	var out []docsBlock
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		require.NoError(t, err)
		text := string(b)
		prev := 0
		for _, m := range fence.FindAllStringSubmatchIndex(text, -1) {
			lang := text[m[2]:m[3]]
			before := text[prev:m[0]]
			prev = m[1]
			if !shellFenced[lang] {
				continue
			}
			// The comments between the previous block and this one speak
			// of this one.
			notes := before
			blk := docsBlock{file: f, line: strings.Count(text[:m[0]], "\n") + 1, script: text[m[4]:m[5]]}
			if n := notRunNote.FindStringSubmatch(notes); n != nil {
				blk.skip = n[1]
				require.NotEmpty(t, blk.skip, "%s:%d: a not-run block says why", f, blk.line)
			}
			for _, s := range setsNote.FindAllStringSubmatch(notes, -1) {
				re, err := regexp.Compile(s[2])
				require.NoError(t, err, "%s:%d: sets %s", f, blk.line, s[1])
				require.Equal(t, 1, re.NumSubexp(), "%s:%d: sets %s: one group", f, blk.line, s[1])
				blk.sets = append(blk.sets, docsSet{name: s[1], re: re})
			}
			out = append(out, blk)
		}
	}
	return out
}

// devProcess is a running `actionbus dev` and what its banner printed.
type devProcess struct {
	url, clientCreds, approverCreds, approvalKey, console, token string
}

var (
	devURL      = regexp.MustCompile(`NATS with JetStream at (nats://\S+)`)
	devCreds    = regexp.MustCompile(`client creds (\S+), approver creds (\S+)`)
	devKey      = regexp.MustCompile(`ACTIONBUS_APPROVAL_KEY=(\S+)`)
	devConsoleA = regexp.MustCompile(`console: http://([^/\s]+)/#token=(\S+)`)
)

// startDev starts `actionbus dev` (on free ports, with its demo) and
// returns once it serves; it is stopped with SIGINT, and must exit 0, in
// t.Cleanup.
func startDev(t *testing.T, bin string) devProcess {
	t.Helper()
	cmd := exec.Command(bin, "dev", "--port", "-1", "--store", t.TempDir(), "--console", "127.0.0.1:0")
	out := &actionbustest.LogBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case err := <-done:
			assert.NoError(t, err, "dev did not exit cleanly:\n%s", out.String())
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("dev did not stop on SIGINT:\n%s", out.String())
		}
		if t.Failed() {
			t.Logf("dev output:\n%s", out.String())
		}
	})
	require.Eventually(t, func() bool {
		select {
		case err := <-done:
			done <- err
			return true
		default:
			return strings.Contains(out.String(), "Ctrl-C stops.")
		}
	}, 2*time.Minute, 50*time.Millisecond, "dev did not start:\n%s", out.String())
	banner := out.String()
	require.Contains(t, banner, "Ctrl-C stops.", "dev exited:\n%s", banner)
	require.Contains(t, banner, "✔ completed", "dev's demo did not complete:\n%s", banner)
	var d devProcess
	m := devURL.FindStringSubmatch(banner)
	require.NotNil(t, m, banner)
	d.url = m[1]
	m = devCreds.FindStringSubmatch(banner)
	require.NotNil(t, m, banner)
	d.clientCreds, d.approverCreds = m[1], m[2]
	m = devKey.FindStringSubmatch(banner)
	require.NotNil(t, m, banner)
	d.approvalKey = m[1]
	m = devConsoleA.FindStringSubmatch(banner)
	require.NotNil(t, m, banner)
	d.console, d.token = m[1], m[2]
	return d
}

// docsShell is one shell session, as a reader's terminal: variables and
// background jobs live on from block to block.
type docsShell struct {
	stdin io.WriteCloser
	out   *actionbustest.LogBuffer
	done  chan struct{}
	dir   string
	n     int
}

// startShell starts sh with set -e in an empty directory; in t.Cleanup
// its background jobs are waited for, and must have ended.
func startShell(t *testing.T, env []string) *docsShell {
	t.Helper()
	s := &docsShell{out: &actionbustest.LogBuffer{}, done: make(chan struct{}), dir: t.TempDir()}
	cmd := exec.Command("sh")
	cmd.Dir = t.TempDir()
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = s.out, s.out
	var err error
	s.stdin, err = cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	go func() { _ = cmd.Wait(); close(s.done) }()
	_, err = io.WriteString(s.stdin, "set -e\n")
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = s.stdin.Close() // the shell ends at the end of its input
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("the docs' shell did not end:\n%s", s.out.String())
		}
	})
	return s
}

// run runs script in the session (sourced from a file, stdin from
// /dev/null so that no command reads the session's input) and returns
// the offset of its output in the session's output.
func (s *docsShell) run(t *testing.T, b docsBlock, script string) int {
	t.Helper()
	s.n++
	file := filepath.Join(s.dir, fmt.Sprintf("block-%d.sh", s.n))
	require.NoError(t, os.WriteFile(file, []byte(script), 0o600))
	from := len(s.out.String())
	marker := fmt.Sprintf("docs-block-%d-done", s.n)
	_, err := fmt.Fprintf(s.stdin, ". %s < /dev/null\necho %s\n", file, marker)
	require.NoError(t, err)
	ok := s.wait(func() bool { return strings.Contains(s.out.String()[from:], marker+"\n") }, 3*time.Minute)
	require.True(t, ok, "%s:%d failed (set -e) or did not end:\n%s\noutput:\n%s", b.file, b.line, script, s.out.String()[from:])
	t.Logf("%s:%d ran:\n%s", b.file, b.line, s.out.String()[from:])
	return from
}

// await waits for re in the session's output from offset from and returns
// its first group.
func (s *docsShell) await(t *testing.T, b docsBlock, from int, re *regexp.Regexp) string {
	t.Helper()
	var value string
	ok := s.wait(func() bool {
		m := re.FindStringSubmatch(s.out.String()[from:])
		if m != nil {
			value = m[1]
		}
		return m != nil
	}, time.Minute)
	require.True(t, ok, "%s:%d never printed /%s/:\n%s", b.file, b.line, re, s.out.String()[from:])
	return value
}

// wait polls cond until it holds (true), the shell ends or d passes
// (false).
func (s *docsShell) wait(cond func() bool, d time.Duration) bool {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(d)
	for {
		if cond() {
			return true
		}
		select {
		case <-s.done:
			return cond()
		case <-deadline:
			return false
		case <-tick.C:
		}
	}
}
