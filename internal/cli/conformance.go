package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/conformance"
)

func conformanceCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "conformance",
		Short: "Check an executor against docs/protocol.md (conformance kit), or host the conformance catalog",
	}
	cmd.AddCommand(conformanceExecutorCmd(g), conformanceClientCmd(g), conformanceServeCmd(g))
	return cmd
}

func conformanceExecutorCmd(g *globals) *cobra.Command {
	var pool string
	var caseTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "executor",
		Short: "Drive a running executor hosting the conformance catalog through the protocol's cases; print a pass/fail table",
		Long: `executor drives the executor serving --pool, which must host the
conformance catalog (conformance.echo, conformance.sleep, conformance.big,
conformance.increment, conformance.shape; "actionbus conformance serve"
hosts it with the Go executor), through the cases of docs/protocol.md: one row per case with the
rule id it checks. The exit status is 1 when any case fails.

The kit plays the dispatcher: it publishes crafted work on the pool's work
subject, ends runs with run.canceled and the pool's ended signal
(ab.pool.P.ended) and reads results from the runs stream, as runs no dispatcher knows. Connect as the services account's
admin (the "admin creds" that actionbus dev prints), to a development or
test deployment, on a pool only the executor under test serves:

  actionbus --creds ADMIN provision --pool conformance
  actionbus --creds ADMIN conformance serve --pool conformance   # or your executor
  actionbus --creds ADMIN conformance executor --pool conformance`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			nc, err := g.connect()
			if err != nil {
				return err
			}
			defer nc.Close()
			rows, err := conformance.RunExecutor(cmd.Context(), nc, conformance.Config{Pool: pool, Prefix: g.prefix, Tenant: g.tenant, CaseTimeout: caseTimeout})
			conformance.PrintTable(g.out, rows)
			if err != nil {
				return err
			}
			if n := conformance.Failed(rows); n > 0 {
				fmt.Fprintf(g.out, "%d of %d cases failed\n", n, len(rows))
				return exitError{1}
			}
			fmt.Fprintf(g.out, "all %d cases passed\n", len(rows))
			return nil
		},
	}
	cmd.Flags().StringVar(&pool, "pool", bus.DefaultPool, "pool of the executor under test")
	cmd.Flags().DurationVar(&caseTimeout, "case-timeout", 10*time.Second, "deadline of each case")
	return cmd
}

func conformanceServeCmd(g *globals) *cobra.Command {
	var pool string
	var slots int
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the conformance catalog on a pool with the Go executor, until interrupted",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			nc, err := g.connect()
			if err != nil {
				return err
			}
			defer nc.Close()
			ex, err := executor.New(nc, executor.Config{Pool: pool, Prefix: g.prefix, Slots: slots, Logger: g.logger()})
			if err != nil {
				return err
			}
			if err := conformance.RegisterCatalog(ex); err != nil {
				return err
			}
			go func() {
				select {
				case <-ex.Ready():
					fmt.Fprintf(g.out, "serving the conformance catalog on pool %s (executor %s)\n", pool, ex.ID())
				case <-cmd.Context().Done():
				}
			}()
			return ex.Run(cmd.Context())
		},
	}
	cmd.Flags().StringVar(&pool, "pool", bus.DefaultPool, "pool to serve")
	cmd.Flags().IntVar(&slots, "slots", 4, "concurrent handlers")
	return cmd
}

func conformanceClientCmd(g *globals) *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "client",
		Short: "Check the run.requested a client under test publishes (C-START); print a pass/fail table",
		Long: `client listens on every tenant's run.requested subject, waits up to --wait
for the client under test to start one run (start it once "listening" is
printed), and checks that event against docs/protocol.md's C-START: a
valid CloudEvent on its subject whose data fits its schema, subject and
extensions agreeing, a ULID run id, the event id equal to the run id. The
exit status is 1 when any check fails. The client's other rules need a
dispatcher's answers and are not checked. Connect as the services
account's admin (the "admin creds" that actionbus dev prints): a tenant's
own users may not listen on run requests.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			nc, err := g.connect()
			if err != nil {
				return err
			}
			defer nc.Close()
			rows, err := conformance.RunClient(cmd.Context(), nc, conformance.ClientConfig{Prefix: g.prefix, Wait: wait,
				Listening: func() { fmt.Fprintln(g.out, "listening: start a run with the client under test") }})
			if err != nil {
				return err
			}
			conformance.PrintTable(g.out, rows)
			if n := conformance.Failed(rows); n > 0 {
				fmt.Fprintf(g.out, "%d of %d checks failed\n", n, len(rows))
				return exitError{1}
			}
			fmt.Fprintf(g.out, "all %d checks passed\n", len(rows))
			return nil
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", 30*time.Second, "how long to wait for the client to start a run")
	return cmd
}
