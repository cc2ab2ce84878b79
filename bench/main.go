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
	"maps"
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

	"github.com/actionbus/actionbus/internal/bus"
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
	msgs       func() map[string]msgCount // per process
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
	msgs, cpu, perProc := p.serverMsgs, p.cpu, p.msgs
	if msgs == nil {
		msgs = func() int64 { return 0 } // in process: not counted
	}
	if cpu == nil {
		cpu = func() map[string]time.Duration { return nil }
	}
	if perProc == nil {
		perProc = func() map[string]msgCount { return nil }
	}
	msgs0, cpu0, proc0 := msgs(), cpu(), perProc()
	rps, err := closedLoop(w4Runs, w4Workers, w1(ctx, s, name+"w4"))
	must(err)
	busy1, all1 := machineCPU()
	msgs1, cpu1, proc1 := msgs(), cpu(), perProc()
	out.add("W4 runs/s", rps)
	// Whether W4 is bound by the machine's CPU or by something else
	// (a bound on what is in flight, a wait), the messages a run crosses
	// the server with (received and sent by it, its /varz), and where the
	// CPU and the messages went, per process.
	perRun := float64(msgs1-msgs0) / w4Runs
	fmt.Fprintf(os.Stderr, "%s W4: %.0f runs/s, the machine's CPU %.0f %% busy, %.1f messages through the server per run\n",
		name, rps, 100*float64(busy1-busy0)/float64(max(all1-all0, 1)), perRun)
	if p.serverMsgs != nil {
		out.add("W4 messages per run", perRun)
	}
	if proc1 != nil {
		fmt.Fprintf(os.Stderr, "%s W4 ", name)
		printMsgs(os.Stderr, proc0, proc1, w4Runs)
	}
	if cpu1 != nil {
		fmt.Fprintf(os.Stderr, "%s W4 ", name)
		out.add("W4 CPU per run", printCPU(os.Stderr, cpu0, cpu1, w4Runs))
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
// the outbox finish after the client has its result) and the auditor's
// consumers have had everything acknowledged (after W4 at the server's default
// sync the auditor is thousands of events behind and catches up in
// pauses longer than that: its appends then would be counted as the next
// workload's), at most quietFor; it says so when that runs out.
func (w *storedWrites) quiet(ctx context.Context) map[string]uint64 {
	last := w.seqs(ctx)
	deadline := time.Now().Add(quietFor)
	for time.Now().Before(deadline) {
		time.Sleep(500 * time.Millisecond) // sampling the streams, not synchronizing
		now := w.seqs(ctx)
		if fmt.Sprint(now) == fmt.Sprint(last) && w.auditorPending(ctx) == 0 {
			return now
		}
		last = now
	}
	fmt.Fprintf(os.Stderr, "stored writes: the system did not go quiet within %s; the next counts include what was still being written\n", quietFor)
	return last
}

// auditorConsumers are the auditor's durable consumers.
var auditorConsumers = map[string]bool{bus.ConsumerAuditorRuns: true, bus.ConsumerAuditorRequests: true,
	bus.ConsumerAuditorWork: true, bus.ConsumerAuditorRejected: true, bus.ConsumerAuditorTimers: true}

// quietFor bounds storedWrites.quiet.
const quietFor = 2 * time.Minute

// auditorPending is how many stored messages the auditor's consumers
// have not yet delivered or had acknowledged: the auditor pulls
// thousands at once and acknowledges them by position once appended, at
// most every AckEvery (a consumer that cannot be read counts as one).
func (w *storedWrites) auditorPending(ctx context.Context) uint64 {
	var pending uint64
	for _, spec := range (bus.Topology{}).Consumers() {
		if !auditorConsumers[spec.Config.Durable] {
			continue
		}
		c, err := w.js.Consumer(ctx, spec.Stream, spec.Config.Durable)
		if err != nil {
			return 1
		}
		info, err := c.Info(ctx)
		if err != nil {
			return 1
		}
		pending += info.NumPending + uint64(info.NumAckPending)
	}
	return pending
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

// Targets of BENCHMARKS.md: ratios to the floor measured in the same run.
var targets = map[string]string{
	"W1 p50": "≤ 4× floor", "W2 p50": "≤ 3× floor", "W3 p50": "≤ 3× floor", "W4 runs/s": "≥ 0.3× floor",
}

// Per-run targets of BENCHMARKS.md.
var (
	writesTarget = map[string]string{"W1": "≤ 5", "A1": "≤ 10"}
	w4Targets    = map[string]string{"W4 messages per run": "≤ 20", "W4 CPU per run": "≤ 1.0 ms"}
)

const auditorShareTarget = "≤ 15 %"

// restate holds Restate 1.7.12's medians from BENCHMARKS.md (fsync per
// write, its only mode; measured in another sitting on the same kind of
// machine), the figures the -sync always table is set against, with the
// targets: ahead on all four, W2 and W3 at most 0.8× its p50, W4 at least
// 1.5× its runs/s.
var restate = []struct {
	name   string
	value  float64
	target float64 // the ratio to reach: at most (latency) or at least (runs/s)
}{
	{"W1 p50", 12.8, 1}, {"W2 p50", 16.5, 0.8}, {"W3 p50", 23.6, 0.8}, {"W4 runs/s", 291, 1.5},
}

// peers are BENCHMARKS.md's figures for the same workloads on the same
// kind of machine, for context only (not measured here).
const peers = `peers (BENCHMARKS.md, 2026-12-02, another sitting; compare ratios, not absolutes):
                 floor (default sync / fsync)   Restate 1.7.12 (fsync)   Temporal 1.32.1 dev (tuned)
  W1 p50 ms      0.19–0.25 / 1.55               12.8–15.8                ≈ 100 (18)
  W2 p50 ms      1.64–1.67 / 9.7                16.5–17.8                ≈ 148 (40)
  W3 p50 ms      0.94–0.97 / 7.5                23.6–23.9                ≈ 300 (55)
  W4 runs/s      6 200–6 290 / 905              291–324                  ≈ 63`

// modeResult is what one sync mode measured.
type modeResult struct {
	syncAlways bool
	figs       []Figure
	perRun     map[string]map[string]float64 // workload -> stream -> writes per run
}

func (m *modeResult) label() string {
	if m.syncAlways {
		return "fsync per write (sync_interval: always)"
	}
	return "the server's default sync"
}

func main() {
	serveExec := flag.Bool("serve-executor", false, "run as the bench's executor process (used by the harness itself)")
	execID := flag.String("id", "", "executor id with -serve-executor")
	reps := flag.Int("reps", 3, "repetitions of every workload (tables show medians with min–max)")
	syncMode := flag.String("sync", "both", "the server's sync: default (its own interval), always (fsync per write, as Restate and the deploy/nats cluster run) or both, each on a fresh deployment")
	inProcess := flag.Bool("inprocess", false, "also measure W1–W4 with every service in the bench process (as actionbus dev runs)")
	memRuns := flag.Int("memory-runs", 10000, "runs in flight for the dispatcher memory figure (0 skips it)")
	profileDir := flag.String("profile", "", "write CPU profiles of every service under W4 load (with -timeline: during each workload's sequential runs) to this folder")
	out := flag.String("out", "bench/results", "folder for the JSON figures")
	sweep := flag.Bool("sweep", true, "also measure W4 with 1, 2 and 4 partitions and dispatcher processes (throughput and state-write conflicts)")
	timelineRuns := flag.Int("timeline", 0, "instead of the workloads, run this many W1, W2 and A1 runs and print the median time of each of their stored writes")
	flag.Parse()
	if *serveExec {
		os.Exit(serveExecutor(*execID))
	}
	var modes []bool
	switch *syncMode {
	case "default":
		modes = []bool{false}
	case "always":
		modes = []bool{true}
	case "both":
		modes = []bool{false, true}
	default:
		must(fmt.Errorf("-sync must be default, always or both, not %q", *syncMode))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()

	bins, err := os.MkdirTemp("", "actionbus-bench-bin-")
	must(err)
	defer os.RemoveAll(bins)
	fmt.Fprintln(os.Stderr, "building nats-server and the services")
	buildBinaries(bins)

	if *timelineRuns > 0 {
		fmt.Fprintln(os.Stderr, "deploying: nats-server, provision, dispatcher, planner, auditor, 2 executors")
		d := deploy(ctx, bins, modes[0])
		defer d.stop()
		timeline(ctx, os.Stdout, d, *timelineRuns, *profileDir)
		return
	}
	var results []*modeResult
	for i, syncAlways := range modes {
		profile := ""
		if i == 0 {
			profile = *profileDir
		}
		results = append(results, measureMode(ctx, bins, syncAlways, *reps, profile))
	}

	var sweepPts []sweepPoint
	if *sweep {
		sweepPts = sweepDispatchers(ctx, bins, []int{1, 2, 4}, *reps)
	}
	var inproc []Figure
	if *inProcess {
		fmt.Fprintln(os.Stderr, "actionbus in one process (actionbus dev)")
		inproc = measureInProcess(ctx, *reps)
	}
	var memory []Figure
	heap := ""
	if *memRuns > 0 {
		fmt.Fprintf(os.Stderr, "memory: dispatcher process with %d runs in flight\n", *memRuns)
		rss, top, err := memoryInFlight(ctx, *memRuns)
		must(err)
		memory = append(memory, Figure{Name: fmt.Sprintf("dispatcher RSS, %d runs in flight", *memRuns), System: "dispatcher process", Value: rss, Unit: "MiB", Target: "< 100 MiB"})
		heap = top
	}

	for _, r := range results {
		report(os.Stdout, *reps, r)
	}
	reportRestate(os.Stdout, results)
	if len(sweepPts) > 0 {
		reportSweep(os.Stdout, sweepPts)
	}
	if len(inproc) > 0 {
		fmt.Fprintln(os.Stdout, "\nin one process (actionbus dev: embedded server, every service in the bench process)")
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		for _, f := range inproc {
			fmt.Fprintf(tw, "%s\t%.2f (%.2f–%.2f)\t%s\n", f.Name, f.Value, f.Min, f.Max, f.Unit)
		}
		must(tw.Flush())
	}
	for _, f := range memory {
		fmt.Printf("\n%s (%s): %.2f %s, target %s\n", f.Name, f.System, f.Value, f.Unit, f.Target)
	}
	fmt.Println()
	fmt.Println(peers)
	if heap != "" {
		fmt.Printf("\ndispatcher top in-use heap with %d runs in flight:\n%s\n", *memRuns, heap)
	}
	must(os.MkdirAll(*out, 0o755))
	path := filepath.Join(*out, "bench-"+time.Now().UTC().Format("20060102T150405Z")+".json")
	modesJSON := map[string]any{}
	for _, r := range results {
		key := "defaultSync"
		if r.syncAlways {
			key = "syncAlways"
		}
		modesJSON[key] = map[string]any{"figures": r.figs, "storedWritesPerRun": r.perRun}
	}
	b, _ := json.MarshalIndent(map[string]any{
		"go": runtime.Version(), "cpus": runtime.NumCPU(), "reps": *reps, "topology": "deployed: nats-server, dispatcher, planner, auditor, 2 executors as processes",
		"modes": modesJSON, "inProcess": inproc, "memory": memory, "heap": heap, "dispatchersSweep": sweepFigures(sweepPts),
	}, "", "  ")
	must(os.WriteFile(path, b, 0o644))
	fmt.Printf("\nfigures written to %s\n", path)
}

// measureMode deploys the topology on a fresh server (fsync per write with
// syncAlways) and measures every workload reps times beside the floor on
// the same server.
func measureMode(ctx context.Context, bins string, syncAlways bool, reps int, profileDir string) *modeResult {
	res := &modeResult{syncAlways: syncAlways}
	fmt.Fprintf(os.Stderr, "deploying (%s): nats-server, provision, dispatcher, planner, auditor, 2 executors\n", res.label())
	d := deploy(ctx, bins, syncAlways)
	defer d.stop()
	fl := startFloor(ctx, d.url("admin"))
	defer fl.stop()
	ab := actionbusSystem{c: d.c}
	w := &storedWrites{js: d.adminJS, perRun: map[string]map[string]float64{}, skipPre: "FLOOR_"}
	p := probes{serverMsgs: d.serverMsgs, cpu: d.cpu, msgs: d.msgs}

	floorS, abS, offS := series{}, series{}, series{}
	for r := 0; r < reps; r++ {
		fmt.Fprintf(os.Stderr, "repetition %d/%d: floor\n", r+1, reps)
		measureRep(ctx, r, fl, nil, floorS, nil, p)
		fmt.Fprintf(os.Stderr, "repetition %d/%d: actionbus deployed\n", r+1, reps)
		var count func(string, int, func())
		if r == 0 {
			count = w.around(ctx)
		}
		measureRep(ctx, r, ab, ab.agent, abS, count, p)
		// The auditor's share: W1 with the auditor and, right after, W1
		// with it stopped, so that both see the same machine (its load
		// moves by tens of percent within minutes); the auditor catches up
		// before the next repetition.
		fmt.Fprintf(os.Stderr, "repetition %d/%d: W1 with the auditor, then without\n", r+1, reps)
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
	if profileDir != "" {
		fmt.Fprintf(os.Stderr, "profiling every service under W4 load into %s\n", profileDir)
		d.profile(profileDir, func() {
			for t0 := time.Now(); time.Since(t0) < 9*time.Second; {
				_, err := closedLoop(w4Runs, w4Workers, w1(ctx, ab, "prof"))
				must(err)
			}
		})
	}

	names := []string{"W1 p50", "W1 p90", "W1 p99", "W2 p50", "W2 p90", "W2 p99", "W3 p50", "W3 p90", "W3 p99", "W4 runs/s", "A1 p50", "A1 p90", "A1 p99",
		"W4 messages per run", "W4 CPU per run"}
	for _, n := range names {
		unit := "ms"
		switch {
		case strings.HasSuffix(n, "runs/s"):
			unit = "runs/s"
		case strings.HasSuffix(n, "messages per run"):
			unit = "messages"
		}
		var fmed float64
		if xs, ok := floorS[n]; ok {
			m, lo, hi := median(xs)
			fmed = m
			res.figs = append(res.figs, Figure{Name: n, System: "floor", Value: m, Min: lo, Max: hi, Unit: unit, Reps: xs})
		}
		m, lo, hi := median(abS[n])
		target := targets[n]
		if t, ok := w4Targets[n]; ok {
			target = t
		}
		f := Figure{Name: n, System: "deployed", Value: m, Min: lo, Max: hi, Unit: unit, Target: target, Reps: abS[n]}
		if fmed > 0 {
			f.Ratio = m / fmed
		}
		res.figs = append(res.figs, f)
	}
	offMed, offLo, offHi := median(offS["W1 p50"])
	res.figs = append(res.figs, Figure{Name: "W1 p50", System: "deployed, auditor off", Value: offMed, Min: offLo, Max: offHi, Unit: "ms", Reps: offS["W1 p50"]})
	var shares []float64
	for r, off := range offS["W1 p50"] {
		shares = append(shares, 100*(offS["W1 p50 on"][r]/off-1))
	}
	shMed, shLo, shHi := median(shares)
	res.figs = append(res.figs, Figure{Name: "auditor's share of W1 p50", System: "deployed", Value: shMed, Min: shLo, Max: shHi, Unit: "%", Target: auditorShareTarget, Reps: shares})
	for _, wl := range []string{"W1", "W2", "W3", "A1"} {
		total := 0.0
		for _, v := range w.perRun[wl] {
			total += v
		}
		res.figs = append(res.figs, Figure{Name: wl + " stored writes per run", System: "deployed", Value: total, Unit: "writes", Target: writesTarget[wl]})
	}
	res.perRun = w.perRun
	return res
}

func report(o *os.File, reps int, r *modeResult) {
	tw := tabwriter.NewWriter(o, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "\nactionbus bench — %s, %d CPUs, %s, medians of %d repetitions (min–max)\n", runtime.Version(), runtime.NumCPU(), time.Now().UTC().Format(time.RFC3339), reps)
	fmt.Fprintf(tw, "deployed topology: nats-server (file storage, %s), dispatcher, planner, auditor, 2 executors, each its own process; client in the bench\n", r.label())
	fmt.Fprintf(tw, "dispatcher --max-plan-parallel=%d (W2's ten actions run at once, as the workload allows)\n", fanoutWidth)
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "WORKLOAD\tFLOOR\tACTIONBUS\tRATIO\tTARGET")
	floorOf := map[string]Figure{}
	for _, f := range r.figs {
		if f.System == "floor" {
			floorOf[f.Name] = f
		}
	}
	for _, f := range r.figs {
		if f.System != "deployed" || f.Unit == "writes" || f.Unit == "%" {
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
	for _, f := range r.figs {
		if f.System == "deployed, auditor off" || f.Unit == "%" {
			spread := ""
			if len(f.Reps) > 1 {
				spread = fmt.Sprintf(" (%.2f–%.2f)", f.Min, f.Max)
			}
			fmt.Fprintf(tw, "%s (%s)\t%.2f %s%s\t%s\n", f.Name, f.System, f.Value, f.Unit, spread, f.Target)
		}
	}
	must(tw.Flush())

	fmt.Fprintf(o, "\nstored writes per run (messages, from stream last-sequence deltas; with fsync per write, each is an fsync)\n")
	tw = tabwriter.NewWriter(o, 0, 4, 2, ' ', 0)
	streams := map[string]bool{}
	for _, m := range r.perRun {
		for s := range m {
			streams[s] = true
		}
	}
	cols := slices.Sorted(maps.Keys(streams))
	fmt.Fprintf(tw, "WORKLOAD\t%s\tTOTAL\tTARGET\n", strings.Join(cols, "\t"))
	for _, wl := range []string{"W1", "W2", "W3", "A1"} {
		total := 0.0
		var cells []string
		for _, s := range cols {
			v := r.perRun[wl][s]
			total += v
			cells = append(cells, fmt.Sprintf("%.1f", v))
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%s\n", wl, strings.Join(cells, "\t"), total, writesTarget[wl])
	}
	must(tw.Flush())
}

// reportRestate sets the -sync always figures beside Restate's (fsync per
// write, its own durability) with BENCHMARKS.md's targets.
func reportRestate(o *os.File, results []*modeResult) {
	for _, r := range results {
		if !r.syncAlways {
			continue
		}
		fmt.Fprintln(o, "\nwith fsync per write, beside Restate 1.7.12 (BENCHMARKS.md's figures, another sitting)")
		tw := tabwriter.NewWriter(o, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "WORKLOAD\tRESTATE\tACTIONBUS\tRATIO\tTARGET")
		for _, p := range restate {
			for _, f := range r.figs {
				if f.System != "deployed" || f.Name != p.name {
					continue
				}
				op := "≤"
				if f.Unit == "runs/s" {
					op = "≥"
				}
				fmt.Fprintf(tw, "%s\t%.1f\t%.2f (%.2f–%.2f)\t%.2f×\t%s %.1f× Restate\n", p.name, p.value, f.Value, f.Min, f.Max, f.Value/p.value, op, p.target)
			}
		}
		must(tw.Flush())
	}
}
