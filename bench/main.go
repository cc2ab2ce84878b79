// Command bench is the end-to-end harness of `make bench`: it starts an
// embedded nats-server with JetStream and the four services as a user
// would (as `actionbus dev` does), measures latency, throughput and the
// per-action overhead against a bare JetStream floor measured in the same
// run, prints one table and writes the figures as JSON to bench/results/.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sort"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/embedded"
	"github.com/actionbus/actionbus/internal/events"
	"github.com/actionbus/actionbus/internal/planner"
	"github.com/actionbus/actionbus/internal/stack"
)

const scenarios = `
scenarios:
  one:
    decisions:
      - {type: action, name: bench.echo, args: {n: 1}}
      - {type: final, answer: ok}
  plan10:
    decisions:
      - type: plan
        actions:
          - {type: action, name: bench.echo, args: {n: 0}}
          - {type: action, name: bench.echo, args: {n: 1}}
          - {type: action, name: bench.echo, args: {n: 2}}
          - {type: action, name: bench.echo, args: {n: 3}}
          - {type: action, name: bench.echo, args: {n: 4}}
          - {type: action, name: bench.echo, args: {n: 5}}
          - {type: action, name: bench.echo, args: {n: 6}}
          - {type: action, name: bench.echo, args: {n: 7}}
          - {type: action, name: bench.echo, args: {n: 8}}
          - {type: action, name: bench.echo, args: {n: 9}}
      - {type: final, answer: ok}
  plan10slow:
    decisions:
      - type: plan
        actions:
          - {type: action, name: bench.sleep, args: {n: 0}}
          - {type: action, name: bench.sleep, args: {n: 1}}
          - {type: action, name: bench.sleep, args: {n: 2}}
          - {type: action, name: bench.sleep, args: {n: 3}}
          - {type: action, name: bench.sleep, args: {n: 4}}
          - {type: action, name: bench.sleep, args: {n: 5}}
          - {type: action, name: bench.sleep, args: {n: 6}}
          - {type: action, name: bench.sleep, args: {n: 7}}
          - {type: action, name: bench.sleep, args: {n: 8}}
          - {type: action, name: bench.sleep, args: {n: 9}}
      - {type: final, answer: ok}
  oneslow:
    decisions:
      - {type: action, name: bench.sleep, args: {n: 1}}
      - {type: final, answer: ok}
`

type echoIn struct {
	N int `json:"n"`
}

func register(ex *executor.Executor) error {
	if err := executor.Register(ex, executor.Action{Name: "bench.echo"},
		func(_ context.Context, in echoIn, _ executor.Call) (executor.Result[echoIn], error) {
			return executor.Result[echoIn]{Output: in}, nil
		}); err != nil {
		return err
	}
	return executor.Register(ex, executor.Action{Name: "bench.sleep"},
		func(ctx context.Context, in echoIn, _ executor.Call) (executor.Result[echoIn], error) {
			t := time.NewTimer(10 * time.Millisecond)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return executor.Result[echoIn]{}, ctx.Err()
			}
			return executor.Result[echoIn]{Output: in}, nil
		})
}

// Figure is one measured number.
type Figure struct {
	Name   string  `json:"name"`
	Value  float64 `json:"value"`
	Unit   string  `json:"unit"`
	Target string  `json:"target,omitempty"`
	Note   string  `json:"note,omitempty"`
}

// env is one deployment under test.
type env struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	c       *client.Client
	waiters sync.Map // run id -> chan string (terminal type)
	stop    func()
}

func start(ctx context.Context, executors, slots int) *env {
	dir, err := os.MkdirTemp("", "actionbus-bench-")
	must(err)
	ns, err := embedded.Start(embedded.Options{Port: -1, StoreDir: dir})
	must(err)
	nc, err := nats.Connect(ns.ClientURL())
	must(err)
	js, err := jetstream.New(nc)
	must(err)
	must(events.Topology{}.Provision(ctx, js))
	sc, err := planner.ParseScenarios([]byte(scenarios))
	must(err)
	script, err := planner.NewScript(sc)
	must(err)
	svcConn, err := nats.Connect(ns.ClientURL())
	must(err)
	st, err := stack.Start(ctx, svcConn, stack.Config{Provider: script, Executors: executors, Slots: slots, Register: register})
	must(err)
	c, err := client.New(nc, client.Options{})
	must(err)
	e := &env{nc: nc, js: js, c: c}
	// One subscription for every terminal event: the harness measures the
	// system, not a follower per run.
	for _, verb := range []string{"completed", "failed", "canceled"} {
		_, err := nc.Subscribe(events.MustSubjects("ab").AnyRun(verb), func(m *nats.Msg) {
			id := events.MustSubjects("ab").RunIDFromSubject(m.Subject)
			if ch, ok := e.waiters.LoadAndDelete(id); ok {
				ch.(chan string) <- verb
			}
		})
		must(err)
	}
	must(nc.Flush())
	e.stop = func() {
		_ = st.Stop()
		svcConn.Close()
		nc.Close()
		ns.Shutdown()
		ns.WaitForShutdown()
		os.RemoveAll(dir)
	}
	return e
}

