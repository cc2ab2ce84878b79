package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
)

// sweepPoint is W4 with the runs spread over n partitions, each served
// by one of n dispatcher processes.
type sweepPoint struct {
	dispatchers int
	runsPerSec  []float64
	// conflicts are run state writes refused by their revision check
	// (each logged by its dispatcher), per 1 000 runs.
	conflicts []float64
}

// sweepDispatchers measures W4 on a fresh deployment (the server's default
// sync) for each count of partitions and dispatchers: the throughput and
// the state-write conflicts per 1 000 runs. On a machine of few cores the
// throughput cannot grow with dispatchers (they share the CPU with the
// server); what the sweep shows is the partitions' cost and that
// conflicts stay at zero.
func sweepDispatchers(ctx context.Context, bins string, counts []int, reps int) []sweepPoint {
	var out []sweepPoint
	for _, n := range counts {
		fmt.Fprintf(os.Stderr, "dispatchers sweep: %d partitions, %d dispatcher processes\n", n, n)
		d := deployDispatchers(ctx, bins, false, n)
		ab := actionbusSystem{c: d.c}
		pt := sweepPoint{dispatchers: n}
		_, err := closedLoop(w4Warmup, w4Workers, w1(ctx, ab, fmt.Sprintf("sweep%dwarm", n)))
		must(err)
		for r := range reps {
			before := d.logLines("dispatcher", `"msg":"run state write conflict"`)
			rps, err := closedLoop(w4Runs, w4Workers, w1(ctx, ab, fmt.Sprintf("sweep%d-%d", n, r)))
			must(err)
			after := d.logLines("dispatcher", `"msg":"run state write conflict"`)
			pt.runsPerSec = append(pt.runsPerSec, rps)
			pt.conflicts = append(pt.conflicts, float64(after-before)*1000/w4Runs)
		}
		d.stop()
		out = append(out, pt)
	}
	return out
}

func reportSweep(o io.Writer, pts []sweepPoint) {
	fmt.Fprintln(o, "\ndispatchers sweep: W4 (default sync) with the runs over N partitions and N dispatcher processes, medians (min–max)")
	tw := tabwriter.NewWriter(o, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DISPATCHERS\tW4 RUNS/S\tSTATE-WRITE CONFLICTS PER 1 000 RUNS")
	for _, p := range pts {
		m, lo, hi := median(p.runsPerSec)
		c, clo, chi := median(p.conflicts)
		fmt.Fprintf(tw, "%d\t%.0f (%.0f–%.0f)\t%.1f (%.1f–%.1f)\n", p.dispatchers, m, lo, hi, c, clo, chi)
	}
	must(tw.Flush())
}

// sweepFigures are the sweep's figures for the JSON results.
func sweepFigures(pts []sweepPoint) []Figure {
	var out []Figure
	for _, p := range pts {
		system := fmt.Sprintf("%d partitions, %d dispatchers", p.dispatchers, p.dispatchers)
		m, lo, hi := median(p.runsPerSec)
		out = append(out, Figure{Name: "W4 runs/s", System: system, Value: m, Min: lo, Max: hi, Unit: "runs/s", Reps: p.runsPerSec})
		c, clo, chi := median(p.conflicts)
		out = append(out, Figure{Name: "run state write conflicts per 1 000 runs", System: system, Value: c, Min: clo, Max: chi, Unit: "conflicts", Reps: p.conflicts})
	}
	return out
}
