package cli_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/audit"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/cli"
	"github.com/actionbus/actionbus/internal/llmtest"
	"github.com/actionbus/actionbus/internal/workflow"
)

// TestDevDemo is `make demo`: a plan of at least three actions on at least
// two executors, every step printed, then the answer, exit 0.
func TestDevDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	code := cli.Execute(ctx, []string{"dev", "--port", "-1", "--store", t.TempDir(), "--exit-after-demo", "--latency", "20ms"}, nil, &out, &errOut)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
	s := out.String()
	assert.Contains(t, s, "plan-executing")
	completed := regexp.MustCompile(`(?m)cycle 2 action-completed .*\(executor (executor-\d)\)$`).FindAllStringSubmatch(s, -1)
	assert.GreaterOrEqual(t, len(completed), 3, s)
	executors := map[string]bool{}
	for _, m := range completed {
		executors[m[1]] = true
	}
	assert.GreaterOrEqual(t, len(executors), 2, "the plan ran on at least two executors:\n%s", s)
	assert.True(t, strings.Contains(s, "✔ completed"), s)
	// search → dry run → approval → retry
	assert.Regexp(t, `(?s)delivery\.searchJobs.*delivery\.dryRunRetry.*awaiting-approval.*approval .* requested; dev mode approves it as dev-operator.*approval-granted.*delivery\.executeRetry`, s)
	assert.Contains(t, s, "3 delivery jobs failed. Retried after approval: job_1041, job_1043; blocked: job_1042.")
}

// The bundled skills ship with dev: the delivery-report scenario lists,
// reads and uses a skill, runs its tools, hands off to the reviewing skill,
// whose final tool result is the answer; `skills` lists both.
func TestDevShipsTheBundledSkills(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	code := cli.Execute(ctx, []string{"dev", "--port", "-1", "--store", t.TempDir(), "--exit-after-demo", "--demo", "delivery-report"}, nil, &out, &errOut)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
	s := out.String()
	assert.Regexp(t, `(?s)list_agent_skills.*read_agent_skill.*use_agent_skill.*skill\.delivery-report\.count_jobs.*skill\.delivery-report\.draft_report.*handed off from delivery-report to report-review.*skill\.report-review\.publish_report.*direct-final-emitted`, s)
	assert.Contains(t, s, "| FAILED | 3 |")
	assert.Contains(t, s, "Reviewed by report-review.")

	devCtx, stopDev := context.WithCancel(ctx)
	defer stopDev()
	var devOut syncWriter
	done := make(chan int, 1)
	go func() {
		done <- cli.Execute(devCtx, []string{"dev", "--port", "-1", "--store", t.TempDir(), "--no-demo"}, nil, &devOut, &devOut)
	}()
	url := waitForURL(t, &devOut)
	out.Reset()
	require.Equal(t, 0, cli.Execute(ctx, []string{"--nats", url, "skills"}, nil, &out, &errOut), errOut.String())
	assert.Regexp(t, `delivery-report +1 +default +count_jobs,draft_report +report-review`, out.String())
	out.Reset()
	require.Equal(t, 0, cli.Execute(ctx, []string{"--nats", url, "skills", "show", "report-review"}, nil, &out, &errOut), errOut.String())
	assert.Contains(t, out.String(), "publish_report (read, tier 0) → final")
	assert.Contains(t, out.String(), "# Report review")
	out.Reset()
	assert.NotEqual(t, 0, cli.Execute(ctx, []string{"--nats", url, "skills", "show", "nope"}, nil, &out, &errOut))
	stopDev()
	assert.Equal(t, 0, <-done)
}

func TestDevRefusesNonLoopbackHosts(t *testing.T) {
	var out, errOut bytes.Buffer
	code := cli.Execute(context.Background(), []string{"dev", "--host", "0.0.0.0", "--port", "-1"}, nil, &out, &errOut)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut.String(), "not a loopback address")
}

func TestDevRefusesANegativeExecutorCount(t *testing.T) {
	var out, errOut bytes.Buffer
	code := cli.Execute(context.Background(), []string{"dev", "--port", "-1", "--executors", "-1"}, nil, &out, &errOut)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut.String(), "--executors must be 0 or more")
}

