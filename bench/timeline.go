package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/client"
)

// The timeline (-timeline) shows where a run's time goes on the deployed
// topology: it runs a workload's units one after another with known run
// ids, then reads back every message the runs stored, in every stream and
// bucket, with the server's timestamp of each, and prints for every stored
// write the median offset from the client's submit (and the client's own
// completion), in order. One clock: every process runs on this machine.

// timedRun is one run the timeline submitted.
type timedRun struct {
	id          string
	start, done time.Time
}

// stored is one stored message of a run.
type stored struct {
	label string
	at    time.Time
	size  int
}

func timeline(ctx context.Context, w io.Writer, d *deployment, runs int, profileDir string) {
	ab := actionbusSystem{c: d.c}
	units := []struct {
		name string
		req  func(i int) client.RunRequest
	}{
		{"W1 single", func(i int) client.RunRequest {
			return client.RunRequest{Action: &client.ActionCall{Name: "echo", Args: input(fmt.Sprint("tl", i), i)}}
		}},
		{"W2 fanout10", func(i int) client.RunRequest {
			wf := client.NewWorkflow("fanout")
			for k := range fanoutWidth {
				wf.Step(fmt.Sprintf("s%d", k), "echo", input(fmt.Sprint("tl", i), k))
			}
			return client.RunRequest{Workflow: wf.Build()}
		}},
		{"A1 agent", func(int) client.RunRequest { return client.RunRequest{Scenario: "a1", Prompt: "echo once"} }},
	}
	for _, u := range units {
		for i := range warmupRuns {
			_, err := ab.run(ctx, u.req(-1-i))
			must(err)
		}
		since := time.Now()
		var done []timedRun
		cpu0, msgs0, subs0 := d.cpu(), d.msgs(), d.subChanges()
		for i := range runs {
			req := u.req(i)
			t0 := time.Now()
			res, err := ab.run(ctx, req)
			must(err)
			done = append(done, timedRun{id: res.RunID, start: t0, done: time.Now()})
		}
		cpu1, msgs1, subs1 := d.cpu(), d.msgs(), d.subChanges()
		if profileDir != "" {
			// The services' CPU profiles while this workload's units run
			// one after another (9 s, the profile's 8 s inside).
			d.profile(filepath.Join(profileDir, strings.Fields(u.name)[0]), func() {
				for t0 := time.Now(); time.Since(t0) < 9*time.Second; {
					_, err := ab.run(ctx, u.req(0))
					must(err)
				}
			})
		}
		byRun := storedSince(ctx, d.adminJS, since)
		fmt.Fprintf(w, "\n%s: median offset of every stored write from the client's submit, %d runs\n", u.name, runs)
		printTimeline(w, done, byRun)
		printCPU(w, cpu0, cpu1, runs)
		printMsgs(w, msgs0, msgs1, runs)
		fmt.Fprintf(w, "subscriptions the server added or removed per run: %.1f\n", float64(subs1-subs0)/float64(runs))
	}
}

// printMsgs prints the messages each process sent to the server and
// received from it per run, between two readings ([deployment.msgs]):
// what the server routes for a run, besides what it stores.
func printMsgs(w io.Writer, before, after map[string]msgCount, runs int) {
	var in, out int64
	fmt.Fprintf(w, "messages per run, sent/received:")
	for _, n := range slices.Sorted(maps.Keys(after)) {
		di, do := after[n].in-before[n].in, after[n].out-before[n].out
		in, out = in+di, out+do
		fmt.Fprintf(w, " %s %.1f/%.1f,", n, float64(di)/float64(runs), float64(do)/float64(runs))
	}
	fmt.Fprintf(w, " total %.1f/%.1f\n", float64(in)/float64(runs), float64(out)/float64(runs))
}

// printCPU prints the CPU time each process used per run between two
// readings ([deployment.cpu]). Unlike latency, it hardly moves with what
// else the machine runs, so it shows what a change saves.
func printCPU(w io.Writer, before, after map[string]time.Duration, runs int) (totalMs float64) {
	names := slices.Sorted(maps.Keys(after))
	var total time.Duration
	fmt.Fprintf(w, "CPU per run:")
	for _, n := range names {
		used := after[n] - before[n]
		total += used
		fmt.Fprintf(w, " %s %.2f ms,", n, ms(used)/float64(runs))
	}
	fmt.Fprintf(w, " total %.2f ms\n", ms(total)/float64(runs))
	return ms(total) / float64(runs)
}

