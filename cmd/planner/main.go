// Command planner runs the actionbus planner service with the script
// provider (scenarios from files, plus the built-in demo scenarios).
package main

import (
	"flag"
	"log/slog"
	"os"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus/internal/demo"
	"github.com/actionbus/actionbus/internal/planner"
	"github.com/actionbus/actionbus/internal/service"
)

func main() {
	var c service.Common
	c.Flags(flag.CommandLine)
	scenarios := flag.String("scenarios", service.Env("ACTIONBUS_SCENARIOS", ""), "comma-separated scenario files or directories (env ACTIONBUS_SCENARIOS)")
	concurrency := flag.Int("concurrency", service.EnvInt("ACTIONBUS_CONCURRENCY", 16), "decisions made at once (env ACTIONBUS_CONCURRENCY)")
	flag.Parse()
	os.Exit(service.Main("planner", c, func(nc *nats.Conn, log *slog.Logger) (service.Runner, error) {
		all, err := demo.Scenarios()
		if err != nil {
			return nil, err
		}
		if *scenarios != "" {
			extra, err := planner.LoadScenarios(strings.Split(*scenarios, ",")...)
			if err != nil {
				return nil, err
			}
			for k, v := range extra {
				all[k] = v
			}
		}
		script, err := planner.NewScript(all)
		if err != nil {
			return nil, err
		}
		return planner.New(nc, planner.Config{Prefix: c.Prefix, Provider: script, Concurrency: *concurrency, Logger: log})
	}))
}
