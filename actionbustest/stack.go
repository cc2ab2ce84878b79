package actionbustest

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/accounts"
	"github.com/actionbus/actionbus/internal/audit"
	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/planner"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/stack"
)

// StackOptions configures [Server.StartStack].
type StackOptions struct {
	// Scenarios is a scenario document (YAML or JSON) for the script
	// planner: {scenarios: {NAME: {decisions: [...]}}}.
	Scenarios string
	// Executors is the number of executor instances; default 1.
	Executors int
	// Slots per executor; default 8.
	Slots int
	// Register registers your actions on each executor instance.
	Register func(*executor.Executor) error
	// Executor is the base configuration of every executor instance, for
	// settings such as MaxOutputBytes, DefaultTimeout or ShutdownGrace;
	// its ID, Pool, Prefix and Logger are the stack's, and Slots above,
	// when set, wins.
	Executor executor.Config
	// Limits bound the dispatcher's runs (cycles, plans, parallelism,
	// deadlines, sizes, budgets); zero fields take their defaults
	// (events.RunLimits). Timers have second precision.
	Limits events.RunLimits
	// NoAuditor leaves the auditor out.
	NoAuditor bool
	// NoPlanner leaves the planner out, for tests of stalled decisions.
	NoPlanner bool
	// NoExecutors starts no executor: the test runs its own (for example
	// as separate processes).
	NoExecutors bool
	// NoDispatcher starts no dispatcher: the test runs its own (for
	// example as a separate process).
	NoDispatcher bool
	// Policy is a policy document (JSON: explicit per-action policy,
	// required roles and scopes).
	Policy string
	// ApprovalKeys verify approval tokens: "kid:base64secret,...".
	ApprovalKeys string
	// OpenAI, when set, makes the planner use the openai provider against
	// that endpoint (for example a scripted chat-completions server on
	// loopback) instead of the script provider.
	OpenAI *OpenAIOptions
	// AuditDefaults is the auditor's default payload policy; nil means
	// input hashed, output and error summarized.
	AuditDefaults *executor.AuditPolicy
	// AuditMaxBatch bounds the records of one audit append (one message
	// on the audit stream); 0 means the auditor's default (64). 1 writes
	// each record on its own.
	AuditMaxBatch int
	// AuditJSONL and AuditSQLite, when set, are files the auditor copies
	// the audit stream to (JSON lines, SQLite).
	AuditJSONL, AuditSQLite string
	// Logger receives every service's logs; nil discards them.
	Logger *slog.Logger
}

// OpenAIOptions point the planner at an OpenAI-compatible endpoint.
type OpenAIOptions struct {
	// BaseURL is the endpoint, e.g. an httptest server's URL.
	BaseURL string
	APIKey  string
	// Model is the model name sent with every call; default "test-model".
	Model string
	// Mode is "native_tools" (default) or "envelope".
	Mode string
	// CallTimeout bounds each LLM call; default 60 s.
	CallTimeout time.Duration
	// Prices is the planner's price table (model to USD per million
	// tokens); nil prices nothing.
	Prices map[string]events.Price
}

// Stack is the four services running in the test's process.
type Stack struct {
	// Client publishes and follows runs.
	Client *client.Client
	// Executors are the executor instances, in start order.
	Executors []*executor.Executor
	// AuditorKey is the auditor's public key, which audit verification
	// pins ("" without an auditor).
	AuditorKey string
}

// StartStack starts the dispatcher, the script planner, the auditor and
// opts.Executors executors (with your actions) against the server, and
// returns once they serve. Everything stops, and is checked to have stopped
// cleanly, in t.Cleanup.
func (s *Server) StartStack(t testing.TB, opts StackOptions) *Stack {
	t.Helper()
	scenarios := map[string]planner.Scenario{}
	if opts.Scenarios != "" {
		var err error
		if scenarios, err = planner.ParseScenarios([]byte(opts.Scenarios)); err != nil {
			t.Fatalf("actionbustest: %v", err)
		}
	}
	script, err := planner.NewScript(scenarios)
	if err != nil {
		t.Fatalf("actionbustest: %v", err)
	}
	var provider planner.Provider = script
	if opts.OpenAI != nil {
		o := *opts.OpenAI // the caller's options stay as given
		if o.Model == "" {
			o.Model = "test-model"
		}
		if provider, err = planner.NewOpenAI(planner.OpenAIConfig{BaseURL: o.BaseURL, APIKey: o.APIKey, Model: o.Model, Mode: o.Mode,
			CallTimeout: o.CallTimeout, MaxRetries: -1, Prices: o.Prices}); err != nil {
			t.Fatalf("actionbustest: %v", err)
		}
	}
	var pol *policy.Config
	if opts.Policy != "" {
		if pol, err = policy.ParseConfig([]byte(opts.Policy)); err != nil {
			t.Fatalf("actionbustest: %v", err)
		}
	}
	keys, err := policy.ParseKeys(opts.ApprovalKeys)
	if err != nil {
		t.Fatalf("actionbustest: %v", err)
	}
	var ac audit.Config
	ac.MaxBatch = opts.AuditMaxBatch
	if opts.AuditDefaults != nil {
		ac.Payload = *opts.AuditDefaults
	}
	if opts.AuditJSONL != "" {
		sink, err := audit.OpenJSONL(opts.AuditJSONL)
		if err != nil {
			t.Fatalf("actionbustest: %v", err)
		}
		t.Cleanup(func() { _ = sink.Close() })
		ac.Sinks = append(ac.Sinks, sink)
	}
	if opts.AuditSQLite != "" {
		sink, err := audit.OpenSQLite(opts.AuditSQLite)
		if err != nil {
			t.Fatalf("actionbustest: %v", err)
		}
		t.Cleanup(func() { _ = sink.Close() })
		ac.Sinks = append(ac.Sinks, sink)
	}
	// In operator mode every service connects as its own ACTIONBUS user,
	// as deployed.
	var connect func(user string) (*nats.Conn, error)
	if s.accounts != nil {
		connect = func(user string) (*nats.Conn, error) {
			return s.DialCreds(s.accounts.ServiceCredsFile(user), nats.Name(t.Name()+"-"+user),
				nats.CustomInboxPrefix(accounts.InboxPrefix(strings.SplitN(user, "-", 2)[0])))
		}
	}
	st, err := stack.Start(context.Background(), s.Connect(t), stack.Config{
		Audit: ac, Logger: opts.Logger, Connect: connect,
		Prefix: s.Prefix, Provider: provider, Executors: opts.Executors, Slots: opts.Slots, Executor: opts.Executor,
		Register: opts.Register, NoAuditor: opts.NoAuditor, NoPlanner: opts.NoPlanner, NoExecutors: opts.NoExecutors, NoDispatcher: opts.NoDispatcher,
		Dispatcher: dispatch.Config{RunLimits: opts.Limits, Policy: pol, ApprovalKeys: keys},
	})
	if err != nil {
		t.Fatalf("actionbustest: start stack: %v", err)
	}
	t.Cleanup(func() {
		if err := st.Stop(); err != nil {
			t.Errorf("actionbustest: stack stopped with errors: %v", err)
		}
	})
	c, err := client.New(s.Connect(t), client.Options{Prefix: s.Prefix})
	if err != nil {
		t.Fatalf("actionbustest: client: %v", err)
	}
	return &Stack{Client: c, Executors: st.Executors, AuditorKey: st.AuditorKey()}
}