// storedSince reads every message stored since t in the deployment's
// streams (the floor's excluded) and groups them by run id.
func storedSince(ctx context.Context, js jetstream.JetStream, t time.Time) map[string][]stored {
	out := map[string][]stored{}
	var names []string
	for info := range js.ListStreams(ctx).Info() {
		if !strings.HasPrefix(info.Config.Name, "FLOOR_") {
			names = append(names, info.Config.Name)
		}
	}
	for _, name := range names {
		s, err := js.Stream(ctx, name)
		must(err)
		info, err := s.Info(ctx)
		must(err)
		if info.State.LastTime.Before(t) {
			continue
		}
		c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &t})
		must(err)
		// Up to the last message stored now: timers keep firing after.
		for done := false; !done; {
			batch, err := c.Fetch(1000, jetstream.FetchMaxWait(time.Second))
			must(err)
			n := 0
			for m := range batch.Messages() {
				n++
				md, err := m.Metadata()
				must(err)
				if runID := runOf(m); runID != "" {
					out[runID] = append(out[runID], stored{label: name + " " + kindOf(name, m), at: md.Timestamp, size: len(m.Data())})
				}
				if md.Sequence.Stream >= info.State.LastSeq {
					done = true
				}
			}
			if n == 0 {
				done = true
			}
		}
	}
	return out
}

// runOf is the run id a stored message belongs to: its CloudEvents runid
// extension, else the run id token of its subject (KV keys, audit).
func runOf(m jetstream.Msg) string {
	if id := m.Headers().Get("ce-runid"); id != "" {
		return id
	}
	for _, tok := range strings.Split(m.Subject(), ".") {
		if len(tok) == 26 { // a ULID
			return tok
		}
	}
	return ""
}

func kindOf(stream string, m jetstream.Msg) string {
	if t := m.Headers().Get("ce-type"); t != "" {
		return strings.TrimPrefix(t, "io.actionbus.")
	}
	if strings.HasPrefix(stream, "KV_") {
		return "write"
	}
	toks := strings.Split(m.Subject(), ".")
	return toks[len(toks)-1]
}

func printTimeline(w io.Writer, runs []timedRun, byRun map[string][]stored) {
	offsets := map[string][]float64{} // "label #k" -> offsets in ms
	sizes := map[string][]float64{}   // "label #k" -> bytes
	var ends []float64
	for _, r := range runs {
		ends = append(ends, ms(r.done.Sub(r.start)))
		msgs := byRun[r.id]
		sort.Slice(msgs, func(i, j int) bool { return msgs[i].at.Before(msgs[j].at) })
		seen := map[string]int{}
		for _, m := range msgs {
			seen[m.label]++
			key := fmt.Sprintf("%s #%d", m.label, seen[m.label])
			off := ms(m.at.Sub(r.start))
			offsets[key] = append(offsets[key], off)
			sizes[key] = append(sizes[key], float64(m.size))
		}
	}
	type row struct {
		key             string
		med, p90, bytes float64
		n               int
	}
	var rows []row
	for k, xs := range offsets {
		slices.Sort(xs)
		bs := sizes[k]
		slices.Sort(bs)
		rows = append(rows, row{k, xs[len(xs)/2], xs[min(len(xs)-1, len(xs)*9/10)], bs[len(bs)/2], len(xs)})
	}
	slices.Sort(ends)
	rows = append(rows, row{"client has the result", ends[len(ends)/2], ends[len(ends)*9/10], 0, len(ends)})
	sort.Slice(rows, func(i, j int) bool { return rows[i].med < rows[j].med })
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STORED WRITE\tMEDIAN ms\tp90 ms\tBYTES\tRUNS")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.0f\t%d\n", r.key, r.med, r.p90, r.bytes, r.n)
	}
	must(tw.Flush())
}
