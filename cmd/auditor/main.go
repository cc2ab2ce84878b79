// Command auditor runs the actionbus auditor service.
package main

import (
	"flag"
	"log/slog"
	"os"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus/internal/audit"
	"github.com/actionbus/actionbus/internal/service"
)

func main() {
	var c service.Common
	c.Flags(flag.CommandLine)
	concurrency := flag.Int("concurrency", service.EnvInt("ACTIONBUS_CONCURRENCY", 16), "events audited at once per stream (env ACTIONBUS_CONCURRENCY)")
	flag.Parse()
	os.Exit(service.Main("auditor", c, func(nc *nats.Conn, log *slog.Logger) (service.Runner, error) {
		return audit.New(nc, audit.Config{Prefix: c.Prefix, Concurrency: *concurrency, Logger: log})
	}))
}
