package process

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
)

// logLine is one line of a service's JSON log.
type logLine struct {
	Time      time.Time `json:"time"`
	Msg       string    `json:"msg"`
	Partition *int      `json:"partition"`
	RunID     string    `json:"run_id"`
	From      string    `json:"from"`
	To        string    `json:"to"`
	Drain     string    `json:"drain"`
}

// logLines returns the JSON lines of out whose msg is one of msgs.
func logLines(out string, msgs ...string) []logLine {
	var lines []logLine
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l logLine
		if json.Unmarshal(sc.Bytes(), &l) == nil {
			for _, m := range msgs {
				if l.Msg == m {
					lines = append(lines, l)
				}
			}
		}
	}
	return lines
}

// terminalsPerRun returns, for every run of the default tenant, how many
// terminal events the runs stream stores.
func terminalsPerRun(t *testing.T, ctx context.Context, js jetstream.JetStream) map[string]int {
	t.Helper()
	stream, err := js.Stream(ctx, "AB_RUNS")
	require.NoError(t, err)
	out := map[string]int{}
	for _, verb := range []string{"completed", "failed", "canceled"} {
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter("ab.run."+events.DefaultTenant+".*."+verb+".*"))
		require.NoError(t, err)
		for subject, n := range info.State.Subjects {
			out[strings.Split(subject, ".")[3]] += int(n)
		}
	}
	return out
}

