package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/run"
)

// runsCmd lists runs from the run-state bucket, and the runs that are in
// no bucket (admitted unstored: see dispatch.UnstoredRuns) from their
// requests and ends. Run state holds each run's secret id key, so only an
// operator's user (admin, or the dispatcher's) can read it: the client
// user is refused.
func runsCmd(g *globals) *cobra.Command {
	var statuses, kinds []string
	var user, tenant string
	var maxAge time.Duration
	var limit int
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "List runs: status, kind, age and what each waits for (reads the run-state bucket; needs an operator's user)",
		RunE: g.withJetStream(func(cmd *cobra.Command, _ []string, js jetstream.JetStream) error {
			ctx := cmd.Context()
			topo := bus.Topology{Prefix: g.prefix}
			kv, err := js.KeyValue(ctx, topo.BucketRuns())
			if err != nil {
				return fmt.Errorf("runs: the run-state bucket: %w", err)
			}
			f := run.Filter{UserID: user, Tenant: tenant, MaxAge: maxAge}
			for _, s := range statuses {
				f.Statuses = append(f.Statuses, run.Status(s))
			}
			for _, k := range kinds {
				f.Kinds = append(f.Kinds, run.Kind(k))
			}
			keys, err := kv.ListKeys(ctx)
			if err != nil {
				return err
			}
			now := time.Now()
			var list []run.Summary
			listed := map[string]bool{}
			for key := range keys.Keys() {
				if !bus.RunStateKey(key) {
					continue
				}
				listed[key] = true
				entry, err := kv.Get(ctx, key)
				if errors.Is(err, jetstream.ErrKeyNotFound) {
					continue // expired meanwhile
				}
				if err != nil {
					return err
				}
				var st run.State
				if err := json.Unmarshal(entry.Value(), &st); err != nil {
					fmt.Fprintf(g.errOut, "run %s: unreadable state: %v\n", key, err)
					continue
				}
				if !st.IsTerminal() {
					// A run's end is usually its last write: the state
					// stored is the one before it.
					end, usage, err := dispatch.ReadEnd(ctx, js, topo, &st)
					if err != nil {
						return err
					}
					if end != nil {
						run.Adopt(&st, end)
						if usage != nil {
							st.Usage = usage
						}
					}
				}
				if s := run.Summarize(&st, now); f.Match(s) {
					list = append(list, s)
				}
			}
			// A run that completed within Config.AlarmDelay of its admission
			// is usually in no bucket: its request and its end are told.
			unstored, err := dispatch.UnstoredRuns(ctx, js, kv, topo, func(runID string) bool { return listed[runID] })
			if err != nil {
				return err
			}
			for i := range unstored {
				if s := run.Summarize(&unstored[i], now); f.Match(s) {
					list = append(list, s)
				}
			}
			sort.Slice(list, func(i, j int) bool { return list[i].Age < list[j].Age })
			if limit > 0 && len(list) > limit {
				list = list[:limit]
			}
			tw := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "RUN\tTENANT\tSTATUS\tKIND\tAGE\tWAITING FOR\tUSER\tTOKENS\tCOST")
			capacity := 0
			for _, s := range list {
				tokens, cost := "-", "-"
				if s.Usage != nil {
					tokens, cost = strconv.FormatInt(s.Usage.Tokens(), 10), fmt.Sprintf("$%.4f", s.Usage.CostUSD)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.RunID, s.Tenant, s.Status, s.Kind, s.Age, dash(s.Waiting), dash(s.UserID), tokens, cost)
				if strings.HasPrefix(s.Waiting, "capacity of ") {
					capacity++
				}
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if capacity > 0 {
				fmt.Fprintf(g.out, "%d run(s) waiting for capacity (actionbus_capacity_waiting has the queues per action)\n", capacity)
			}
			return nil
		}),
	}
	cmd.Flags().StringSliceVar(&statuses, "status", nil, "only runs in these statuses (running, awaiting_input, awaiting_approval, completed, failed, canceled)")
	cmd.Flags().StringSliceVar(&kinds, "kind", nil, "only runs of these kinds (agent, exec, workflow)")
	cmd.Flags().StringVar(&user, "user", "", "only runs of this user")
	cmd.Flags().StringVar(&tenant, "only-tenant", "", "only runs of this tenant (default: every tenant)")
	cmd.Flags().DurationVar(&maxAge, "since", 0, "only runs younger than this (e.g. 1h)")
	cmd.Flags().IntVar(&limit, "limit", 100, "at most this many runs, youngest first (0: all)")
	return cmd
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
