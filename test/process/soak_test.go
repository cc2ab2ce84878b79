package process

import (
	"context"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// service is a service process the soak kills and restarts.
type service struct {
	name string
	cmd  func() *exec.Cmd
	out  *actionbustest.LogBuffer

	mu     sync.Mutex
	proc   *exec.Cmd
	exited chan struct{}
	kills  int
}

func (s *service) start(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd := s.cmd()
	cmd.Stdout, cmd.Stderr = s.out, s.out
	require.NoError(t, cmd.Start(), s.name)
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.proc, s.exited = cmd, exited
}

// kill9 kills the process with SIGKILL and waits for it to be gone.
func (s *service) kill9() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	_ = s.proc.Process.Signal(syscall.SIGKILL)
	<-s.exited
	s.proc = nil
	s.kills++
}

func (s *service) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil
}

const soakScenario = `
scenarios:
  soak:
    decisions:
      - type: plan
        actions: [{type: action, name: test.other, args: {i: 0}}, {type: action, name: test.other, args: {i: 1}}]
      - {type: action, name: soak.effect, args: {order: agent}}
      - {type: final, answer: done}
`

func envOr(key string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(key)); err == nil && n > 0 {
		return n
	}
	return def
}

// TestChaosSoak runs agent runs (a plan, then an idempotent mutation),
// workflows (a read step, then a mutation with retries) and exec runs (a
// mutation with the host's key) through real service processes — two
// dispatchers, a planner, three executors and the auditor — while it
// SIGKILLs a random one every few seconds and restarts it. Every
// mutation applies a business effect ("<run>/<order>") in a store outside
// the bus, once per idempotency key.
//
// It asserts that every accepted run ended exactly once (one terminal
// event stored), that every completed run's effect was applied, that no
// business effect was applied twice (under two keys), and that every
// stored event of the runs has exactly one audit record in a chain that
// verifies. SOAK_SECONDS
// (default 60) and SOAK_RUNS (default 150) size it; make soak runs 300 s
// and 1 000 runs.
func TestChaosSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills service processes")
	}
	seconds, runs := envOr("SOAK_SECONDS", 60), envOr("SOAK_RUNS", 150)
	chaosFor := time.Duration(seconds) * time.Second
	srv := actionbustest.NewServer(t, actionbustest.Options{AckWait: 2 * time.Second, Partitions: 4})
	bins := buildServices(t)
	exe := buildTestExecutor(t)
	dir := t.TempDir()
	scenarios := filepath.Join(dir, "soak.yaml")
	require.NoError(t, os.WriteFile(scenarios, []byte(soakScenario), 0o600))

	env := func(extra ...string) []string { return append(append(os.Environ(), "NATS_URL="+srv.URL), extra...) }
	var services []*service
	add := func(name string, cmd func() *exec.Cmd) {
		services = append(services, &service{name: name, cmd: cmd, out: &actionbustest.LogBuffer{}})
	}
	for _, id := range []string{"d1", "d2"} {
		add("dispatcher "+id, func() *exec.Cmd {
			c := exec.Command(filepath.Join(bins, "dispatcher"))
			c.Env = env("ACTIONBUS_INSTANCE="+id, "ACTIONBUS_APPROVAL_KEYS=k1:"+base64.StdEncoding.EncodeToString(deployApprovalKey))
			return c
		})
	}
	add("planner", func() *exec.Cmd {
		c := exec.Command(filepath.Join(bins, "planner"), "--scenarios", scenarios)
		c.Env = env()
		return c
	})
	for _, id := range []string{"e1", "e2", "e3"} {
		add("executor "+id, func() *exec.Cmd {
			c := exec.Command(exe)
			c.Env = env("TEST_DIR="+dir, "ACTIONBUS_EXECUTOR_ID="+id, "SLOTS=8")
			return c
		})
	}
	add("auditor", func() *exec.Cmd {
		c := exec.Command(filepath.Join(bins, "auditor"))
		c.Env = env()
		return c
	})
	for _, s := range services {
		s.start(t)
	}
	t.Cleanup(func() {
		for _, s := range services {
			s.kill9()
			if t.Failed() {
				t.Logf("%s output (last 4 KB):\n%s", s.name, tail(s.out.String(), 4<<10))
			}
		}
	})
	c, err := client.New(srv.Conn, client.Options{})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), chaosFor+5*time.Minute)
	defer cancel()
	waitCatalog(t, ctx, c, "soak.effect")
	if os.Getenv("SOAK_DEBUG") != "" {
		_, err := srv.Conn.Subscribe("ab.>", func(m *nats.Msg) { fmt.Fprintf(os.Stderr, "%s %s\n", m.Subject, tail(string(m.Data), 300)) })
		require.NoError(t, err)
	}

	// The approver: every mutation needs an approval, which an operator
	// grants (a duplicate request, republished after a crash, is refused
	// as a replay and ignored).
	approvals := 0
	var approvalsMu sync.Mutex
	asked := map[string]bool{}
	_, err = srv.Conn.Subscribe("ab.run.*.*.approval", func(m *nats.Msg) {
		e, err := bus.Decode(m.Subject, m.Header, m.Data)
		if err != nil || e.Type() != events.TypeApprovalRequested {
			return
		}
		var req events.ApprovalRequested
		if events.DataAs(e, &req) != nil {
			return
		}
		id := req.Context.ApprovalID
		approvalsMu.Lock()
		first := !asked[id]
		asked[id] = true
		approvalsMu.Unlock()
		if !first {
			return
		}
		go func() {
			// A dispatcher killed before it answered leaves the grant in
			// the stream; the answer comes when another serves it.
			for attempt := 0; attempt < 5 && ctx.Err() == nil; attempt++ {
				actx, cancel := context.WithTimeout(ctx, 20*time.Second)
				err := c.Approve(actx, id, "k1", deployApprovalKey)
				cancel()
				if err == nil || actionbus.CodeOf(err) == actionbus.CodeApprovalReplayed {
					approvalsMu.Lock()
					approvals++
					approvalsMu.Unlock()
					return
				}
			}
		}()
	})
	require.NoError(t, err)

	// Chaos: a SIGKILL every 0.5–2 s, the victim restarted 0.1–0.6 s later.
	stop := make(chan struct{})
	chaosDone := make(chan struct{})
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	go func() {
		defer close(chaosDone)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Duration(500+rng.IntN(1500)) * time.Millisecond):
			}
			victim := services[rng.IntN(len(services))]
			victim.kill9()
			select {
			case <-stop:
			case <-time.After(time.Duration(100+rng.IntN(500)) * time.Millisecond):
			}
			victim.start(t)
		}
	}()

	// Load: the runs are started evenly over the first 70% of the chaos.
	kinds := []string{"agent", "workflow", "exec"}
	type started struct{ id, kind string }
	all := make([]started, 0, runs)
	pace := time.Duration(float64(chaosFor) * 0.7 / float64(runs))
	ticker := time.NewTicker(pace) // load pacing: one run per tick
	defer ticker.Stop()
	for i := range runs {
		kind := kinds[i%3]
		req := client.RunRequest{AllowedModes: []string{"read", "mutate"}, Deadline: chaosFor + 4*time.Minute}
		switch kind {
		case "agent":
			req.Scenario = "soak"
		case "workflow":
			req.Workflow = client.NewWorkflow("soak").Step("a", "test.other", map[string]any{}).
				Step("b", "soak.effect", map[string]any{"order": "workflow"}, client.IdempotencyKey(fmt.Sprintf("wf-%d", i)),
					client.StepModes("mutate"), client.Retry(3, 200, false)).Build()
		case "exec":
			req.Action = &client.ActionCall{Name: "soak.effect", Args: map[string]any{"order": "exec"}, IdempotencyKey: fmt.Sprintf("exec-%d", i)}
		}
		id, err := c.Start(ctx, req)
		require.NoError(t, err, "run %d was not accepted", i)
		all = append(all, started{id, kind})
		<-ticker.C
	}
	// The chaos goes on for its whole duration, then every service is up.
	select {
	case <-time.After(time.Until(time.Now().Add(chaosFor - time.Duration(runs)*pace))):
	case <-ctx.Done():
	}
	close(stop)
	<-chaosDone
	for _, s := range services {
		if !s.running() {
			s.start(t)
		}
	}

	statuses := map[string]int{}
	byKind := map[string]map[string]int{}
	completed := map[string]bool{}
	for _, r := range all {
		res, err := c.Wait(ctx, r.id)
		require.NoError(t, err, "run %s (%s) did not end", r.id, r.kind)
		key := string(res.Status)
		if res.Error != nil {
			key += " " + string(res.Error.Code)
		}
		statuses[key]++
		if byKind[r.kind] == nil {
			byKind[r.kind] = map[string]int{}
		}
		byKind[r.kind][key]++
		if res.Status == client.StatusCompleted {
			completed[r.id] = true
		}
		assert.EqualValues(t, 1, terminalsStored(t, ctx, srv.JS, r.id), "run %s (%s) ended exactly once", r.id, r.kind)
	}

	// The effect store: one file per applied key, holding its business id.
	files, err := os.ReadDir(filepath.Join(dir, "effects"))
	require.NoError(t, err)
	applied := map[string]int{}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, "effects", f.Name()))
		require.NoError(t, err)
		applied[string(b)]++
	}
	duplicates := 0
	for business, n := range applied {
		if n > 1 {
			duplicates++
			t.Errorf("effect %s applied %d times", business, n)
		}
	}
	for _, r := range all {
		if completed[r.id] {
			assert.Equal(t, 1, applied[r.id+"/"+r.kind], "the effect of completed run %s (%s)", r.id, r.kind)
		}
	}
	// Every stored event of the soak's runs (run events, requests, work
	// items, fired timers) has exactly one audit record, though the
	// auditor was killed too, and every run's chain verifies.
	ids := make(map[string]bool, len(all))
	for _, r := range all {
		ids[r.id] = true
	}
	audited := requireAuditComplete(t, ctx, srv.JS, ids, time.Minute)

	kills := []string{}
	total := 0
	for _, s := range services {
		kills = append(kills, fmt.Sprintf("%s ×%d", s.name, s.kills))
		total += s.kills
	}
	var outcome []string
	for k, n := range statuses {
		outcome = append(outcome, fmt.Sprintf("%s: %d", k, n))
	}
	sort.Strings(outcome)
	approvalsMu.Lock()
	granted := approvals
	approvalsMu.Unlock()
	t.Logf("soak: %d runs over %s; %d SIGKILLs (%s); terminal events per run: 1 for all %d; outcomes {%s}; by kind %v; approvals granted %d; effects applied %d, duplicate effects %d; audit: %d stored events, each with one record, %d chains verified",
		len(all), chaosFor, total, strings.Join(kills, ", "), len(all), strings.Join(outcome, ", "), byKind, granted, len(applied), duplicates, audited, len(all))
	assert.Equal(t, len(all), statuses[string(client.StatusCompleted)], "every run completes despite the kills: %v", statuses)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
