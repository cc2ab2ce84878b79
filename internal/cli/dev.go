package cli

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/accounts"
	"github.com/actionbus/actionbus/internal/audit"
	"github.com/actionbus/actionbus/internal/builtin"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/demo"
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/embedded"
	"github.com/actionbus/actionbus/internal/httpapi"
	"github.com/actionbus/actionbus/internal/planner"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/run"
	"github.com/actionbus/actionbus/internal/stack"
)

// devKeyID names dev mode's operator key: the approver it authenticates
// is dev-operator. devConsoleKeyID names the console's gateway key.
const (
	devKeyID        = "dev-operator"
	devConsoleKeyID = "dev-console"
)

type devFlags struct {
	host          string
	port          int
	store         string
	executors     int
	slots         int
	scenarios     []string
	demoScenario  string
	prompt        string
	noDemo        bool
	exitAfterDemo bool
	latency       time.Duration
	openAIURL     string
	openAIModel   string
	plannerMode   string
	console       string
	auditorKey    string
	static        bool
}

func devCmd(g *globals) *cobra.Command {
	var f devFlags
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run an embedded NATS server with JetStream and all four services in one process, then a demo run",
		Long: `dev starts an embedded nats-server with JetStream on a loopback port,
provisions every stream, consumer and bucket, starts the dispatcher, the
script planner, the auditor and --executors executors hosting the
delivery-ops example actions, and runs a demo whose steps print live.

Other terminals can use the same server: actionbus --nats nats://HOST:PORT run ...`,
		RunE: func(cmd *cobra.Command, _ []string) error { return runDev(cmd.Context(), g, f) },
	}
	cmd.Flags().StringVar(&f.host, "host", "127.0.0.1", "loopback address to listen on")
	cmd.Flags().IntVar(&f.port, "port", 4222, "port to listen on (-1 picks a free one)")
	cmd.Flags().StringVar(&f.store, "store", "", "JetStream store directory (default: a temporary directory removed at exit)")
	cmd.Flags().IntVar(&f.executors, "executors", 2, "executor instances (0: none; executors of pool default run elsewhere)")
	cmd.Flags().IntVar(&f.slots, "slots", 2, "slots per executor")
	cmd.Flags().StringSliceVar(&f.scenarios, "scenarios", nil, "extra scenario files or directories (JSON or YAML), read once at start: restart dev to load a changed or new file")
	cmd.Flags().StringVar(&f.demoScenario, "demo", "delivery-retry", "scenario of the demo run")
	cmd.Flags().StringVar(&f.prompt, "prompt", "Which failed delivery jobs can we retry?", "prompt of the demo run")
	cmd.Flags().BoolVar(&f.noDemo, "no-demo", false, "start everything but run no demo")
	cmd.Flags().BoolVar(&f.exitAfterDemo, "exit-after-demo", false, "stop after the demo run (exit code 0 only if it completed)")
	cmd.Flags().DurationVar(&f.latency, "latency", 60*time.Millisecond, "simulated I/O time of each delivery action")
	cmd.Flags().StringVar(&f.openAIURL, "openai-base-url", "", "plan with the openai provider against this OpenAI-compatible endpoint instead of the script (key from ACTIONBUS_OPENAI_API_KEY or OPENAI_API_KEY)")
	cmd.Flags().StringVar(&f.openAIModel, "openai-model", "gpt-4o-mini", "model of the openai provider")
	cmd.Flags().StringVar(&f.plannerMode, "planner-mode", planner.ModeNativeTools, "openai provider mode: native_tools or envelope")
	cmd.Flags().StringVar(&f.auditorKey, "auditor-key-file", audit.DefaultKeyFile(), "the auditor's signing key (nkeys seed), created with its public key in FILE.pub on first start; `audit verify` pins that public key")
	cmd.Flags().BoolVar(&f.static, "no-operator", false, "run the server without accounts or authentication (one account, every connection trusted) instead of operator mode")
	cmd.Flags().StringVar(&f.console, "console", "127.0.0.1:8642", "serve the web console and HTTP API on this loopback address (a free port when it is taken; \"off\": none)")
	return cmd
}

