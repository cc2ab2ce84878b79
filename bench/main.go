// Command bench is the harness of `make bench`: the workloads of
// BENCHMARKS.md (W1 single, W2 fanout10, W3 chain5, W4 throughput, A1
// agent) on the deployed topology — nats-server, the dispatcher, planner
// and auditor each its own process, two executor processes — beside the
// bare JetStream floor measured on the same server in the same run. It
// prints medians of the repetitions with min–max, each with its ratio to
// the floor, the messages stored per run in every stream, the auditor's
// share of W1, and (with -inprocess) the same workloads with everything in
// one process as `actionbus dev` runs it. Figures also go to
// bench/results/ as JSON.
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
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Figure is one measured number: the median of the repetitions.
type Figure struct {
	Name   string    `json:"name"`
	System string    `json:"system"`
	Value  float64   `json:"value"`
	Min    float64   `json:"min"`
	Max    float64   `json:"max"`
	Unit   string    `json:"unit"`
	Ratio  float64   `json:"ratioToFloor,omitempty"`
	Target string    `json:"target,omitempty"`
	Reps   []float64 `json:"reps,omitempty"`
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// series collects per-repetition values by figure name.
type series map[string][]float64

func (s series) add(name string, v float64) { s[name] = append(s[name], v) }

func median(xs []float64) (med, lo, hi float64) {
	s := slices.Clone(xs)
	sort.Float64s(s)
	return s[len(s)/2], s[0], s[len(s)-1]
}

// probes read a deployment while W4 runs, for the lines it prints: the
// messages through the server so far, and the CPU each process used so
// far (nil: not read).
type probes struct {
	serverMsgs func() int64
	cpu        func() map[string]time.Duration
}

// measureRep runs one repetition of W1–W4 (and A1 when agent is set)
// against s, in the order BENCHMARKS.md fixes, into out. writes, when set,
// counts the messages stored per run around each measured latency
// workload.
func measureRep(ctx context.Context, rep int, s system, agent func(context.Context) error, out series, writes func(workload string, runs int, fn func()), p probes) {
	name := fmt.Sprintf("r%d", rep)
	lat := func(workload string, n int, unit func(int) error) {
		_, err := latencies(0, warmupRuns, unit)
		must(err)
		var d []time.Duration
		run := func() { d, err = latencies(n, 0, unit) }
		if writes != nil {
			writes(workload, n, run)
		} else {
			run()
		}
		must(err)
		out.add(workload+" p50", ms(percentile(d, 50)))
		out.add(workload+" p90", ms(percentile(d, 90)))
		out.add(workload+" p99", ms(percentile(d, 99)))
	}
	lat("W1", w1Runs, w1(ctx, s, name+"w1"))
	lat("W2", w2Runs, w2(ctx, s, name+"w2"))
	lat("W3", w3Runs, w3(ctx, s, name+"w3"))
	_, err := closedLoop(w4Warmup, w4Workers, w1(ctx, s, name+"w4warm"))
	must(err)
	busy0, all0 := machineCPU()
	msgs, cpu := p.serverMsgs, p.cpu
	if msgs == nil {
		msgs = func() int64 { return 0 } // in process: not counted
	}
	if cpu == nil {
		cpu = func() map[string]time.Duration { return nil }
	}
	msgs0, cpu0 := msgs(), cpu()
	rps, err := closedLoop(w4Runs, w4Workers, w1(ctx, s, name+"w4"))
	must(err)
	busy1, all1 := machineCPU()
	msgs1, cpu1 := msgs(), cpu()
	out.add("W4 runs/s", rps)
	// Whether W4 is bound by the machine's CPU or by something else
	// (a bound on what is in flight, a wait), the messages a run crosses
	// the server with (sent to it and sent by it), and where the CPU went:
	// printed, not tabled.
	fmt.Fprintf(os.Stderr, "%s W4: %.0f runs/s, the machine's CPU %.0f %% busy, %.1f messages through the server per run\n",
		name, rps, 100*float64(busy1-busy0)/float64(max(all1-all0, 1)), float64(msgs1-msgs0)/w4Runs)
	if cpu1 != nil {
		fmt.Fprintf(os.Stderr, "%s W4 ", name)
		printCPU(os.Stderr, cpu0, cpu1, w4Runs)
	}
	if agent != nil {
		lat("A1", a1Runs, func(int) error { return agent(ctx) })
	}
}

// machineCPU reads the machine's busy and total CPU time (in clock ticks)
// from /proc/stat; zeros where there is none.
func machineCPU() (busy, total int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	for i, f := range strings.Fields(line)[1:] {
		v, _ := strconv.ParseInt(f, 10, 64)
		total += v
		if i != 3 && i != 4 { // idle and iowait
			busy += v
		}
	}
	return busy, total
}

// storedWrites counts messages stored per stream (KV buckets and the
// audit stream included) by last-sequence deltas, after the system has
// gone quiet on both sides.
type storedWrites struct {
	js      jetstream.JetStream
	perRun  map[string]map[string]float64 // workload -> stream -> writes per run
	skipPre string
}

func (w *storedWrites) seqs(ctx context.Context) map[string]uint64 {
	out := map[string]uint64{}
	for info := range w.js.ListStreams(ctx).Info() {
		if !strings.HasPrefix(info.Config.Name, w.skipPre) {
			out[info.Config.Name] = info.State.LastSeq
		}
	}
	return out
}

// quiet waits until no stream grows for half a second (the auditor and
// the outbox finish after the client has its result), at most 20 s.
func (w *storedWrites) quiet(ctx context.Context) map[string]uint64 {
	last := w.seqs(ctx)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond) // sampling the streams, not synchronizing
		now := w.seqs(ctx)
		if fmt.Sprint(now) == fmt.Sprint(last) {
			return now
		}
		last = now
	}
	return last
}