func TestRunExitCodeFollowsTheTerminalState(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	// exec of an unknown action: the run fails, so the exit code is not 0.
	done := make(chan int, 1)
	devCtx, stopDev := context.WithCancel(ctx)
	defer stopDev()
	var devOut syncWriter
	go func() {
		done <- cli.Execute(devCtx, []string{"dev", "--port", "-1", "--store", t.TempDir(), "--no-demo"}, nil, &devOut, &devOut)
	}()
	url := waitForURL(t, &devOut)
	for !strings.Contains(devOut.String(), "Ctrl-C stops") {
		select {
		case <-devOut.signal():
		case <-ctx.Done():
			t.Fatalf("dev printed: %s", devOut.String())
		}
	}
	// The hints name the program running (this test's binary), not go run.
	assert.Regexp(t, `ACTIONBUS_APPROVAL_KEY=dev-operator:\S+ `+regexp.QuoteMeta(os.Args[0])+` --nats \S+ --creds \S+ approve APPROVAL_ID`, devOut.String(),
		"dev --no-demo says how to approve")
	assert.NotContains(t, devOut.String(), "go run")
	code := cli.Execute(ctx, []string{"--nats", url, "exec", "nope.missing", "--input", "{}"}, nil, &out, &errOut)
	assert.Equal(t, 2, code, out.String())
	assert.Contains(t, out.String(), "action_not_found")

	// exec reads its input from stdin (-) and from a file (@FILE).
	out.Reset()
	code = cli.Execute(ctx, []string{"--nats", url, "exec", "delivery.searchJobs", "--input", "-"}, strings.NewReader(`{"status":["FAILED"]}`), &out, &errOut)
	assert.Equal(t, 0, code, out.String()+errOut.String())
	assert.Contains(t, out.String(), "3 jobs")
	input := filepath.Join(t.TempDir(), "input.json")
	require.NoError(t, os.WriteFile(input, []byte(`{"status":["FAILED"]}`), 0o600))
	out.Reset()
	code = cli.Execute(ctx, []string{"--nats", url, "exec", "delivery.searchJobs", "--input", "@" + input}, nil, &out, &errOut)
	assert.Equal(t, 0, code, out.String()+errOut.String())
	assert.Contains(t, out.String(), "3 jobs")

	out.Reset()
	code = cli.Execute(ctx, []string{"--nats", url, "run", "--scenario", "echo", "hi there"}, nil, &out, &errOut)
	assert.Equal(t, 0, code, out.String()+errOut.String())
	assert.Contains(t, out.String(), "hi there")

	out.Reset()
	code = cli.Execute(ctx, []string{"--nats", url, "run", "--scenario", "clarify"}, strings.NewReader("dhl-express\n"), &out, &errOut)
	assert.Equal(t, 0, code, out.String()+errOut.String())
	assert.Contains(t, out.String(), "? Which carrier should I check?", "the question is asked on the terminal")
	assert.Contains(t, out.String(), "Checking carrier dhl-express.", "the typed answer resumed the run")

	// Replay the echo run: same decisions, no divergence.
	out.Reset()
	code = cli.Execute(ctx, []string{"--nats", url, "run", "--scenario", "echo", "replay me"}, nil, &out, &errOut)
	require.Equal(t, 0, code, out.String()+errOut.String())
	runID := runIDPattern.FindStringSubmatch(out.String())[1]
	out.Reset()
	code = cli.Execute(ctx, []string{"--nats", url, "replay", runID}, nil, &out, &errOut)
	assert.Equal(t, 0, code, out.String()+errOut.String())
	assert.Contains(t, out.String(), "replayed "+runID+" as ")
	assert.Contains(t, out.String(), "✔ no divergence")

	out.Reset()
	code = cli.Execute(ctx, []string{"--nats", url, "actions"}, nil, &out, &errOut)
	assert.Equal(t, 0, code)
	assert.Regexp(t, `delivery\.dryRunRetry +dryRun`, out.String())
	stopDev()
	assert.Equal(t, 0, <-done)
}

