// Package cli is the actionbus command line: dev (everything in one
// process), provision, run, exec, watch, cancel, actions and events tail.
// cmd/actionbus only calls [Execute].
package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/service"
	"github.com/actionbus/actionbus/internal/tracing/otlp"
)

// globals are the flags every command shares.
type globals struct {
	natsURL string
	creds   string
	prefix  string
	tenant  string
	verbose bool
	in      *bufio.Reader
	out     io.Writer
	errOut  io.Writer
}

func (g *globals) logger() *slog.Logger {
	level := slog.LevelWarn
	if g.verbose {
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(g.errOut, &slog.HandlerOptions{Level: level}))
}

func (g *globals) connect() (*nats.Conn, error) {
	if g.natsURL == "" {
		g.natsURL = envOr("NATS_URL", nats.DefaultURL)
	}
	// A tenant's users receive replies only on their tenant's inboxes.
	opts := []nats.Option{nats.Name("actionbus-cli"), nats.CustomInboxPrefix(client.InboxPrefix(g.tenant))}
	if g.creds != "" {
		opts = append(opts, nats.UserCredentials(g.creds))
	}
	nc, err := nats.Connect(g.natsURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", service.RedactURL(g.natsURL), err)
	}
	return nc, nil
}

// withJetStream adapts a command body that needs JetStream itself (an
// operator's command: provisioning, reading run state): it connects, runs
// the body and closes the connection.
func (g *globals) withJetStream(run func(cmd *cobra.Command, args []string, js jetstream.JetStream) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		nc, err := g.connect()
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		return run(cmd, args, js)
	}
}

// withClient adapts a command body that needs a client: it connects,
// builds the client, runs the body and closes the connection.
func (g *globals) withClient(run func(cmd *cobra.Command, args []string, c *client.Client) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c, done, err := g.client()
		if err != nil {
			return err
		}
		defer done()
		return run(cmd, args, c)
	}
}

// runArgs accepts exactly n arguments, the first a run id of a valid
// shape ([client.CheckRunID]): a malformed id is invalid_run_id before
// any connection is made.
func runArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := cobra.ExactArgs(n)(cmd, args); err != nil {
			return err
		}
		return client.CheckRunID(args[0])
	}
}

// approvalArgs accepts one argument, an approval id of a valid shape
// ([client.CheckApprovalID]), checked before any connection is made.
func approvalArgs(cmd *cobra.Command, args []string) error {
	if err := cobra.ExactArgs(1)(cmd, args); err != nil {
		return err
	}
	return client.CheckApprovalID(args[0])
}

// withRun is withClient for a command whose first argument names a run:
// the run is looked up first ([client.Client.CheckRun]), so that a
// malformed id (invalid_run_id) or an unknown run (run_not_found) ends
// the command at once, never after a wait for a run that will not come.
func (g *globals) withRun(run func(cmd *cobra.Command, args []string, c *client.Client) error) func(*cobra.Command, []string) error {
	return g.withClient(func(cmd *cobra.Command, args []string, c *client.Client) error {
		if err := c.CheckRun(cmd.Context(), args[0]); err != nil {
			return err
		}
		return run(cmd, args, c)
	})
}

// client connects and returns a client and the function that closes its
// connection.
func (g *globals) client() (*client.Client, func(), error) {
	nc, err := g.connect()
	if err != nil {
		return nil, nil, err
	}
	c, err := client.New(nc, client.Options{Prefix: g.prefix, Source: "/actionbus/cli", Tenant: g.tenant})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return c, nc.Close, nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// Execute runs the command line with args and returns the exit code.
// stdin answers clarify questions of followed runs.
func Execute(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	g := &globals{in: bufio.NewReader(stdin), out: stdout, errOut: stderr}
	root := &cobra.Command{
		Use:           "actionbus",
		Short:         "Event-driven action runtime: named, schema-validated, policy-checked actions over NATS JetStream",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.natsURL, "nats", "", "NATS server URL (default $NATS_URL, else "+nats.DefaultURL+"; read at run time, never shown)")
	root.PersistentFlags().StringVar(&g.creds, "creds", envOr("NATS_CREDS", ""), "NATS credentials file (operator mode: a tenant's client creds, or a service user's; env NATS_CREDS)")
	root.PersistentFlags().StringVar(&g.prefix, "prefix", envOr("ACTIONBUS_PREFIX", events.DefaultPrefix), "subject prefix (env ACTIONBUS_PREFIX)")
	root.PersistentFlags().StringVar(&g.tenant, "tenant", envOr("ACTIONBUS_TENANT", events.DefaultTenant), "the tenant whose runs the command starts, follows and answers (env ACTIONBUS_TENANT)")
	root.PersistentFlags().BoolVarP(&g.verbose, "verbose", "v", false, "log service activity")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetArgs(args)
	// Traces go out over OTLP/HTTP when the OTEL_* environment asks (a
	// run started here, and dev mode's services, join them).
	if shutdown, err := otlp.Setup(ctx, "actionbus"); err != nil {
		fmt.Fprintln(stderr, "actionbus: traces:", err)
	} else {
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = shutdown(sctx)
		}()
	}
	root.AddCommand(devCmd(g), provisionCmd(g), runCmd(g), execCmd(g), watchCmd(g), cancelCmd(g), inputCmd(g), approveCmd(g), denyCmd(g), workflowCmd(g), actionsCmd(g), skillsCmd(g), mcpCmd(g), artifactsCmd(g), auditCmd(g), eventsCmd(g), replayCmd(g), runsCmd(g), retryCmd(g), tenantCmd(g), natsCmd(g), consoleCmd(g), conformanceCmd(g))
	if err := root.ExecuteContext(ctx); err != nil {
		var exit exitError
		if asExit(err, &exit) {
			return exit.code
		}
		fmt.Fprintln(stderr, "actionbus:", err)
		return 1
	}
	return 0
}

// exitError ends the command with a code and no further message.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

func asExit(err error, target *exitError) bool {
	e, ok := err.(exitError)
	if ok {
		*target = e
	}
	return ok
}
