package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/audit"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/run"
	"github.com/actionbus/actionbus/internal/workflow"
)

func provisionCmd(g *globals) *cobra.Command {
	var pools, tags []string
	var replicas, partitions int
	var cluster string
	cmd := &cobra.Command{
		Use:   "provision",
		Short: "Create or update every stream, consumer and bucket (idempotent; needs JetStream admin rights)",
		Long: `Create or update every stream, consumer and bucket (idempotent; needs
JetStream admin rights). Every pool named with --pool gets its work consumer
(pool-<pool> on AB_WORK) and its presence, idempotency and artifact stores.
A new pool exists only once provisioned: its executors refuse to start
(missing_topology naming this command) until "actionbus provision --pool
<pool>" ran. Name every pool the deployment serves (default: default only);
provisioning one pool leaves the others as they are (docs/protocol.md,
E-PROVISION).

--partitions spreads the runs over that many partitions: each run's
events are stored under its partition, and each partition is served by
one dispatcher at a time, so more dispatchers (up to the partitions)
share the runs; a dispatcher that stops or dies hands its partitions to
the others within seconds (docs/scaling.md).

Tenants share everything provisioned here: adding a tenant needs no
provisioning, only its NATS account — see "actionbus tenant add TENANT"
(operator mode), "actionbus tenant users TENANT" (static config) and
docs/tenants.md.`,
		RunE: g.withJetStream(func(cmd *cobra.Command, _ []string, js jetstream.JetStream) error {
			topo := bus.Topology{Prefix: g.prefix, Pools: pools, Replicas: replicas, Partitions: partitions}
			if cluster != "" || len(tags) > 0 {
				topo.Placement = &jetstream.Placement{Cluster: cluster, Tags: tags}
			}
			if err := topo.Provision(cmd.Context(), js); err != nil {
				return err
			}
			for _, s := range topo.Streams() {
				fmt.Fprintf(g.out, "stream   %-14s %s\n", s.Name, strings.Join(s.Subjects, " "))
			}
			for _, c := range topo.Consumers() {
				fmt.Fprintf(g.out, "consumer %-14s %s\n", c.Stream+"/"+c.Config.Durable, strings.Join(c.Config.FilterSubjects, " "))
			}
			for _, b := range topo.Buckets() {
				fmt.Fprintf(g.out, "bucket   %s\n", b.Bucket)
			}
			return nil
		}),
	}
	cmd.Flags().StringSliceVar(&pools, "pool", []string{bus.DefaultPool}, "executor pools to provision work consumers and stores for (repeatable; a new pool's executors cannot start before it is provisioned)")
	cmd.Flags().IntVar(&replicas, "replicas", 1, "replicas of every stream and bucket (3 on a cluster)")
	cmd.Flags().IntVar(&partitions, "partitions", 0, fmt.Sprintf("partitions the runs are spread over, each served by one dispatcher at a time (1 to %d; default: as provisioned before, else 1; change it with the dispatchers drained)", bus.MaxPartitions))
	cmd.Flags().StringVar(&cluster, "placement-cluster", "", "place every stream and bucket in this JetStream cluster")
	cmd.Flags().StringSliceVar(&tags, "placement-tags", nil, "place every stream and bucket on servers with these tags")
	return cmd
}

type runFlags struct {
	scenario, prompt, user string
	modes                  []string
	timeout                time.Duration
}

func (f *runFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.user, "user", os.Getenv("USER"), "user id the run acts for")
	cmd.Flags().StringSliceVar(&f.modes, "allow-mode", nil, "action modes the run may use (default read, draft, dryRun)")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 5*time.Minute, "how long to follow the run")
}

// follow prints a run live and returns an exitError unless it completed.
func follow(ctx context.Context, g *globals, c *client.Client, runID string, timeout time.Duration) error {
	return followWith(ctx, g, c, runID, timeout, newProgress(g.out))
}

// start publishes a run after subscribing to its answer stream, so the
// answer shows while it is written.
func start(ctx context.Context, g *globals, c *client.Client, req client.RunRequest, timeout time.Duration) error {
	return startWith(ctx, g, c, req, timeout, newProgress(g.out))
}

func startWith(ctx context.Context, g *globals, c *client.Client, req client.RunRequest, timeout time.Duration, p *progress) error {
	if req.RunID == "" {
		req.RunID = events.NewID()
	}
	stop, err := c.StreamAnswer(req.RunID, p.token)
	if err != nil {
		return err
	}
	defer func() { _ = stop() }()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// Run subscribes to the live events (run.started, progress) before it
	// publishes the request, so none is missed.
	res, err := c.Run(ctx, req, printer(ctx, g, c, req.RunID, p))
	return p.outcome(req.RunID, res, err)
}

func followWith(ctx context.Context, g *globals, c *client.Client, runID string, timeout time.Duration, p *progress) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res, err := c.Follow(ctx, runID, printer(ctx, g, c, runID, p))
	return p.outcome(runID, res, err)
}

