// Command dispatcher runs the actionbus dispatcher service.
package main

import (
	"flag"
	"log/slog"
	"os"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus/internal/dispatch"
	"github.com/actionbus/actionbus/internal/service"
)

func main() {
	var c service.Common
	var cfg dispatch.Config
	c.Flags(flag.CommandLine)
	flag.IntVar(&cfg.MaxCycles, "max-cycles", service.EnvInt("ACTIONBUS_MAX_CYCLES", dispatch.DefaultMaxCycles), "planner cycles per run (env ACTIONBUS_MAX_CYCLES)")
	flag.IntVar(&cfg.MaxPlanActions, "max-plan-actions", service.EnvInt("ACTIONBUS_MAX_PLAN_ACTIONS", dispatch.DefaultMaxPlanActions), "actions per plan, at most 20 (env ACTIONBUS_MAX_PLAN_ACTIONS)")
	flag.IntVar(&cfg.MaxPlanParallel, "max-plan-parallel", service.EnvInt("ACTIONBUS_MAX_PLAN_PARALLEL", dispatch.DefaultMaxPlanParallel), "plan actions in flight (env ACTIONBUS_MAX_PLAN_PARALLEL)")
	flag.IntVar(&cfg.Concurrency, "concurrency", service.EnvInt("ACTIONBUS_CONCURRENCY", 64), "events handled at once (env ACTIONBUS_CONCURRENCY)")
	flag.Parse()
	os.Exit(service.Main("dispatcher", c, func(nc *nats.Conn, log *slog.Logger) (service.Runner, error) {
		cfg.Prefix, cfg.Logger = c.Prefix, log
		return dispatch.New(nc, cfg)
	}))
}