func (w *storedWrites) around(ctx context.Context) func(string, int, func()) {
	return func(workload string, runs int, fn func()) {
		before := w.quiet(ctx)
		fn()
		after := w.quiet(ctx)
		m := map[string]float64{}
		for name, seq := range after {
			if d := seq - before[name]; d > 0 {
				m[name] = float64(d) / float64(runs)
			}
		}
		if _, ok := w.perRun[workload]; !ok {
			w.perRun[workload] = m
		}
	}
}

// Targets of BENCHMARKS.md.
var targets = map[string]string{
	"W1 p50": "≤ 6× floor", "W2 p50": "≤ 3× floor", "W3 p50": "≤ 4× floor", "W4 runs/s": "≥ 0.3× floor",
}

// peers are BENCHMARKS.md's figures for the same workloads on the same
// kind of machine, for context only (not measured here).
const peers = `peers (BENCHMARKS.md, another sitting; compare ratios, not absolutes):
                 floor   Restate 1.7.12 (fsync)   Temporal 1.32.1 dev (tuned)
  W1 p50 ms      0.34    13.4                     ≈ 100 (18)
  W2 p50 ms      2.1     13.3                     ≈ 148 (40)
  W3 p50 ms      1.3     16.3                     ≈ 300 (55)
  W4 runs/s      4 690   400                      ≈ 63`