// printer renders a run's events and answers its clarify questions.
func printer(ctx context.Context, g *globals, c *client.Client, runID string, p *progress) func(client.Event) {
	return func(e client.Event) {
		p.event(e)
		s, ok := e.Step()
		if ok && s.Name == string(run.StepAwaitingInput) {
			answerQuestion(ctx, g, c, runID, s.Message)
		}
		if ok && p.onStep != nil {
			p.onStep(s)
		}
	}
}

// outcome is the command's error for a followed run: an exitError unless
// it completed.
func (p *progress) outcome(runID string, res *client.Result, err error) error {
	if err != nil {
		return fmt.Errorf("follow run %s: %w", runID, err)
	}
	if code := p.result(res); code != 0 {
		return exitError{code}
	}
	return nil
}

// answerQuestion reads the answer to a clarify question from stdin and
// sends it; without one, it says how to answer from elsewhere.
func answerQuestion(ctx context.Context, g *globals, c *client.Client, runID, question string) {
	fmt.Fprintf(g.out, "? %s\n> ", question)
	line, err := g.in.ReadString('\n')
	answer := strings.TrimSpace(line)
	if answer == "" && err != nil {
		fmt.Fprintf(g.out, "\n(no answer on stdin; answer with: %s input %s \"...\")\n", selfCommand(), runID)
		return
	}
	if err := c.Input(ctx, runID, answer); err != nil {
		fmt.Fprintf(g.errOut, "actionbus: sending the answer: %v\n", err)
	}
}

func inputCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "input RUN_ID ANSWER",
		Short: "Answer a run's clarify question",
		Args:  runArgs(2),
		RunE: g.withRun(func(cmd *cobra.Command, args []string, c *client.Client) error {
			return c.Input(cmd.Context(), args[0], args[1])
		}),
	}
}

// approvalKeyEnv names the environment variable the approve command reads
// its key from. The key is read when the command runs, never shown as a
// flag default (help text would print it).
const approvalKeyEnv = "ACTIONBUS_APPROVAL_KEY"

// ownKey reads the approver's own key: --key, else $ACTIONBUS_APPROVAL_KEY.
func ownKey(keySpec string) (string, []byte, error) {
	if keySpec == "" {
		keySpec = os.Getenv(approvalKeyEnv)
	}
	keys, err := policy.ParseKeys(keySpec)
	if err != nil {
		return "", nil, err
	}
	if len(keys) != 1 {
		return "", nil, fmt.Errorf("exactly one key is needed (--key kid:base64secret or %s)", approvalKeyEnv)
	}
	var kid string
	for id := range keys {
		kid = id
	}
	if key := keys[kid]; key.Gateway || key.Holder != "" {
		return "", nil, fmt.Errorf("--key takes kid:base64secret, your own key; a holder or gateway mark belongs in the dispatcher's keys")
	}
	return kid, keys[kid].Secret, nil
}

func approveCmd(g *globals) *cobra.Command {
	var keySpec string
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "approve APPROVAL_ID",
		Short: "Show what an approval signs, sign it with your approval key and wait for the dispatcher's answer (exit 1 when refused)",
		Long: `Show what an approval signs, sign it with your own approval key and wait
for the dispatcher's answer (exit 1 when refused). The approver the run
records is the key's holder, as the dispatcher's keys name it (the key id,
or the user of "kid:secret:user"): never a name typed here.`,
		Args: approvalArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			kid, key, err := ownKey(keySpec)
			if err != nil {
				return fmt.Errorf("approve: %w", err)
			}
			c, done, err := g.client()
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := context.WithTimeout(cmd.Context(), wait)
			defer cancel()
			p, err := c.Approval(ctx, args[0])
			if err != nil {
				return err
			}
			input, _ := json.MarshalIndent(p.Input, "  ", "  ")
			fmt.Fprintf(g.out, "approving %s\n  action:     %s\n  for user:   %s\n  input hash: %s\n  expires:    %s\n  reason:     %s\n  input:      %s\n",
				args[0], p.Context.Action, orNone(p.Context.UserID), p.Context.InputHash, p.Context.ExpiresAt.Format(time.RFC3339), p.Reason, input)
			if err := c.Approve(ctx, args[0], kid, key); err != nil {
				return fmt.Errorf("approval %s refused: %w", args[0], err)
			}
			fmt.Fprintf(g.out, "approved %s with key %s\n", args[0], kid)
			return nil
		},
	}
	cmd.Flags().StringVar(&keySpec, "key", "", "your approval key kid:base64secret (default: $"+approvalKeyEnv+")")
	cmd.Flags().DurationVar(&wait, "wait", 30*time.Second, "how long to wait for the dispatcher's answer")
	return cmd
}

