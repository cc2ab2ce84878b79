// Command executor runs an actionbus executor hosting the built-in example
// actions. Your own executor is a program like this one that registers your
// actions (see examples/custom-executor).
package main

import (
	"flag"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/demo"
	"github.com/actionbus/actionbus/internal/service"
)

func main() {
	var c service.Common
	var cfg executor.Config
	c.Flags(flag.CommandLine)
	flag.StringVar(&cfg.Pool, "pool", service.Env("ACTIONBUS_POOL", "default"), "executor pool (env ACTIONBUS_POOL)")
	flag.IntVar(&cfg.Slots, "slots", service.EnvInt("ACTIONBUS_SLOTS", 8), "concurrent actions (env ACTIONBUS_SLOTS)")
	flag.StringVar(&cfg.ID, "id", service.Env("ACTIONBUS_EXECUTOR_ID", ""), "executor id (env ACTIONBUS_EXECUTOR_ID; default host-pid-random)")
	latency := flag.Duration("demo-latency", 0, "simulated I/O time of the demo delivery actions")
	flag.Parse()
	os.Exit(service.Main("executor", c, func(nc *nats.Conn, log *slog.Logger) (service.Runner, error) {
		cfg.Prefix, cfg.Logger, cfg.ShutdownGrace = c.Prefix, log, 10*time.Second
		ex, err := executor.New(nc, cfg)
		if err != nil {
			return nil, err
		}
		return ex, demo.Register(ex, demo.Options{Latency: *latency})
	}))
}