func runDev(ctx context.Context, g *globals, f devFlags) error {
	if ip := net.ParseIP(f.host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("--host %q is not a loopback address; dev mode has no authentication", f.host)
	}
	if f.executors < 0 || f.slots < 1 {
		return fmt.Errorf("--executors must be 0 or more and --slots 1 or more (got %d and %d)", f.executors, f.slots)
	}
	if f.store == "" {
		dir, err := os.MkdirTemp("", "actionbus-dev-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		f.store = dir
	}
	eo := embedded.Options{Host: f.host, Port: f.port, StoreDir: f.store}
	var ops *accounts.Store
	if !f.static {
		// Operator mode, as deployed: the services' ACTIONBUS account,
		// the default tenant an account of its own, added at run time.
		var err error
		if ops, err = devOperatorStore(filepath.Join(f.store, "operator"), g.prefix); err != nil {
			return err
		}
		eo.OperatorDir = ops.Dir
	}
	ns, err := embedded.Start(eo)
	if err != nil {
		return err
	}
	defer func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	}()
	url := ns.ClientURL()
	// nc provisions and hosts the services (ACTIONBUS's admin in operator
	// mode); the demo, the console and the printed commands act as the
	// default tenant's client and approver users, from its own account.
	connOpts := []nats.Option{nats.Name("actionbus-dev")}
	cliCreds := ""
	if ops != nil {
		cliCreds = ops.CredsFile(accounts.ServiceAccount, "admin")
		connOpts = append(connOpts, nats.UserCredentials(cliCreds))
	}
	nc, err := nats.Connect(url, connOpts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	var serviceConnect func(user string) (*nats.Conn, error)
	tenantCreds, approverCreds := "", ""
	clientNC, approverNC := nc, nc
	if ops != nil {
		if tenantCreds, err = devDefaultTenant(ctx, url, ops); err != nil {
			return err
		}
		approverCreds = ops.CredsFile(events.DefaultTenant, accounts.ApproverUser(events.DefaultTenant))
		tenantConnect := func(creds string) (*nats.Conn, error) {
			return nats.Connect(url, nats.Name("actionbus-dev-tenant"), nats.UserCredentials(creds),
				nats.CustomInboxPrefix(client.InboxPrefix(events.DefaultTenant)))
		}
		if clientNC, err = tenantConnect(tenantCreds); err != nil {
			return err
		}
		defer clientNC.Close()
		if approverNC, err = tenantConnect(approverCreds); err != nil {
			return err
		}
		defer approverNC.Close()
		serviceConnect = func(user string) (*nats.Conn, error) {
			return nats.Connect(url, nats.Name("actionbus-dev-"+user), nats.UserCredentials(ops.ServiceCredsFile(user)),
				nats.CustomInboxPrefix(accounts.InboxPrefix(strings.SplitN(user, "-", 2)[0])))
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if err := (bus.Topology{Prefix: g.prefix}).Provision(ctx, js); err != nil {
		return err
	}

	script, known, err := demo.Script(f.scenarios...)
	if err != nil {
		return err
	}
	var provider planner.Provider = script
	plannerDesc := fmt.Sprintf("script: %d scenarios", known)
	if f.openAIURL != "" {
		if provider, err = planner.NewOpenAI(planner.OpenAIConfig{BaseURL: f.openAIURL, Model: f.openAIModel, Mode: f.plannerMode, APIKey: planner.APIKeyFromEnv()}); err != nil {
			return err
		}
		plannerDesc = fmt.Sprintf("openai: %s at %s, %s", f.openAIModel, f.openAIURL, f.plannerMode)
	}
	// Dev mode signs and checks approvals with keys made for this
	// process: dev-operator's own (the demo and actionbus approve use it)
	// and the console's gateway key (it signs for its token's user).
	approvalKey, consoleKey := make([]byte, 32), make([]byte, 32)
	if _, err := rand.Read(approvalKey); err != nil {
		return err
	}
	if _, err := rand.Read(consoleKey); err != nil {
		return err
	}
	var auditCfg audit.Config
	auditorKey := "a key for this process only"
	if f.auditorKey != "" {
		seed, created, err := audit.LoadOrCreateKey(f.auditorKey)
		if err != nil {
			return err
		}
		auditCfg.Seed = seed
		auditorKey = f.auditorKey
		if created {
			auditorKey += " (created)"
		}
	}
	store := demo.NewStore()
	st, err := stack.Start(ctx, nc, stack.Config{
		Audit:  auditCfg,
		Prefix: g.prefix, Provider: provider, Executors: f.executors, NoExecutors: f.executors == 0, Slots: f.slots,
		Register: func(ex *executor.Executor) error {
			if _, err := builtin.Register(ex, builtin.Config{}); err != nil {
				return err
			}
			return demo.Register(ex, demo.Options{Latency: f.latency, Store: store})
		},
		Logger:     g.logger(),
		Connect:    serviceConnect,
		Dispatcher: dispatch.Config{ApprovalKeys: policy.Keys{devKeyID: {Secret: approvalKey}, devConsoleKeyID: {Secret: consoleKey, Gateway: true}}},
	})
	if err != nil {
		return err
	}
	defer st.Stop()
	header := fmt.Sprintf("actionbus dev: NATS with JetStream at %s (store %s)\n", url, f.store)
	if ops != nil {
		header += fmt.Sprintf("  operator mode: operator store %s; services connect as their ACTIONBUS users\n", ops.Dir) +
			fmt.Sprintf("  tenant default: client creds %s, approver creds %s\n", tenantCreds, approverCreds) +
			fmt.Sprintf("  admin creds: %s\n", cliCreds)
	}
	fmt.Fprint(g.out, header)
	fmt.Fprintf(g.out, "  services: dispatcher, planner (%s), auditor, %d executors × %d slots\n", plannerDesc, f.executors, f.slots)
	fmt.Fprintf(g.out, "  auditor key: %s, public key %s\n", auditorKey, st.AuditorKey())
	if f.console != "off" {
		srv, addr, err := devConsole(ctx, g, clientNC, approverNC, f.console, consoleKey)
		if err != nil {
			return err
		}
		defer srv.stop() // before the services and NATS stop
		fmt.Fprintf(g.out, "  console: %s\n", addr)
	}

	if !f.noDemo {
		c, err := client.New(clientNC, client.Options{Prefix: g.prefix, Source: "/actionbus/dev"})
		if err != nil {
			return err
		}
		approver, err := client.New(approverNC, client.Options{Prefix: g.prefix, Source: "/actionbus/dev"})
		if err != nil {
			return err
		}
		fmt.Fprintf(g.out, "\ndemo: %q (scenario %s)\n", f.prompt, f.demoScenario)
		p := newProgress(g.out)
		p.onStep = func(s client.Step) {
			if s.Name != string(run.StepAwaitingApproval) {
				return
			}
			// In production an operator answers with actionbus approve;
			// the dev demo approves at once so it runs unattended.
			id, _ := s.Details["approvalId"].(string)
			fmt.Fprintf(g.out, "         ⚑ approval %s requested; dev mode approves it as dev-operator (in production: %s approve %s)\n", id, selfCommand(), id)
			if err := approver.Approve(ctx, id, devKeyID, approvalKey); err != nil {
				fmt.Fprintf(g.errOut, "actionbus: approving %s: %v\n", id, err)
			}
		}
		req := client.RunRequest{Prompt: f.prompt, Scenario: f.demoScenario, UserID: "dev",
			AllowedModes: []string{"read", "draft", "dryRun", "mutate"}}
		if err := startWith(ctx, g, c, req, 2*time.Minute, p); err != nil || f.exitAfterDemo {
			return err
		}
	}
	// The commands a user tries act as the default tenant's users.
	target, approveTarget := url, url
	if tenantCreds != "" {
		target, approveTarget = url+" --creds "+tenantCreds, url+" --creds "+approverCreds
	}
	self := selfCommand()
	fmt.Fprintf(g.out, "\nserving; try in another terminal:\n  %s --nats %s run --scenario echo \"hello\"\n  %s --nats %s actions\n", self, target, self, target)
	// Dev mode's key is made for this process only; printing it is how an
	// operator approves here (a production key is never printed).
	fmt.Fprintf(g.out, "approve a pending action (this dev server's own approval key):\n  %s=%s:%s %s --nats %s approve APPROVAL_ID\nCtrl-C stops.\n",
		approvalKeyEnv, devKeyID, base64.StdEncoding.EncodeToString(approvalKey), self, approveTarget)
	<-ctx.Done()
	return nil
}

// devConsole serves the console and HTTP API for dev mode, with a token
// made for this process (all roles, as user dev-operator) in the printed
// address's fragment, and dev mode's approval key. It returns that address.
func devConsole(ctx context.Context, g *globals, nc, approverNC *nats.Conn, addr string, approvalKey []byte) (*consoleServer, string, error) {
	if host, _, err := net.SplitHostPort(addr); err != nil || !isLoopback(host) {
		return nil, "", fmt.Errorf("--console %q is not a loopback address; dev mode's console has one built-in token", addr)
	}
	c, err := client.New(nc, client.Options{Prefix: g.prefix, Source: "/actionbus/console", Tenant: g.tenant})
	if err != nil {
		return nil, "", err
	}
	token, entry, err := httpapi.NewToken("dev-operator", httpapi.RoleRead, httpapi.RoleRun, httpapi.RoleApprove)
	if err != nil {
		return nil, "", err
	}
	ap, err := client.New(approverNC, client.Options{Prefix: g.prefix, Source: "/actionbus/console", Tenant: g.tenant})
	if err != nil {
		return nil, "", err
	}
	cfg := httpapi.Config{Client: c, Approver: ap, ApprovalKeyID: devConsoleKeyID, ApprovalKey: approvalKey, Tokens: httpapi.Tokens{Tokens: []httpapi.Token{entry}}}
	srv, err := startConsole(ctx, g, cfg, addr, "", "")
	if err != nil {
		// The default port is taken (another dev server): any free one.
		host, _, _ := net.SplitHostPort(addr)
		if srv, err = startConsole(ctx, g, cfg, net.JoinHostPort(host, "0"), "", ""); err != nil {
			return nil, "", err
		}
	}
	return srv, srv.URL() + "#token=" + token, nil
}

func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

// devOperatorStore opens dev mode's operator store in dir, or creates it
// (a --store kept across runs keeps its keys and tenants).
func devOperatorStore(dir, prefix string) (*accounts.Store, error) {
	if _, err := os.Stat(filepath.Join(dir, "operator.nk")); err == nil {
		return accounts.Open(dir)
	}
	return accounts.Init(dir, accounts.InitOptions{Prefix: prefix, OperatorName: "actionbus-dev"})
}

// devDefaultTenant adds the default tenant to the running server as
// `actionbus tenant add default` does (a store that has it already has it
// in the server's resolver directory too), and returns its client's creds
// file.
func devDefaultTenant(ctx context.Context, url string, s *accounts.Store) (string, error) {
	creds := s.CredsFile(events.DefaultTenant, accounts.ClientUser(events.DefaultTenant))
	if _, err := os.Stat(creds); err == nil {
		return creds, nil
	}
	tn, err := s.AddTenant(events.DefaultTenant, accounts.Limits{})
	if err != nil {
		return "", err
	}
	sys, err := nats.Connect(url, nats.Name("actionbus-dev-sys"), nats.UserCredentials(s.CredsFile(accounts.SystemAccount, accounts.SystemUser)))
	if err != nil {
		return "", err
	}
	defer sys.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := accounts.Push(ctx, sys, tn.JWT); err != nil {
		return "", err
	}
	return creds, nil
}