func denyCmd(g *globals) *cobra.Command {
	var keySpec, reason string
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "deny APPROVAL_ID",
		Short: "Deny a pending action with your approval key (its run ends with approval_denied) and wait for the dispatcher's answer (exit 1 when refused)",
		Args:  approvalArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			kid, key, err := ownKey(keySpec)
			if err != nil {
				return fmt.Errorf("deny: %w", err)
			}
			c, done, err := g.client()
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := context.WithTimeout(cmd.Context(), wait)
			defer cancel()
			if _, err := c.Approval(ctx, args[0]); err != nil {
				return err
			}
			if err := c.Deny(ctx, args[0], kid, key, reason); err != nil {
				return fmt.Errorf("denial of %s refused: %w", args[0], err)
			}
			fmt.Fprintf(g.out, "denied %s with key %s\n", args[0], kid)
			return nil
		},
	}
	cmd.Flags().StringVar(&keySpec, "key", "", "your approval key kid:base64secret (default: $"+approvalKeyEnv+")")
	cmd.Flags().StringVar(&reason, "reason", "", "why")
	cmd.Flags().DurationVar(&wait, "wait", 30*time.Second, "how long to wait for the dispatcher's answer")
	return cmd
}

func workflowCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "workflow", Short: "JSON workflows"}
	var withCatalog bool
	validate := &cobra.Command{
		Use:   "validate FILE",
		Short: "Validate a workflow file; print every issue with its code and path; exit 1 if there is any",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			doc, err := readWorkflow(args[0])
			if err != nil {
				return err
			}
			var catalog workflow.Catalog
			if withCatalog {
				c, done, err := g.client()
				if err != nil {
					return err
				}
				defer done()
				list, err := c.Actions(cmd.Context())
				if err != nil {
					return err
				}
				catalog = workflow.Catalog{}
				for _, a := range list {
					catalog[a.Name] = a.Mode
				}
			}
			issues := workflow.Validate(doc, catalog)
			for _, is := range issues {
				fmt.Fprintf(g.out, "%s\t%s\t%s\n", is.Path, is.Code, is.Message)
			}
			if len(issues) > 0 {
				return exitError{1}
			}
			fmt.Fprintln(g.out, "valid")
			return nil
		},
	}
	validate.Flags().BoolVar(&withCatalog, "catalog", false, "also check actions and modes against the running catalog")
	cmd.AddCommand(validate)
	return cmd
}

func readWorkflow(path string) (map[string]any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return decodeObject(path, b)
}

// runHelp is run's long help: its example workflow validates against
// the demo's catalog (TestRunHelpShowsAJSONWorkflowThatValidates).
const runHelp = `run publishes a run.requested and prints each step live until the run
ends; it answers the run's clarify questions on the terminal. Exit 0 only
when the run completed.

An agent run: a prompt, planned by the planner (--scenario names a script
planner scenario). A workflow run: --workflow FILE, a JSON workflow:

  {
    "workflowName": "dry-run-failed-jobs",
    "steps": [
      {"id": "jobs", "action": "delivery.searchJobs", "input": {"status": ["FAILED"]}},
      {"id": "dryRun", "action": "delivery.dryRunRetry",
       "input": {"jobIds": {"$fromStep": "jobs", "path": "/jobIds"}}}
    ]
  }

workflowName and steps are required; each step has an id, an action and
an input. {"$fromStep": ID, "path": POINTER} anywhere in an input is that
JSON Pointer into an earlier step's output. A step may also set
allowedModes, retry {maxAttempts, delayMs, backoff}, timeoutMs,
continueOnError and idempotencyKey. "actionbus workflow validate FILE"
checks a file without running it.

A run may use only the action modes it allows: read, draft and dryRun by
default; --allow-mode read,draft,dryRun,mutate lets it call a mutate
action, which waits for an approval (actionbus approve APPROVAL_ID, as an
approver).`

func runCmd(g *globals) *cobra.Command {
	var f runFlags
	var workflowFile string
	var maxTokens int64
	var maxCost float64
	cmd := &cobra.Command{
		Use:   "run [PROMPT]",
		Short: "Publish a run.requested and print each step live until the run ends (exit 0 only on completed)",
		Long:  runHelp,
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				f.prompt = args[0]
			}
			req := client.RunRequest{Prompt: f.prompt, Scenario: f.scenario, UserID: f.user, AllowedModes: f.modes}
			if maxTokens > 0 || maxCost > 0 {
				req.Budget = &client.Budget{MaxTokens: maxTokens, MaxCostUSD: maxCost}
			}
			if workflowFile != "" {
				// Read before connecting: a file that is not a JSON
				// object fails at once.
				wf, err := readWorkflow(workflowFile)
				if err != nil {
					return err
				}
				// Sent as it is: the dispatcher checks all of it.
				if req.WorkflowJSON, err = json.Marshal(wf); err != nil {
					return err
				}
			}
			return g.withClient(func(cmd *cobra.Command, _ []string, c *client.Client) error {
				return start(cmd.Context(), g, c, req, f.timeout)
			})(cmd, args)
		},
	}
	cmd.Flags().StringVar(&f.scenario, "scenario", "", "script planner scenario")
	cmd.Flags().StringVar(&workflowFile, "workflow", "", "run a JSON workflow file instead of a prompt")
	cmd.Flags().Int64Var(&maxTokens, "max-tokens", 0, "the run's budget of LLM tokens, input and output together (0: the host's run budget; more than it is refused)")
	cmd.Flags().Float64Var(&maxCost, "max-cost", 0, "the run's budget of LLM cost in USD, from the planners' price table (0: the host's run budget)")
	f.add(cmd)
	return cmd
}

