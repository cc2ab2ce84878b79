// Command executor runs an actionbus executor hosting the built-in actions
// (read_url always; web_search, workspace files and sqlite_query when
// configured) and the delivery-ops example pack. Your own executor is a
// program like this one that registers your actions (see
// examples/custom-executor).
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/builtin"
	"github.com/actionbus/actionbus/internal/demo"
	"github.com/actionbus/actionbus/internal/mcpmount"
	"github.com/actionbus/actionbus/internal/metrics"
	"github.com/actionbus/actionbus/internal/service"
)

func main() {
	var c service.Common
	var cfg executor.Config
	var bc builtin.Config
	c.Flags(flag.CommandLine)
	flag.StringVar(&cfg.Pool, "pool", service.Env("ACTIONBUS_POOL", "default"), "executor pool (env ACTIONBUS_POOL)")
	flag.IntVar(&cfg.Slots, "slots", service.EnvInt("ACTIONBUS_SLOTS", 8), "concurrent actions (env ACTIONBUS_SLOTS)")
	flag.StringVar(&cfg.ID, "id", service.Env("ACTIONBUS_EXECUTOR_ID", ""), "executor id (env ACTIONBUS_EXECUTOR_ID; default host-pid-random)")
	flag.StringVar(&cfg.JetStreamDomain, "js-domain", service.Env("ACTIONBUS_JS_DOMAIN", ""), "JetStream domain of the cluster, when connected through a leaf node (deploy/nats/leaf.conf: actionbus) (env ACTIONBUS_JS_DOMAIN)")
	latency := flag.Duration("demo-latency", 0, "simulated I/O time of the demo delivery actions")
	flag.StringVar(&bc.SearchEndpoint, "search-endpoint", service.Env("ACTIONBUS_SEARCH_ENDPOINT", ""), "SearxNG-style JSON search endpoint for web_search (env ACTIONBUS_SEARCH_ENDPOINT)")
	flag.StringVar(&bc.WorkspaceRoot, "workspace", service.Env("ACTIONBUS_WORKSPACE", ""), "directory of the workspace file actions (env ACTIONBUS_WORKSPACE)")
	flag.StringVar(&bc.SQLitePath, "sqlite", service.Env("ACTIONBUS_SQLITE", ""), "database of sqlite_query, opened read-only (env ACTIONBUS_SQLITE)")
	tenants := flag.String("tenants", service.Env("ACTIONBUS_TENANTS", ""), "comma-separated tenants the pool is dedicated to (env ACTIONBUS_TENANTS; default: every tenant)")
	shell := flag.Bool("shell", service.Env("ACTIONBUS_SHELL", "") == "1", "register shell over --workspace, with the safe command profile (env ACTIONBUS_SHELL=1)")
	shellTest := flag.String("shell-test-command", service.Env("ACTIONBUS_SHELL_TEST_COMMAND", ""), "the project's test command, allowed to shell as an argv prefix, space-separated (env ACTIONBUS_SHELL_TEST_COMMAND)")
	shellNet := flag.Bool("shell-allow-network", false, "let shell commands use the network (default: a network namespace of their own)")
	shellTimeout := flag.Duration("shell-timeout", 30*time.Second, "bound of one shell command; its whole sandbox is killed then")
	shellProcs := flag.Uint64("shell-max-processes", 128, "processes one shell command's sandbox may hold (a pids cgroup)")
	shellRO := flag.String("shell-read-only", service.Env("ACTIONBUS_SHELL_READ_ONLY", ""), "comma-separated host paths shell commands may read besides the workspace and /usr, /etc, /bin, /lib (env ACTIONBUS_SHELL_READ_ONLY)")
	shellUnlisted := flag.Bool("shell-approve-unlisted", false, "register shell_unlisted: commands outside the profile, each after an approval")
	mcpFile := flag.String("mcp", service.Env("ACTIONBUS_MCP", ""), "JSON file of MCP servers to mount: [{name, command, env} or {name, url, headers}, trusted?] (env ACTIONBUS_MCP)")
	allow := flag.String("net-allow", service.Env("ACTIONBUS_NET_ALLOW", ""), "comma-separated addresses or prefixes read_url and web_search may reach although private or loopback (env ACTIONBUS_NET_ALLOW)")
	flag.Parse()
	os.Exit(service.Main("executor", c, func(nc *nats.Conn, log *slog.Logger, m *metrics.Metrics) (service.Runner, error) {
		cfg.Prefix, cfg.Logger, cfg.ShutdownGrace, cfg.Observer = c.Prefix, log, 10*time.Second, m
		if *tenants != "" {
			cfg.Tenants = strings.Split(*tenants, ",")
		}
		var err error
		if bc.Net.Allow, err = builtin.ParseAllow(strings.Split(*allow, ",")); err != nil {
			return nil, err
		}
		if *shell {
			bc.Shell = &builtin.ShellConfig{TestCommand: strings.Fields(*shellTest), AllowNetwork: *shellNet, ApproveUnlisted: *shellUnlisted,
				Timeout: *shellTimeout, MaxProcesses: *shellProcs}
			if *shellRO != "" {
				bc.Shell.ReadOnlyPaths = strings.Split(*shellRO, ",")
			}
		}
		ex, err := executor.New(nc, cfg)
		if err != nil {
			return nil, err
		}
		// The workspace and database stay open until the process exits.
		if _, err := builtin.Register(ex, bc); err != nil {
			return nil, err
		}
		if *mcpFile != "" {
			servers, err := mcpmount.Load(*mcpFile)
			if err != nil {
				return nil, err
			}
			for _, sc := range servers {
				// Mounted for the process's life; their tools go to the
				// catalog with the executor's other actions.
				if _, err := mcpmount.Start(context.Background(), ex, sc, log); err != nil {
					return nil, err
				}
			}
		}
		return ex, demo.Register(ex, demo.Options{Latency: *latency})
	}))
}