// run starts one run and waits for its terminal event.
func (e *env) run(ctx context.Context, scenario string) (time.Duration, error) {
	return e.start(ctx, client.RunRequest{Scenario: scenario})
}

func (e *env) runWorkflow(ctx context.Context, wf map[string]any) (time.Duration, error) {
	return e.start(ctx, client.RunRequest{Workflow: wf})
}

func latencyOf(ctx context.Context, n int, one func() (time.Duration, error)) ([]time.Duration, error) {
	for i := 0; i < 30; i++ {
		if _, err := one(); err != nil {
			return nil, err
		}
	}
	out := make([]time.Duration, 0, n)
	for i := 0; i < n; i++ {
		d, err := one()
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

func (e *env) start(ctx context.Context, req client.RunRequest) (time.Duration, error) {
	id := events.NewID()
	req.RunID = id
	ch := make(chan string, 1)
	e.waiters.Store(id, ch)
	t0 := time.Now()
	if _, err := e.c.Start(ctx, req); err != nil {
		return 0, err
	}
	select {
	case verb := <-ch:
		if verb != "completed" {
			return 0, fmt.Errorf("run %s %s", id, verb)
		}
		return time.Since(t0), nil
	case <-ctx.Done():
		return 0, fmt.Errorf("run %s: %w", id, ctx.Err())
	}
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(float64(len(s)-1)*p)]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// throughput runs total runs of scenario with concurrency in flight and
// returns runs per second; every run must complete or it returns an error.
func throughput(ctx context.Context, e *env, scenario string, total, concurrency int) (float64, error) {
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	t0 := time.Now()
	for i := 0; i < total; i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := e.run(ctx, scenario); err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(total) / time.Since(t0).Seconds(), nil
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// stats summarizes repeated measurements: median, min and max.
type stats struct{ med, lo, hi float64 }

func summarize(xs []float64) stats {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return stats{med: s[len(s)/2], lo: s[0], hi: s[len(s)-1]}
}

func (s stats) note(unit string) string {
	return fmt.Sprintf("median of reps; min %.3f, max %.3f %s", s.lo, s.hi, unit)
}

func main() {
	runs := flag.Int("runs", 300, "measured runs per latency figure and repetition")
	reps := flag.Int("reps", 5, "repetitions of every figure (the table shows medians)")
	total := flag.Int("total", 300, "single-action runs per throughput repetition (plans use a third)")
	concurrency := flag.Int("concurrency", 64, "runs in flight for throughput")
	memRuns := flag.Int("memory-runs", 10000, "runs in flight for the memory figure (0 skips it)")
	out := flag.String("out", "bench/results", "folder for the JSON figures")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		must(err)
		must(pprof.StartCPUProfile(f))
		defer pprof.StopCPUProfile()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var figs []Figure
	add := func(f Figure) {
		figs = append(figs, f)
		fmt.Fprintf(os.Stderr, "  %-58s %10.3f %s\n", f.Name, f.Value, f.Unit)
	}

	fmt.Fprintln(os.Stderr, "floor: bare JetStream request→result")
	var f1s, f10s []float64
	for r := 0; r < *reps; r++ {
		f1, f10 := floorRoundTrip(ctx, *runs)
		f1s, f10s = append(f1s, ms(f1)), append(f10s, ms(f10))
	}
	floor1, floor10 := summarize(f1s), summarize(f10s)
	add(Figure{Name: "floor: bare JetStream round trip p50", Value: floor1.med, Unit: "ms", Note: floor1.note("ms")})
	add(Figure{Name: "floor: 10-way fan-out p50", Value: floor10.med, Unit: "ms", Note: floor10.note("ms")})
	floorPerAction := (floor10.med - floor1.med) / 9

	fmt.Fprintln(os.Stderr, "latency (1 executor × 16 slots)")
	e := start(ctx, 1, 16)
	wf := client.NewWorkflow("chain").Step("s1", "bench.echo", map[string]any{"n": 1})
	for i := 2; i <= 5; i++ {
		wf.Step(fmt.Sprintf("s%d", i), "bench.echo", map[string]any{"n": client.FromStep(fmt.Sprintf("s%d", i-1), "/n")})
	}
	chain := wf.Build()
	p50s := map[string]float64{}
	for _, sc := range []struct {
		name, target string
		one          func() (time.Duration, error)
	}{
		{"latency: one action", "p50 ≤ 2 ms", func() (time.Duration, error) { return e.run(ctx, "one") }},
		{"latency: 10-action plan", "p50 ≤ 4 ms", func() (time.Duration, error) { return e.run(ctx, "plan10") }},
		{"latency: 5-step chained workflow", "p50 ≤ 5 ms", func() (time.Duration, error) { return e.runWorkflow(ctx, chain) }},
	} {
		var a, b, c []float64
		for r := 0; r < *reps; r++ {
			d, err := latencyOf(ctx, *runs, sc.one)
			must(err)
			a, b, c = append(a, ms(percentile(d, 0.5))), append(b, ms(percentile(d, 0.9))), append(c, ms(percentile(d, 0.99)))
		}
		p50 := summarize(a)
		p50s[sc.name] = p50.med
		add(Figure{Name: sc.name + " p50", Value: p50.med, Unit: "ms", Target: sc.target, Note: p50.note("ms")})
		add(Figure{Name: sc.name + " p90", Value: summarize(b).med, Unit: "ms"})
		add(Figure{Name: sc.name + " p99", Value: summarize(c).med, Unit: "ms"})
	}
	perAction := (p50s["latency: 10-action plan"] - p50s["latency: one action"]) / 9
	add(Figure{Name: "overhead: extra cost of one more plan action", Value: perAction, Unit: "ms"})
	add(Figure{Name: "overhead: ratio to the bare JetStream floor", Value: perAction / floorPerAction, Unit: "×", Target: "≤ 2×"})
	e.stop()

	for _, n := range []int{1, 2, 4} {
		fmt.Fprintf(os.Stderr, "throughput with %d executor(s) × 8 slots, %d runs in flight\n", n, *concurrency)
		e := start(ctx, n, 8)
		var plan, single, slow []float64
		for r := 0; r < *reps; r++ {
			x, err := throughput(ctx, e, "plan10", *total/3, *concurrency)
			must(err)
			plan = append(plan, x*10)
			x, err = throughput(ctx, e, "one", *total, *concurrency)
			must(err)
			single = append(single, x)
			x, err = throughput(ctx, e, "plan10slow", *total/5, *concurrency)
			must(err)
			slow = append(slow, x*10)
		}
		sp, ss, sl := summarize(plan), summarize(single), summarize(slow)
		add(Figure{Name: fmt.Sprintf("throughput: actions/s, 10-action plans, %d executor(s)", n), Value: sp.med, Unit: "actions/s",
			Target: map[bool]string{true: "≥ 5000"}[n == 4], Note: sp.note("")})
		add(Figure{Name: fmt.Sprintf("throughput: single-action runs/s, %d executor(s)", n), Value: ss.med, Unit: "runs/s",
			Target: map[bool]string{true: "≥ 1000"}[n == 4], Note: ss.note("")})
		add(Figure{Name: fmt.Sprintf("throughput: actions/s, 10 ms actions, %d executor(s)", n), Value: sl.med, Unit: "actions/s",
			Note: "I/O-bound scaling; " + sl.note("")})
		e.stop()
	}

	heap := ""
	if *memRuns > 0 {
		fmt.Fprintf(os.Stderr, "memory: dispatcher process with %d runs in flight\n", *memRuns)
		rss, top, err := memoryInFlight(ctx, *memRuns)
		must(err)
		add(Figure{Name: fmt.Sprintf("memory: dispatcher RSS, %d runs in flight", *memRuns), Value: rss, Unit: "MiB", Target: "< 100 MiB"})
		heap = top
	}

	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "\nactionbus bench — %s, %d CPUs, %s, %d repetitions\n\n", runtime.Version(), runtime.NumCPU(), time.Now().UTC().Format(time.RFC3339), *reps)
	fmt.Fprintln(tw, "FIGURE\tVALUE\tUNIT\tTARGET\tNOTE")
	for _, f := range figs {
		fmt.Fprintf(tw, "%s\t%.3f\t%s\t%s\t%s\n", f.Name, f.Value, f.Unit, f.Target, f.Note)
	}
	must(tw.Flush())
	if heap != "" {
		fmt.Printf("\ndispatcher top in-use heap with %d runs in flight:\n%s\n", *memRuns, heap)
	}
	must(os.MkdirAll(*out, 0o755))
	path := filepath.Join(*out, "bench-"+time.Now().UTC().Format("20060102T150405Z")+".json")
	b, _ := json.MarshalIndent(map[string]any{"go": runtime.Version(), "cpus": runtime.NumCPU(), "reps": *reps, "figures": figs, "heap": heap}, "", "  ")
	must(os.WriteFile(path, b, 0o644))
	fmt.Printf("\nfigures written to %s\n", path)
}