// maxInputBytes bounds what exec reads from a file or stdin; anything
// larger could never travel in one event (the server's max payload is
// 1 MB by default) and is refused before it is sent.
const maxInputBytes = 1 << 20

// readInput returns an --input value: inline JSON, @FILE or - (stdin).
// The error names the source, never its content.
func readInput(g *globals, spec string) ([]byte, error) {
	var r io.Reader
	switch {
	case spec == "-":
		r = g.in
	case strings.HasPrefix(spec, "@"):
		f, err := os.Open(spec[1:])
		if err != nil {
			return nil, fmt.Errorf("--input: %w", err)
		}
		defer f.Close()
		r = f
	default:
		return []byte(spec), nil
	}
	data, err := io.ReadAll(io.LimitReader(r, maxInputBytes+1))
	if err != nil {
		return nil, fmt.Errorf("--input %s: %w", spec, err)
	}
	if len(data) > maxInputBytes {
		return nil, actionbus.Errorf(actionbus.CodePayloadTooLarge, "--input %s is over %d bytes", spec, maxInputBytes)
	}
	return data, nil
}

// inputSource names where an --input value was read from, for its
// errors: never the inline value itself.
func inputSource(spec string) string {
	switch {
	case spec == "-":
		return "(stdin)"
	case strings.HasPrefix(spec, "@"):
		return spec
	}
	return "(inline)"
}

func execCmd(g *globals) *cobra.Command {
	var f runFlags
	var input, idemKey string
	cmd := &cobra.Command{
		Use:   "exec ACTION",
		Short: "Run one action as a one-step host-origin run and print its output",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			raw, err := readInput(g, input)
			if err != nil {
				return err
			}
			in, err := decodeObject("--input "+inputSource(input), raw)
			if err != nil {
				return err
			}
			c, done, err := g.client()
			if err != nil {
				return err
			}
			defer done()
			return start(cmd.Context(), g, c, client.RunRequest{Action: &client.ActionCall{Name: args[0], Args: in, IdempotencyKey: idemKey}, UserID: f.user, AllowedModes: f.modes}, f.timeout)
		},
	}
	cmd.Flags().StringVar(&input, "input", "{}", "action input as a JSON object: inline, @FILE to read a file, - to read stdin")
	cmd.Flags().StringVar(&idemKey, "idempotency-key", "", "a retried exec with the same key returns the first result")
	f.add(cmd)
	return cmd
}

func watchCmd(g *globals) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "watch RUN_ID",
		Short: "Print a run's steps, from its start, until it ends",
		Args:  runArgs(1),
		RunE: g.withRun(func(cmd *cobra.Command, args []string, c *client.Client) error {
			return follow(cmd.Context(), g, c, args[0], timeout)
		}),
	}
	cmd.Flags().DurationVar(&timeout, "timeout", time.Hour, "how long to watch")
	return cmd
}

func cancelCmd(g *globals) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "cancel RUN_ID",
		Short: "Ask the dispatcher to cancel a run",
		Args:  runArgs(1),
		RunE: g.withRun(func(cmd *cobra.Command, args []string, c *client.Client) error {
			if res, err := c.Ended(cmd.Context(), args[0]); err == nil && res != nil {
				fmt.Fprintf(g.out, "run %s already ended (%s): nothing to cancel\n", args[0], res.Status)
				return nil
			}
			if err := c.Cancel(cmd.Context(), args[0], reason); err != nil {
				return err
			}
			fmt.Fprintf(g.out, "cancel requested for %s\n", args[0])
			return nil
		}),
	}
	cmd.Flags().StringVar(&reason, "reason", "canceled from the command line", "why")
	return cmd
}