func readFile(t *testing.T, path string) string {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

var runIDPattern = regexp.MustCompile(`▶ run (\S+) started`)

// The run command shows a synthesized answer while the planner writes it.
func TestRunStreamsTheAnswerAsItIsWritten(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	llm := llmtest.New(t)
	llm.Respond(func(r llmtest.Request) llmtest.Reply {
		if r.Stream {
			return llmtest.Reply{Content: "Two failed jobs can be retried: j-1 and j-3."}
		}
		return llmtest.Reply{Content: `{"type":"plan","synthesize_instruction":"List the retryable jobs.",` +
			`"actions":[{"type":"action","name":"delivery.searchJobs","args":{"status":["failed"]}}]}`}
	})
	devCtx, stopDev := context.WithCancel(ctx)
	defer stopDev()
	var devOut syncWriter
	done := make(chan int, 1)
	go func() {
		done <- cli.Execute(devCtx, []string{"dev", "--port", "-1", "--store", t.TempDir(), "--no-demo", "--latency", "0s",
			"--openai-base-url", llm.URL, "--planner-mode", "envelope"}, nil, &devOut, &devOut)
	}()
	url := waitForURL(t, &devOut)
	assert.Contains(t, devOut.String(), "planner (openai: gpt-4o-mini at "+llm.URL+", envelope)")
	var out, errOut bytes.Buffer
	code := cli.Execute(ctx, []string{"--nats", url, "run", "Which failed jobs can we retry?"}, nil, &out, &errOut)
	require.Equal(t, 0, code, out.String()+errOut.String())
	assert.Regexp(t, `(?m)^ +\S+ ✎ Two failed jobs can be retried: j-1 and j-3\.$`, out.String(), "the streamed line")
	stopDev()
	assert.Equal(t, 0, <-done)
}

func TestWorkflowValidatePrintsEveryIssueAndFails(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"workflowName": "w", "steps": [{"id": "a", "action": "x.y", "retry": {"maxAttempts": 0}},
	  {"id": "a", "action": "x.z", "input": {"v": {"$fromStep": "later", "path": "/x"}}}]}`), 0o600))
	var out, errOut bytes.Buffer
	code := cli.Execute(context.Background(), []string{"workflow", "validate", bad}, nil, &out, &errOut)
	assert.Equal(t, 1, code)
	for _, want := range []string{"/steps/0/retry/maxAttempts\tinvalid_retry", "/steps/1/id\tduplicate_step", "/steps/1/input/v/$fromStep\tinvalid_step_reference"} {
		assert.Contains(t, out.String(), want)
	}
	good := filepath.Join(dir, "good.json")
	require.NoError(t, os.WriteFile(good, []byte(`{"workflowName": "w", "steps": [{"id": "a", "action": "x.y", "input": {}}]}`), 0o600))
	out.Reset()
	assert.Equal(t, 0, cli.Execute(context.Background(), []string{"workflow", "validate", good}, nil, &out, &errOut))
	assert.Contains(t, out.String(), "valid")
}

func TestAuditVerifyNamesTheFirstBrokenLink(t *testing.T) {
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	rec := srv.Record(t, "ab.audit.*.*.*")
	dir := t.TempDir()
	jsonl, db := filepath.Join(dir, "audit.jsonl"), filepath.Join(dir, "audit.db")
	// Three records per append: the run's chain spans several messages.
	st := srv.StartStack(t, actionbustest.StackOptions{AuditJSONL: jsonl, AuditSQLite: db, AuditMaxBatch: 3, Scenarios: `
scenarios:
  echo:
    decisions:
      - {type: action, name: t.echo, args: {}}
      - {type: final, answer: ok}
`, Register: func(ex *executor.Executor) error {
		return executor.Register(ex, executor.Action{Name: "t.echo"}, func(_ context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
			return executor.Result[map[string]any]{Output: in}, nil
		})
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "echo"}, nil)
	require.NoError(t, err)
	// Wait until the request and the terminal event are audited: the
	// chain is complete. (The auditor reads the requests stream and the
	// runs stream apart, so the request's record may come after others.)
	for _, typ := range []string{events.TypeRunRequested, events.TypeRunCompleted} {
		rec.WaitForAudit(t, 0, 1, func(a client.AuditRecord) bool { return a.RunID == res.RunID && a.EventType == typ })
	}

	var out, errOut bytes.Buffer
	code := cli.Execute(ctx, []string{"--nats", srv.URL, "audit", "verify", "--auditor-key=" + st.AuditorKey, res.RunID}, nil, &out, &errOut)
	require.Equal(t, 0, code, out.String()+errOut.String())
	assert.Contains(t, out.String(), "intact:")
	n := 0
	for _, r := range rec.All() {
		n += len(r.AuditRecords())
	}

	// export: every record of the run as JSON lines; filters apply.
	out.Reset()
	code = cli.Execute(ctx, []string{"--nats", srv.URL, "audit", "export", "--run", res.RunID}, nil, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	exported := strings.Split(strings.TrimSpace(out.String()), "\n")
	assert.Len(t, exported, n)
	assert.Contains(t, exported[0], `"streamSeq":1,`)
	out.Reset()
	code = cli.Execute(ctx, []string{"--nats", srv.URL, "audit", "export", "--kind", "action", "--status", "succeeded"}, nil, &out, &errOut)
	require.Equal(t, 0, code, errOut.String())
	assert.Equal(t, 1, strings.Count(out.String(), "\n"), out.String())
	assert.Contains(t, out.String(), `"action":"t.echo"`)

	// tail: live, from the start, until stopped.
	var tailOut syncWriter
	tailCtx, stopTail := context.WithCancel(ctx)
	tailDone := make(chan int, 1)
	go func() {
		tailDone <- cli.Execute(tailCtx, []string{"--nats", srv.URL, "audit", "tail", "--from-start", "--action", "t.echo"}, nil, &tailOut, &tailOut)
	}()
	started := regexp.MustCompile(`action +started .* t\.echo`)
	for !started.MatchString(tailOut.String()) {
		select {
		case <-tailOut.signal():
		case <-ctx.Done():
			t.Fatalf("tail never printed the action's start: %s", tailOut.String())
		}
	}
	stopTail()
	assert.Equal(t, 0, <-tailDone)
	assert.GreaterOrEqual(t, strings.Count(tailOut.String(), "t.echo"), 2, "the filter keeps every record of the action")

	// The sinks: intact, then one record altered in each.
	require.Eventually(t, func() bool {
		a, errA := audit.ReadJSONL(jsonl, res.RunID)
		b, errB := audit.ReadSQLite(ctx, db, res.RunID)
		return errA == nil && errB == nil && len(a) == n && len(b) == n
	}, 20*time.Second, 10*time.Millisecond)
	for _, flag := range []string{"--jsonl=" + jsonl, "--sqlite=" + db} {
		out.Reset()
		code = cli.Execute(ctx, []string{"audit", "verify", "--auditor-key=" + st.AuditorKey, res.RunID, flag}, nil, &out, &errOut)
		require.Equal(t, 0, code, out.String()+errOut.String())
		assert.Contains(t, out.String(), fmt.Sprintf("intact: %d records", n))
	}
	lines := strings.Split(strings.TrimSpace(readFile(t, jsonl)), "\n")
	// Cut off the tail from the terminal record on: every remaining link
	// holds, but the run ended, so the chain is reported truncated.
	full := readFile(t, jsonl)
	term := -1
	for i, l := range lines {
		if strings.Contains(l, `"kind":"run"`) && (strings.Contains(l, `"status":"completed"`) || strings.Contains(l, `"status":"failed"`)) {
			term = i
		}
	}
	require.Positive(t, term, "the chain has a terminal record")
	// The cut is at the start of the terminal record's append: a cut
	// inside an append leaves records no signature covers, which fails
	// before this check.
	var termRec audit.SinkRecord
	require.NoError(t, json.Unmarshal([]byte(lines[term]), &termRec))
	term -= termRec.Index
	require.Positive(t, term, "the terminal record is not in the first append")
	require.NoError(t, os.WriteFile(jsonl, []byte(strings.Join(lines[:term], "\n")+"\n"), 0o600))
	out.Reset()
	code = cli.Execute(ctx, []string{"--nats", srv.URL, "audit", "verify", "--auditor-key=" + st.AuditorKey, res.RunID, "--jsonl", jsonl}, nil, &out, &errOut)
	assert.Equal(t, 1, code, out.String())
	assert.Contains(t, out.String(), "truncated: run "+res.RunID+" ended (completed)")
	require.NoError(t, os.WriteFile(jsonl, []byte(full), 0o600))
	lines[4] = strings.Replace(lines[4], `"kind":"`, `"kind":"tampered-`, 1)
	require.NoError(t, os.WriteFile(jsonl, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	out.Reset()
	code = cli.Execute(ctx, []string{"audit", "verify", "--auditor-key=" + st.AuditorKey, res.RunID, "--jsonl", jsonl}, nil, &out, &errOut)
	assert.Equal(t, 1, code)
	var fifth audit.SinkRecord
	require.NoError(t, json.Unmarshal([]byte(lines[4]), &fifth))
	assert.Contains(t, out.String(), fmt.Sprintf("broken at record 5 of %d in %s (stream sequence %d,", n, jsonl, fifth.StreamSeq))
	var sixth audit.SinkRecord
	require.NoError(t, json.Unmarshal([]byte(lines[5]), &sixth))

	sqlDB, err := sql.Open("sqlite", db)
	require.NoError(t, err)
	_, err = sqlDB.Exec(`UPDATE audit_records SET record = replace(record, '"eventTime":"20', '"eventTime":"19') WHERE stream_seq = ? AND idx = ?`, sixth.StreamSeq, sixth.Index)
	require.NoError(t, err)
	require.NoError(t, sqlDB.Close())
	out.Reset()
	code = cli.Execute(ctx, []string{"audit", "verify", "--auditor-key=" + st.AuditorKey, res.RunID, "--sqlite", db}, nil, &out, &errOut)
	assert.Equal(t, 1, code)
	assert.Contains(t, out.String(), fmt.Sprintf("broken at record 6 of %d in %s (stream sequence %d,", n, db, sixth.StreamSeq))

	// Remove the run's second append from the stream: the record after
	// it no longer links.
	stream, err := srv.JS.Stream(ctx, "AB_AUDIT")
	require.NoError(t, err)
	var seqs []uint64
	first := 0 // records in the first append
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"ab.audit.default." + res.RunID + ".*"}})
	require.NoError(t, err)
	batch, err := cons.Fetch(100, jetstream.FetchMaxWait(time.Second))
	require.NoError(t, err)
	for m := range batch.Messages() {
		md, _ := m.Metadata()
		seqs = append(seqs, md.Sequence.Stream)
		if first == 0 {
			first = len(actionbustest.Recorded{Subject: m.Subject(), Event: decodeEvent(t, m)}.AuditRecords())
		}
	}
	require.Greater(t, len(seqs), 2, "the run's records span at least three appends")
	require.NoError(t, stream.DeleteMsg(ctx, seqs[1]))
	out.Reset()
	code = cli.Execute(ctx, []string{"--nats", srv.URL, "audit", "verify", "--auditor-key=" + st.AuditorKey, res.RunID}, nil, &out, &errOut)
	assert.Equal(t, 1, code)
	assert.Contains(t, out.String(), fmt.Sprintf("broken at record %d of", first+1))
}

func decodeEvent(t *testing.T, m jetstream.Msg) *event.Event {
	e, err := bus.Decode(m.Subject(), m.Headers(), m.Data())
	require.NoError(t, err)
	return e
}

// run --help shows the JSON workflow format with an example that
// validates against the demo's actions (the README runs the same one
// against dev).
func TestRunHelpShowsAJSONWorkflowThatValidates(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Equal(t, 0, cli.Execute(context.Background(), []string{"run", "--help"}, nil, &out, &errOut), errOut.String())
	help := out.String()
	for _, want := range []string{`"workflowName"`, `"steps"`, `"$fromStep"`, "--allow-mode read,draft,dryRun,mutate"} {
		assert.Contains(t, help, want)
	}
	example := regexp.MustCompile(`(?ms)^  \{$.*?^  \}$`).FindString(help)
	require.NotEmpty(t, example, "no example workflow in:\n%s", help)
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(example), &doc), example)
	issues := workflow.Validate(doc, workflow.Catalog{"delivery.searchJobs": "read", "delivery.dryRunRetry": "dryRun"})
	assert.Empty(t, issues, "the help's example workflow")
}