func main() {
	serveExec := flag.Bool("serve-executor", false, "run as the bench's executor process (used by the harness itself)")
	execID := flag.String("id", "", "executor id with -serve-executor")
	reps := flag.Int("reps", 3, "repetitions of every workload (tables show medians with min–max)")
	inProcess := flag.Bool("inprocess", false, "also measure W1–W4 with every service in the bench process (as actionbus dev runs)")
	memRuns := flag.Int("memory-runs", 10000, "runs in flight for the dispatcher memory figure (0 skips it)")
	profileDir := flag.String("profile", "", "write CPU profiles of every service under W4 load (with -timeline: during each workload's sequential runs) to this folder")
	out := flag.String("out", "bench/results", "folder for the JSON figures")
	timelineRuns := flag.Int("timeline", 0, "instead of the workloads, run this many W1, W2 and A1 runs and print the median time of each of their stored writes")
	flag.Parse()
	if *serveExec {
		os.Exit(serveExecutor(*execID))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()

	bins, err := os.MkdirTemp("", "actionbus-bench-bin-")
	must(err)
	defer os.RemoveAll(bins)
	fmt.Fprintln(os.Stderr, "building nats-server and the services")
	buildBinaries(bins)

	fmt.Fprintln(os.Stderr, "deploying: nats-server, provision, dispatcher, planner, auditor, 2 executors")
	d := deploy(ctx, bins)
	defer d.stop()
	if *timelineRuns > 0 {
		timeline(ctx, os.Stdout, d, *timelineRuns, *profileDir)
		return
	}
	fl := startFloor(ctx, d.url("admin"))
	defer fl.stop()
	ab := actionbusSystem{c: d.c}
	w := &storedWrites{js: d.adminJS, perRun: map[string]map[string]float64{}, skipPre: "FLOOR_"}

	floorS, abS, offS := series{}, series{}, series{}
	for r := 0; r < *reps; r++ {
		fmt.Fprintf(os.Stderr, "repetition %d/%d: floor\n", r+1, *reps)
		measureRep(ctx, r, fl, nil, floorS, nil, probes{serverMsgs: d.serverMsgs, cpu: d.cpu})
		fmt.Fprintf(os.Stderr, "repetition %d/%d: actionbus deployed\n", r+1, *reps)
		var count func(string, int, func())
		if r == 0 {
			count = w.around(ctx)
		}
		measureRep(ctx, r, ab, ab.agent, abS, count, probes{serverMsgs: d.serverMsgs, cpu: d.cpu})
		// The auditor's share: W1 with the auditor and, right after, W1
		// with it stopped, so that both see the same machine (its load
		// moves by tens of percent within minutes); the auditor catches up
		// before the next repetition.
		fmt.Fprintf(os.Stderr, "repetition %d/%d: W1 with the auditor, then without\n", r+1, *reps)
		on, err := latencies(w1Runs, warmupRuns, w1(ctx, ab, fmt.Sprintf("on%d", r)))
		must(err)
		d.stopAuditor()
		off, err := latencies(w1Runs, warmupRuns, w1(ctx, ab, fmt.Sprintf("off%d", r)))
		must(err)
		offS.add("W1 p50 on", ms(percentile(on, 50)))
		offS.add("W1 p50", ms(percentile(off, 50)))
		d.startAuditor()
		w.quiet(ctx)
	}
	if *profileDir != "" {
		fmt.Fprintf(os.Stderr, "profiling every service under W4 load into %s\n", *profileDir)
		d.profile(*profileDir, func() {
			for t0 := time.Now(); time.Since(t0) < 9*time.Second; {
				_, err := closedLoop(w4Runs, w4Workers, w1(ctx, ab, "prof"))
				must(err)
			}
		})
	}

	var figs []Figure
	names := []string{"W1 p50", "W1 p90", "W1 p99", "W2 p50", "W2 p90", "W2 p99", "W3 p50", "W3 p90", "W3 p99", "W4 runs/s", "A1 p50", "A1 p90", "A1 p99"}
	for _, n := range names {
		unit := "ms"
		if strings.HasSuffix(n, "runs/s") {
			unit = "runs/s"
		}
		var fmed float64
		if xs, ok := floorS[n]; ok {
			m, lo, hi := median(xs)
			fmed = m
			figs = append(figs, Figure{Name: n, System: "floor", Value: m, Min: lo, Max: hi, Unit: unit, Reps: xs})
		}
		m, lo, hi := median(abS[n])
		f := Figure{Name: n, System: "deployed", Value: m, Min: lo, Max: hi, Unit: unit, Target: targets[n], Reps: abS[n]}
		if fmed > 0 {
			f.Ratio = m / fmed
		}
		figs = append(figs, f)
	}
	offMed, offLo, offHi := median(offS["W1 p50"])
	figs = append(figs, Figure{Name: "W1 p50", System: "deployed, auditor off", Value: offMed, Min: offLo, Max: offHi, Unit: "ms", Reps: offS["W1 p50"]})
	var shares []float64
	for r, off := range offS["W1 p50"] {
		shares = append(shares, 100*(offS["W1 p50 on"][r]/off-1))
	}
	shMed, shLo, shHi := median(shares)
	figs = append(figs, Figure{Name: "auditor's share of W1 p50", System: "deployed", Value: shMed, Min: shLo, Max: shHi, Unit: "%", Target: "≤ 25 %", Reps: shares})
	for _, wl := range []string{"W1", "W2", "W3", "A1"} {
		total := 0.0
		for _, v := range w.perRun[wl] {
			total += v
		}
		target := map[string]string{"W1": "≤ 8", "A1": "≤ 14"}[wl]
		figs = append(figs, Figure{Name: wl + " stored writes per run", System: "deployed", Value: total, Unit: "messages", Target: target})
	}

	var inproc []Figure
	if *inProcess {
		fmt.Fprintln(os.Stderr, "actionbus in one process (actionbus dev)")
		inproc = measureInProcess(ctx, *reps)
	}
	heap := ""
	if *memRuns > 0 {
		fmt.Fprintf(os.Stderr, "memory: dispatcher process with %d runs in flight\n", *memRuns)
		rss, top, err := memoryInFlight(ctx, *memRuns)
		must(err)
		figs = append(figs, Figure{Name: fmt.Sprintf("dispatcher RSS, %d runs in flight", *memRuns), System: "dispatcher process", Value: rss, Unit: "MiB", Target: "< 100 MiB"})
		heap = top
	}

	report(os.Stdout, *reps, figs, w.perRun, inproc)
	if heap != "" {
		fmt.Printf("\ndispatcher top in-use heap with %d runs in flight:\n%s\n", *memRuns, heap)
	}
	must(os.MkdirAll(*out, 0o755))
	path := filepath.Join(*out, "bench-"+time.Now().UTC().Format("20060102T150405Z")+".json")
	b, _ := json.MarshalIndent(map[string]any{
		"go": runtime.Version(), "cpus": runtime.NumCPU(), "reps": *reps, "topology": "deployed: nats-server, dispatcher, planner, auditor, 2 executors as processes",
		"figures": figs, "storedWritesPerRun": w.perRun, "inProcess": inproc, "heap": heap,
	}, "", "  ")
	must(os.WriteFile(path, b, 0o644))
	fmt.Printf("\nfigures written to %s\n", path)
}

func report(o *os.File, reps int, figs []Figure, perRun map[string]map[string]float64, inproc []Figure) {
	tw := tabwriter.NewWriter(o, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "\nactionbus bench — %s, %d CPUs, %s, medians of %d repetitions (min–max)\n", runtime.Version(), runtime.NumCPU(), time.Now().UTC().Format(time.RFC3339), reps)
	fmt.Fprintln(tw, "deployed topology: nats-server (file storage, default sync), dispatcher, planner, auditor, 2 executors, each its own process; client in the bench")
	fmt.Fprintf(tw, "dispatcher --max-plan-parallel=%d (W2's ten actions run at once, as the workload allows)\n", fanoutWidth)
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "WORKLOAD\tFLOOR\tACTIONBUS\tRATIO\tTARGET")
	floorOf := map[string]Figure{}
	for _, f := range figs {
		if f.System == "floor" {
			floorOf[f.Name] = f
		}
	}
	for _, f := range figs {
		if f.System != "deployed" || f.Unit == "messages" || f.Unit == "%" {
			continue
		}
		fl := "—"
		if x, ok := floorOf[f.Name]; ok {
			fl = fmt.Sprintf("%.2f (%.2f–%.2f)", x.Value, x.Min, x.Max)
		}
		ratio := "—"
		if f.Ratio > 0 {
			ratio = fmt.Sprintf("%.2f×", f.Ratio)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2f (%.2f–%.2f)\t%s\t%s\n", f.Name, fl, f.Value, f.Min, f.Max, ratio, f.Target)
	}
	fmt.Fprintln(tw)
	for _, f := range figs {
		if f.System == "deployed, auditor off" || f.Unit == "%" || f.System == "dispatcher process" {
			spread := ""
			if len(f.Reps) > 1 {
				spread = fmt.Sprintf(" (%.2f–%.2f)", f.Min, f.Max)
			}
			fmt.Fprintf(tw, "%s (%s)\t%.2f %s%s\t%s\n", f.Name, f.System, f.Value, f.Unit, spread, f.Target)
		}
	}
	must(tw.Flush())

	fmt.Fprintln(o, "\nstored writes per run (messages, from stream last-sequence deltas)")
	tw = tabwriter.NewWriter(o, 0, 4, 2, ' ', 0)
	streams := map[string]bool{}
	for _, m := range perRun {
		for s := range m {
			streams[s] = true
		}
	}
	cols := slices.Sorted(func(yield func(string) bool) {
		for s := range streams {
			if !yield(s) {
				return
			}
		}
	})
	fmt.Fprintf(tw, "WORKLOAD\t%s\tTOTAL\tTARGET\n", strings.Join(cols, "\t"))
	for _, wl := range []string{"W1", "W2", "W3", "A1"} {
		total := 0.0
		var cells []string
		for _, s := range cols {
			v := perRun[wl][s]
			total += v
			cells = append(cells, fmt.Sprintf("%.1f", v))
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%s\n", wl, strings.Join(cells, "\t"), total, map[string]string{"W1": "≤ 8", "A1": "≤ 14"}[wl])
	}
	must(tw.Flush())

	if len(inproc) > 0 {
		fmt.Fprintln(o, "\nin one process (actionbus dev: embedded server, every service in the bench process)")
		tw = tabwriter.NewWriter(o, 0, 4, 2, ' ', 0)
		for _, f := range inproc {
			fmt.Fprintf(tw, "%s\t%.2f (%.2f–%.2f)\t%s\n", f.Name, f.Value, f.Min, f.Max, f.Unit)
		}
		must(tw.Flush())
	}
	fmt.Fprintln(o)
	fmt.Fprintln(o, peers)
}