// Three dispatcher processes share six partitions of the runs; two are
// SIGKILLed mid-load and restarted. Every run ends once, each call is
// requested under one id, the partitions move (logged with timings), and
// no run state write conflicts outside the windows in which partitions
// move: with one owner per run, a conflict is the exception.
func TestThreePartitionedDispatchersShareAThousandRunsThroughKills(t *testing.T) {
	if testing.Short() {
		t.Skip("starts dispatcher processes")
	}
	const partitions, runs = 6, 1000
	bin := buildServices(t)
	srv := actionbustest.NewServer(t, actionbustest.Options{Partitions: partitions, AckWait: 2 * time.Second})
	rec := srv.Record(t, "")
	st := srv.StartStack(t, actionbustest.StackOptions{NoDispatcher: true, NoAuditor: true, Scenarios: crashScenarios, Executors: 2, Slots: 32,
		Register: func(ex *executor.Executor) error {
			return executor.Register(ex, executor.Action{Name: "crash.echo"},
				func(_ context.Context, in map[string]any, _ executor.Call) (executor.Result[map[string]any], error) {
					return executor.Result[map[string]any]{Output: in}, nil
				})
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()

	dispatchers := map[string]*service{}
	for _, id := range []string{"d1", "d2", "d3"} {
		d := &service{name: "dispatcher " + id, out: &actionbustest.LogBuffer{}, cmd: func() *exec.Cmd {
			c := exec.Command(filepath.Join(bin, "dispatcher"))
			c.Env = append(c.Environ(), "NATS_URL="+srv.URL, "ACTIONBUS_INSTANCE="+id)
			return c
		}}
		d.start(t)
		dispatchers[id] = d
		t.Cleanup(func() {
			d.kill9()
			if t.Failed() {
				t.Logf("%s output (last 6 000 bytes):\n%s", d.name, tail(d.out.String(), 6000))
			}
		})
	}
	// acquired is how many partitions each dispatcher serves, from its
	// log since it last started (a killed one hands nothing back).
	acquired := func() map[string]int {
		out := map[string]int{}
		for id, d := range dispatchers {
			log := d.out.String()
			if i := strings.LastIndex(log, `"msg":"dispatcher joined"`); i >= 0 {
				log = log[i:]
			}
			out[id] = len(logLines(log, "partition acquired")) - len(logLines(log, "partition released"))
		}
		return out
	}
	require.Eventually(t, func() bool {
		a := acquired()
		return a["d1"]+a["d2"]+a["d3"] == partitions && a["d1"] > 0 && a["d2"] > 0 && a["d3"] > 0
	}, 30*time.Second, 50*time.Millisecond, "the three dispatchers share the partitions")

	// The load: runs started at about 50 a second for 20 s, while d1 and d2 are
	// killed and restarted. Each kill or restart opens a window in which
	// partitions move.
	var (
		idsMu sync.Mutex
		ids   []string
	)
	started := make(chan error, 1)
	go func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for range runs {
			<-tick.C
			id, err := st.Client.Start(ctx, client.RunRequest{Scenario: "pair"})
			if err != nil {
				started <- err
				return
			}
			idsMu.Lock()
			ids = append(ids, id)
			idsMu.Unlock()
		}
		started <- nil
	}()
	type move struct {
		at   time.Time
		what string
	}
	var moves []move
	startedRuns := func() int {
		idsMu.Lock()
		defer idsMu.Unlock()
		return len(ids)
	}
	// step waits until the load has started afterRuns runs, does what,
	// and waits until the live dispatchers serve every partition again.
	step := func(afterRuns int, what string, do func(), live ...string) {
		require.Eventually(t, func() bool { return startedRuns() >= afterRuns }, 60*time.Second, 5*time.Millisecond, "%d runs started", afterRuns)
		moves = append(moves, move{time.Now(), what})
		do()
		require.Eventually(t, func() bool {
			a, sum := acquired(), 0
			for _, id := range live {
				if a[id] == 0 {
					return false
				}
				sum += a[id]
			}
			return sum == partitions
		}, 20*time.Second, 20*time.Millisecond, "after %s, %v serve every partition: %v", what, live, acquired())
	}
	step(100, "kill d1", dispatchers["d1"].kill9, "d2", "d3")
	step(300, "kill d2", dispatchers["d2"].kill9, "d3")
	step(550, "restart d1", func() { dispatchers["d1"].start(t) }, "d1", "d3")
	step(750, "restart d2", func() { dispatchers["d2"].start(t) }, "d1", "d2", "d3")
	require.NoError(t, <-started)

	idsMu.Lock()
	all := append([]string(nil), ids...)
	idsMu.Unlock()
	require.Len(t, all, runs)
	for _, id := range all {
		res, err := st.Client.Wait(ctx, id)
		require.NoError(t, err, id)
		require.Equal(t, client.StatusCompleted, res.Status, "run %s: %+v", id, res.Error)
	}

	// Every run ended once: one terminal event stored per run.
	terminals := terminalsPerRun(t, ctx, srv.JS)
	for _, id := range all {
		assert.Equal(t, 1, terminals[id], "run %s has one stored terminal event", id)
	}
	// Every call was requested under one id.
	rec.WaitForN(t, 30*time.Second, runs, func(r actionbustest.Recorded) bool { return r.Type() == events.TypeRunCompleted })
	requests := map[string]map[string]bool{}
	for _, r := range rec.All() {
		if r.Type() != events.TypeActionRequested {
			continue
		}
		var req events.ActionRequested
		require.NoError(t, events.DataAs(r.Event, &req))
		key := fmt.Sprintf("%s/%d/%d", req.RunID, req.Cycle, req.PlanIndex)
		if requests[key] == nil {
			requests[key] = map[string]bool{}
		}
		requests[key][r.Event.ID()] = true
	}
	assert.Len(t, requests, 2*runs)
	for key, ids := range requests {
		assert.Len(t, ids, 1, "action request %s published under %d ids", key, len(ids))
	}

	// The partitions moved: each kill handed the dead dispatcher's
	// partitions to the live ones, each restart took some back, and in
	// the end the three share them again.
	require.Eventually(t, func() bool {
		a := acquired()
		return a["d1"]+a["d2"]+a["d3"] == partitions && a["d1"] > 0 && a["d2"] > 0 && a["d3"] > 0
	}, 30*time.Second, 50*time.Millisecond, "after the restarts the three share the partitions: %v", acquired())
	var rebalances []logLine
	for id, d := range dispatchers {
		for _, l := range logLines(d.out.String(), "partition acquired", "partition released") {
			l.To = id + ": " + l.Msg
			rebalances = append(rebalances, l)
		}
	}
	sort.Slice(rebalances, func(i, j int) bool { return rebalances[i].Time.Before(rebalances[j].Time) })
	// A window runs from a kill or restart until the last partition move
	// it caused, and the redeliveries of what a killed dispatcher held
	// (the ack wait) after that.
	const settle = 4 * time.Second
	type window struct {
		what          string
		from, settled time.Time
	}
	var windows []window
	for i, m := range moves {
		w := window{what: m.what, from: m.at, settled: m.at}
		for _, l := range rebalances {
			if l.Time.After(m.at) && (i+1 == len(moves) || l.Time.Before(moves[i+1].at)) {
				w.settled = l.Time
			}
		}
		windows = append(windows, w)
		t.Logf("%s at %s: partitions settled after %s", m.what, m.at.Format("15:04:05.000"), w.settled.Sub(m.at).Round(time.Millisecond))
		assert.True(t, w.settled.After(m.at), "%s moved no partition", m.what)
		assert.Less(t, w.settled.Sub(m.at), 15*time.Second, "%s: partitions moved within seconds", m.what)
	}
	for _, l := range rebalances {
		t.Logf("%s %s partition %d (from %q, drain %s)", l.Time.Format("15:04:05.000"), l.To, *l.Partition, l.From, l.Drain)
	}
	conflicts, outside := 0, 0
	for id, d := range dispatchers {
		for _, l := range logLines(d.out.String(), "run state write conflict") {
			conflicts++
			in := false
			for _, w := range windows {
				if !l.Time.Before(w.from) && !l.Time.After(w.settled.Add(settle)) {
					in = true
				}
			}
			if !in {
				outside++
				t.Errorf("%s: run state write conflict outside every rebalance window at %s (run %s)", id, l.Time.Format("15:04:05.000"), l.RunID)
			}
		}
	}
	t.Logf("%d runs, %d run state write conflicts, %d outside the rebalance windows", runs, conflicts, outside)
}