func actionsCmd(g *globals) *cobra.Command {
	var plannerOnly bool
	cmd := &cobra.Command{
		Use:   "actions",
		Short: "List the action catalog (--planner: only what planners may choose)",
		RunE: g.withClient(func(cmd *cobra.Command, args []string, c *client.Client) error {
			list, err := c.Actions(cmd.Context())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tMODE\tTIER\tPOOL\tVERSION\tEFFECT\tDESCRIPTION")
			for _, a := range list {
				if plannerOnly && !a.PlannerVisible {
					continue
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", a.Name, a.Mode, a.Tier, a.Pool, a.Version, a.Permission.Effect, a.Description)
			}
			return tw.Flush()
		}),
	}
	cmd.Flags().BoolVar(&plannerOnly, "planner", false, "only planner-visible actions")
	return cmd
}

func skillsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "skills",
		Short: "List the catalog's agent skills (skills show NAME prints one)",
		Args:  cobra.NoArgs,
		RunE: g.withClient(func(cmd *cobra.Command, _ []string, c *client.Client) error {
			list, err := c.Skills(cmd.Context())
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tVERSION\tPOOL\tTOOLS\tHANDOFFS\tDESCRIPTION")
			for _, s := range list {
				sum := s.Summarize()
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Version, s.Pool, strings.Join(sum.Tools, ","), strings.Join(s.Handoffs, ","), s.Description)
			}
			return tw.Flush()
		}),
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "show NAME",
		Short: "Print one skill: its front matter, tools and instructions",
		Args:  cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, args []string, c *client.Client) error {
			s, err := c.Skill(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(g.out, "%s %s (pool %s)\n%s\n", s.Name, s.Version, s.Pool, s.Description)
			if len(s.Handoffs) > 0 {
				fmt.Fprintf(g.out, "hands off to: %s\n", strings.Join(s.Handoffs, ", "))
			}
			if len(s.Tools) > 0 {
				fmt.Fprintln(g.out, "\ntools:")
				for _, t := range s.Tools {
					mode := t.Mode
					if mode == "" {
						mode = "read"
					}
					line := fmt.Sprintf("  %s (%s, tier %d)", t.Name, mode, t.Tier)
					if t.ResultKind != "" {
						line += " → " + t.ResultKind
					}
					if t.Description != "" {
						line += ": " + t.Description
					}
					fmt.Fprintln(g.out, line)
					if t.Parameters != nil {
						b, _ := json.Marshal(t.Parameters)
						fmt.Fprintf(g.out, "    parameters: %s\n", b)
					}
				}
			}
			fmt.Fprintf(g.out, "\n%s\n", s.Instructions)
			return nil
		}),
	})
	return cmd
}

func artifactsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "artifacts", Short: "Read large action outputs"}
	cmd.AddCommand(&cobra.Command{
		Use:   "get ID",
		Short: "Write an artifact to stdout exactly as stored (its SHA-256 goes to stderr)",
		Args:  cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, args []string, c *client.Client) error {
			data, sum, err := c.Artifact(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if _, err := g.out.Write(data); err != nil {
				return err
			}
			fmt.Fprintf(g.errOut, "sha256 %s  %d bytes\n", sum, len(data))
			return nil
		}),
	})
	return cmd
}

// runEnded returns the status of a run that has ended ("" when it has not
// or cannot be known), and why it is unknown.
func runEnded(ctx context.Context, c *client.Client, runID string) (status, why string) {
	if c == nil {
		return "", "whether the run ended was not checked (NATS unreachable), so a cut-off tail cannot be seen"
	}
	res, err := c.Ended(ctx, runID)
	switch {
	case err != nil:
		return "", "whether the run ended was not checked (" + err.Error() + "), so a cut-off tail cannot be seen"
	case res == nil:
		return "", "the run has not ended; records may still be added"
	}
	return res.Status, ""
}

// settledStream reads a run's records from the audit stream. The auditor
// writes a run's records a moment after its events: when the run has
// ended and the stream has not yet its terminal record, it reads again
// until it has, for at most settle; what it then holds is checked as it
// is (a chain still cut off is reported truncated).
func settledStream(ctx context.Context, c *client.Client, runID string, settle time.Duration) ([]audit.SinkRecord, error) {
	read := func() ([]audit.SinkRecord, bool, error) {
		var recs []audit.SinkRecord
		err := c.AuditStream(ctx, client.AuditQuery{RunID: runID}, func(seq uint64, rec events.AuditRecorded) error {
			recs = append(recs, audit.SinkRecord{StreamSeq: seq, AuditRecorded: rec})
			return nil
		})
		chain := make([]events.AuditRecorded, len(recs))
		for i, r := range recs {
			chain[i] = r.AuditRecorded
		}
		return recs, audit.HasTerminal(chain), err
	}
	recs, done, err := read()
	if err != nil || done || settle <= 0 {
		return recs, err
	}
	if ended, _ := runEnded(ctx, c, runID); ended == "" {
		return recs, nil
	}
	deadline := time.NewTimer(settle)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return recs, ctx.Err()
		case <-deadline.C:
			return recs, nil
		case <-tick.C:
		}
		if recs, done, err = read(); err != nil || done {
			return recs, err
		}
	}
}

// behindStream holds a sink's chain against the run's chain on the audit
// stream: short says how the sink falls short (a record that differs,
// records the stream holds past the sink's last); why says when the
// stream could not be read.
func behindStream(ctx context.Context, c *client.Client, runID string, sink []events.AuditRecorded) (short, why string) {
	if c == nil {
		return "", "the audit stream was not read (NATS unreachable), so records cut from the sink's tail cannot be seen"
	}
	var stream []events.AuditRecorded
	err := c.AuditStream(ctx, client.AuditQuery{RunID: runID}, func(_ uint64, rec events.AuditRecorded) error {
		stream = append(stream, rec)
		return nil
	})
	if err != nil {
		return "", "the audit stream was not read (" + err.Error() + "), so records cut from the sink's tail cannot be seen"
	}
	return audit.Behind(sink, stream), ""
}

