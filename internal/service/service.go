// Package service holds what the four service binaries share: flags with
// environment defaults, the logger, the NATS connection with reconnects,
// and the run-until-signal lifecycle. It keeps cmd/<service>/main.go thin.
package service

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	_ "net/http/pprof" // registers /debug/pprof on the debug address only
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
)

// Common are the settings every service has.
type Common struct {
	NATSURL string
	Prefix  string
	Verbose bool
}

// Env returns the value of key, or def.
func Env(key, def string) string {
	if v, ok := os.LookupEnv(key); ok && v != "" {
		return v
	}
	return def
}

// EnvInt returns the integer value of key, or def.
func EnvInt(key string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(key)); err == nil {
		return v
	}
	return def
}

// EnvDuration returns the duration value of key ("90s", "2m"), or def.
func EnvDuration(key string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(key)); err == nil {
		return v
	}
	return def
}

// Flags registers the common flags on fs, defaulting to NATS_URL,
// ACTIONBUS_PREFIX and ACTIONBUS_VERBOSE.
func (c *Common) Flags(fs *flag.FlagSet) {
	fs.StringVar(&c.NATSURL, "nats", Env("NATS_URL", nats.DefaultURL), "NATS server URL (env NATS_URL)")
	fs.StringVar(&c.Prefix, "prefix", Env("ACTIONBUS_PREFIX", "ab"), "subject prefix (env ACTIONBUS_PREFIX)")
	fs.BoolVar(&c.Verbose, "v", Env("ACTIONBUS_VERBOSE", "") != "", "debug logging (env ACTIONBUS_VERBOSE)")
}

// Logger returns a JSON logger on stderr.
func (c *Common) Logger(name string) *slog.Logger {
	level := slog.LevelInfo
	if c.Verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// Runner is a service.
type Runner interface{ Run(context.Context) error }

// Main connects to NATS, builds the service with build, runs it until
// SIGINT or SIGTERM, drains the connection and returns the exit code.
func Main(name string, c Common, build func(*nats.Conn, *slog.Logger) (Runner, error)) int {
	log := c.Logger(name)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Each service gets its own inbox prefix, so that least-privilege users
	// (deploy/nats) can receive replies only on their own inboxes.
	nc, err := nats.Connect(c.NATSURL, nats.Name("actionbus-"+name), nats.CustomInboxPrefix("_INBOX_"+name), nats.MaxReconnects(-1),
		nats.ReconnectWait(500*time.Millisecond), nats.RetryOnFailedConnect(true),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			log.Error("nats async error", "subject", subject, "err", err)
		}))
	if err != nil {
		log.Error("connect", "url", c.NATSURL, "err", err)
		return 1
	}
	defer func() { _ = nc.Drain() }()
	svc, err := build(nc, log)
	if err != nil {
		log.Error("configure", "err", err)
		return 2
	}
	if addr := os.Getenv("ACTIONBUS_DEBUG_ADDR"); addr != "" {
		// pprof for profiling (make bench reads the heap); never exposed
		// by default.
		srv := &http.Server{Addr: addr, Handler: http.DefaultServeMux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("debug server", "addr", addr, "err", err)
			}
		}()
		defer srv.Close()
	}
	if err := svc.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		log.Error("stopped", "err", err)
		fmt.Fprintln(os.Stderr, name+":", err)
		return 1
	}
	log.Info("stopped")
	return 0
}