// sourceGaps reads where the run's events are stored and returns those
// the chain covers without a record; why says when it could not look.
func sourceGaps(ctx context.Context, c *client.Client, runID string, chain []events.AuditRecorded) ([]audit.SourceGap, string) {
	if c == nil {
		return nil, "the source streams were not read (NATS unreachable), so events without a record cannot be seen"
	}
	stored, err := c.StoredEvents(ctx, runID)
	if err != nil {
		return nil, "the source streams were not read (" + err.Error() + "), so events without a record cannot be seen"
	}
	in := make([]audit.Stored, len(stored))
	for i, e := range stored {
		in[i] = audit.Stored{Stream: e.Stream, Seq: e.Seq, Type: e.Type}
	}
	return audit.SourceGaps(chain, in), ""
}

func auditCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "audit", Short: "The audit stream: verify, tail, export"}
	var jsonl, sqlitePath string
	var auditorKey []string
	var requireSigned bool
	var settle time.Duration
	verify := &cobra.Command{
		Use:   "verify RUN_ID",
		Short: "Check a run's audit chain over the stream (or a sink): hashes, links, record numbers and the auditor's signatures; exit 1 and name the first bad record if it is not intact",
		Args:  runArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			runID := args[0]
			// Audit records outlive the run's events (and a sink may be
			// read without NATS): only the id's shape is checked (runArgs);
			// a run with no records is run_not_found below.
			// One connection serves every check that reads the bus; a sink
			// is verified without one too (c stays nil, and the checks
			// that need NATS say they were not made).
			c, done, connErr := g.client()
			if connErr == nil {
				defer done()
			}
			var recs []audit.SinkRecord
			var source string
			switch {
			case jsonl != "":
				var err error
				if recs, err = audit.ReadJSONL(jsonl, runID); err != nil {
					return err
				}
				source = jsonl
			case sqlitePath != "":
				var err error
				if recs, err = audit.ReadSQLite(cmd.Context(), sqlitePath, runID); err != nil {
					return err
				}
				source = sqlitePath
			default:
				if connErr != nil {
					return connErr
				}
				var err error
				if recs, err = settledStream(cmd.Context(), c, runID, settle); err != nil {
					return err
				}
				source = "the audit stream"
			}
			if len(recs) == 0 {
				return actionbus.Errorf(actionbus.CodeRunNotFound, "no audit records for run %s in %s", runID, source)
			}
			chain := make([]events.AuditRecorded, len(recs))
			for i, r := range recs {
				chain[i] = r.AuditRecorded
			}
			keys, keyFrom, err := auditorKeys(auditorKey)
			if err != nil {
				return err
			}
			v := audit.Check(chain, keys...)
			if b := v.Broken; b != nil {
				r := recs[b.At]
				fmt.Fprintf(g.out, "broken at record %d of %d in %s (stream sequence %d, event %s, %s %s): %s\n",
					b.At+1, len(recs), source, r.StreamSeq, r.EventID, r.Kind, r.EventType, b.Message)
				return exitError{1}
			}
			if requireSigned && v.Format1 > 0 {
				fmt.Fprintf(g.out, "unsigned: %d of %d records in %s are format 1 (unsigned) and --require-signed is set\n", v.Format1, len(recs), source)
				return exitError{1}
			}
			if v.Format1 < v.Records {
				// Every stored event the chain covers has its record.
				gaps, why := sourceGaps(cmd.Context(), c, runID, chain)
				if len(gaps) > 0 {
					gp := gaps[0]
					where := "after its last record"
					if gp.Before >= 0 {
						where = fmt.Sprintf("before record %d", gp.Before+1)
					}
					fmt.Fprintf(g.out, "gap: the event at %s sequence %d (%s) has no record in %s (%s); %d such events\n",
						gp.Stream, gp.Seq, gp.Type, source, where, len(gaps))
					return exitError{1}
				}
				if why != "" {
					fmt.Fprintf(g.out, "note: %s\n", why)
				}
			}
			if keyFrom != "" && v.Format1 < v.Records {
				fmt.Fprintf(g.out, "auditor key from %s\n", keyFrom)
			}
			// A chain cut off at its tail is intact link by link: when the
			// run has ended, its terminal record must be there.
			ended, why := runEnded(cmd.Context(), c, runID)
			switch {
			case ended != "" && !audit.HasTerminal(chain):
				fmt.Fprintf(g.out, "truncated: run %s ended (%s) but its %d records in %s end before its terminal record\n", runID, ended, len(recs), source)
				return exitError{1}
			case ended == "":
				fmt.Fprintf(g.out, "note: %s\n", why)
			}
			// A sink is a copy of the stream: cut back to an earlier
			// signed append (the records after a run's terminal one, a
			// forgery's duplicates) it is intact link by link, so it is
			// held against the stream while that can be read.
			if source != "the audit stream" {
				short, why := behindStream(cmd.Context(), c, runID, chain)
				if short != "" {
					fmt.Fprintf(g.out, "%s in %s\n", short, source)
					return exitError{1}
				}
				if why != "" {
					fmt.Fprintf(g.out, "note: %s\n", why)
				}
			}
			fmt.Fprintf(g.out, "intact: %d records in %s, %s, head %s\n", len(recs), source, v.Format(), recs[len(recs)-1].Hash)
			return nil
		},
	}
	verify.Flags().StringVar(&jsonl, "jsonl", "", "verify a JSON-lines sink file instead of the stream")
	verify.Flags().StringVar(&sqlitePath, "sqlite", "", "verify a SQLite sink database instead of the stream")
	verify.Flags().StringSliceVar(&auditorKey, "auditor-key", nil, "the auditor's public key (A..., or @FILE), repeatable for rotated keys; default $ACTIONBUS_AUDITOR_KEY, else the .pub file beside the default auditor key file; none: each signature is checked against the key its record names, which proves no author")
	verify.Flags().BoolVar(&requireSigned, "require-signed", false, "fail on format-1 (unsigned) records, written before chains were signed")
	verify.Flags().DurationVar(&settle, "settle", 5*time.Second, "a run that ended a moment ago: wait up to this long for the auditor to write its terminal record to the audit stream before reporting the chain truncated (0: no wait)")

	var tf auditFilter
	var asJSON, fromStart, allTenants bool
	tail := &cobra.Command{
		Use:   "tail",
		Short: "Print audit records as they are written (filter by run, user, action, status, kind); Ctrl-C stops",
		RunE: g.withClient(func(cmd *cobra.Command, _ []string, c *client.Client) error {
			// A live tail of a run waits for its records: the run must
			// exist.
			switch {
			case tf.run != "" && allTenants:
				if err := client.CheckRunID(tf.run); err != nil {
					return err
				}
			case tf.run != "":
				if err := c.CheckRun(cmd.Context(), tf.run); err != nil {
					return err
				}
			}
			q := client.AuditQuery{RunID: tf.run, Live: true, AllTenants: allTenants}
			if fromStart {
				q.Since = time.Unix(0, 0)
			}
			err := c.AuditStream(cmd.Context(), q, func(seq uint64, rec events.AuditRecorded) error {
				if !tf.match(rec) {
					return nil
				}
				if asJSON {
					b, _ := json.Marshal(audit.SinkRecord{StreamSeq: seq, AuditRecorded: rec})
					fmt.Fprintln(g.out, string(b))
					return nil
				}
				fmt.Fprintf(g.out, "%s %-9s %-10s %-16s %-24s %s %s\n", rec.EventTime.Format("15:04:05.000"), rec.Kind, rec.Status,
					rec.UserID, rec.Action, rec.RunID, rec.Summary)
				return nil
			})
			if errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		}),
	}
	tf.add(tail)
	tail.Flags().BoolVar(&asJSON, "json", false, "print JSON lines")
	tail.Flags().BoolVar(&fromStart, "from-start", false, "start with the first stored record instead of the next new one")
	tail.Flags().BoolVar(&allTenants, "all-tenants", false, "every tenant's records (operators); default: the --tenant's")

	var ef auditFilter
	var since, until string
	export := &cobra.Command{
		Use:   "export",
		Short: "Write stored audit records as JSON lines (by run or time range) and exit",
		RunE: g.withClient(func(cmd *cobra.Command, _ []string, c *client.Client) error {
			if ef.run != "" {
				if err := client.CheckRunID(ef.run); err != nil {
					return err
				}
			}
			q := client.AuditQuery{RunID: ef.run, AllTenants: allTenants}
			var to time.Time
			var err error
			if since != "" {
				if q.Since, err = time.Parse(time.RFC3339, since); err != nil {
					return fmt.Errorf("--since: %w", err)
				}
			}
			if until != "" {
				if to, err = time.Parse(time.RFC3339, until); err != nil {
					return fmt.Errorf("--until: %w", err)
				}
			}
			w := bufio.NewWriter(g.out)
			defer w.Flush()
			return c.AuditStream(cmd.Context(), q, func(seq uint64, rec events.AuditRecorded) error {
				if !ef.match(rec) || (!to.IsZero() && rec.EventTime.After(to)) {
					return nil
				}
				b, err := json.Marshal(audit.SinkRecord{StreamSeq: seq, AuditRecorded: rec})
				if err != nil {
					return err
				}
				_, err = w.Write(append(b, '\n'))
				return err
			})
		}),
	}
	ef.add(export)
	export.Flags().StringVar(&since, "since", "", "first record time (RFC 3339)")
	export.Flags().BoolVar(&allTenants, "all-tenants", false, "every tenant's records (operators); default: the --tenant's")
	export.Flags().StringVar(&until, "until", "", "last record time (RFC 3339)")
	cmd.AddCommand(verify, tail, export)
	return cmd
}

// auditorKeys returns the auditor public keys verification pins, and
// where they came from: the flag's values (a key or @file), else
// $ACTIONBUS_AUDITOR_KEY (comma-separated), else the public key file
// beside the default auditor key file when there is one; none otherwise.
func auditorKeys(flag []string) ([]string, string, error) {
	from := "--auditor-key"
	if len(flag) == 0 {
		if env := os.Getenv("ACTIONBUS_AUDITOR_KEY"); env != "" {
			flag, from = strings.Split(env, ","), "$ACTIONBUS_AUDITOR_KEY"
		} else if def := audit.DefaultKeyFile(); def != "" {
			if _, err := os.Stat(def + ".pub"); err == nil {
				flag, from = []string{"@" + def + ".pub"}, def+".pub"
			}
		}
	}
	var keys []string
	for _, k := range flag {
		if file, ok := strings.CutPrefix(k, "@"); ok {
			b, err := os.ReadFile(file)
			if err != nil {
				return nil, "", fmt.Errorf("--auditor-key: %w", err)
			}
			k = string(b)
		}
		pub, err := audit.ParsePublicKey(k)
		if err != nil {
			return nil, "", err
		}
		keys = append(keys, pub)
	}
	if len(keys) == 0 {
		from = ""
	}
	return keys, from, nil
}

// auditFilter selects audit records by their fields.
type auditFilter struct{ run, user, action, status, kind string }

func (f *auditFilter) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.run, "run", "", "only this run")
	cmd.Flags().StringVar(&f.user, "user", "", "only records of this user")
	cmd.Flags().StringVar(&f.action, "action", "", "only records of this action")
	cmd.Flags().StringVar(&f.status, "status", "", "only records with this status (started, succeeded, failed, ...)")
	cmd.Flags().StringVar(&f.kind, "kind", "", "only records of this kind (run, action, approval, decision, policy, ...)")
}

func (f *auditFilter) match(r events.AuditRecorded) bool {
	return (f.run == "" || r.RunID == f.run) && (f.user == "" || r.UserID == f.user) && (f.action == "" || r.Action == f.action) &&
		(f.status == "" || r.Status == f.status) && (f.kind == "" || r.Kind == f.kind)
}

func eventsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "events", Short: "Inspect events"}
	var subject string
	tail := &cobra.Command{
		Use:   "tail",
		Short: "Print every event published under the prefix as it happens (Ctrl-C to stop)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			nc, err := g.connect()
			if err != nil {
				return err
			}
			defer nc.Close()
			if subject == "" {
				subject = g.prefix + ".>"
			}
			ch := make(chan string, 4096)
			var dropped atomic.Int64
			sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
				line := m.Subject
				if e, err := bus.Decode(m.Subject, m.Header, m.Data); err == nil {
					line = fmt.Sprintf("%s %s %s %s", e.Time().Format(time.RFC3339Nano), e.Type(), e.ID(), m.Subject)
				} else {
					line += " (not a cloudevent: " + err.Error() + ")"
				}
				select {
				case ch <- line:
				default:
					dropped.Add(1) // reported below: a tail never blocks the connection
				}
			})
			if err != nil {
				return err
			}
			defer sub.Unsubscribe()
			for {
				select {
				case <-cmd.Context().Done():
					return nil
				case l := <-ch:
					if n := dropped.Swap(0); n > 0 {
						fmt.Fprintf(g.out, "(%d events not shown: the terminal could not keep up)\n", n)
					}
					fmt.Fprintln(g.out, l)
				}
			}
		},
	}
	tail.Flags().StringVar(&subject, "subject", "", "subject filter (default PREFIX.>)")
	cmd.AddCommand(tail)
	return cmd
}

func replayCmd(g *globals) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "replay RUN_ID",
		Short: "Re-run a finished planner run with its recorded decisions (no LLM call) and report every divergence (exit 1 if any)",
		Args:  runArgs(1),
		RunE: g.withRun(func(cmd *cobra.Command, args []string, c *client.Client) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			rep, err := c.Replay(ctx, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(g.out, "replayed %s as %s: %d decision(s) recorded, %d replayed; %s → %s\n", rep.RecordedRunID, rep.ReplayRunID,
				len(rep.Recorded.Decisions), len(rep.Replayed.Decisions), rep.Recorded.Result.Status, rep.Replayed.Result.Status)
			if len(rep.Divergences) == 0 {
				fmt.Fprintln(g.out, "✔ no divergence: same observations, decisions and result")
				return nil
			}
			for _, d := range rep.Divergences {
				where := fmt.Sprintf("cycle %d", d.Cycle)
				if d.Cycle == 0 {
					where = "result"
				}
				at := ""
				if d.Path != "" {
					at = " at " + d.Path
				}
				fmt.Fprintf(g.out, "✘ %s: %s differs%s\n    recorded: %s\n    replayed: %s\n", where, d.What, at, d.Recorded, d.Replayed)
			}
			return exitError{1}
		}),
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for the recorded run's events and the replay")
	return cmd
}

// orNone prints an empty value as "(none)".
func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

func retryCmd(g *globals) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "retry RUN_ID",
		Short: "Retry a failed run (a workflow from its failed step, an agent run after its last good cycle) and follow the new run",
		Args:  runArgs(1),
		RunE: g.withRun(func(cmd *cobra.Command, args []string, c *client.Client) error {
			id, err := c.Retry(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(g.out, "retrying %s as %s\n", args[0], id)
			return follow(cmd.Context(), g, c, id, timeout)
		}),
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "how long to follow the new run")
	return cmd
}
