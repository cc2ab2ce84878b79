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
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus/internal/metrics"
	"github.com/actionbus/actionbus/internal/tracing/otlp"
)

// Common are the settings every service has.
type Common struct {
	NATSURL string
	Prefix  string
	Verbose bool
	// MetricsAddr serves /metrics, /healthz and /readyz when set.
	MetricsAddr string
	// Creds is a NATS credentials file (user JWT and seed), when the
	// deployment uses them instead of a user and password in the URL.
	Creds string
	// Nice is the process's scheduling niceness (Linux; 0 leaves it).
	// The value set before Flags is the default: the auditor's is
	// [AuditorNice], every other service's 0.
	Nice int
}

// AuditorNice is the auditor's default niceness: audit is appended
// behind the runs (within its FlushAfter), never in their critical path,
// so on a host it shares with the run path it yields the CPU to them.
const AuditorNice = 10

// DefaultGCPercent is the services' garbage-collection target when the
// environment sets no GOGC: a collection when the heap has grown by twice
// the live heap, not once (Go's 100). The services allocate for every
// event they handle and keep small live heaps, so collection was a tenth
// of each one's CPU; this halves it, for a heap up to three times the
// live one instead of twice (the dispatcher with 10 000 runs in flight
// stays under 100 MiB, make bench measures it). GOGC set in the
// environment wins.
const DefaultGCPercent = 200

// gcPercent is the GC percent a service sets given the environment's
// GOGC: DefaultGCPercent, or none (false) when GOGC is set.
func gcPercent(gogc string) (int, bool) {
	if gogc != "" {
		return 0, false
	}
	return DefaultGCPercent, true
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
	// The URL may hold a password: it is read from the environment when
	// the service starts, never shown as the flag's default.
	fs.StringVar(&c.NATSURL, "nats", "", "NATS server URL (default $NATS_URL, else "+nats.DefaultURL+")")
	fs.StringVar(&c.Prefix, "prefix", Env("ACTIONBUS_PREFIX", "ab"), "subject prefix (env ACTIONBUS_PREFIX)")
	fs.BoolVar(&c.Verbose, "v", Env("ACTIONBUS_VERBOSE", "") != "", "debug logging (env ACTIONBUS_VERBOSE)")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", Env("ACTIONBUS_METRICS_ADDR", ""), "serve /metrics, /healthz and /readyz on this address, e.g. :9090 (env ACTIONBUS_METRICS_ADDR)")
	fs.StringVar(&c.Creds, "creds", Env("NATS_CREDS", ""), "NATS credentials file (env NATS_CREDS)")
	fs.IntVar(&c.Nice, "nice", EnvInt("ACTIONBUS_NICE", c.Nice), "scheduling niceness of the process, Linux, 0 to 19 (env ACTIONBUS_NICE)")
}

// ReadyChecker is a service that can say whether what it needs exists.
type ReadyChecker interface{ CheckReady(context.Context) error }

// Logger returns a JSON logger on stderr, at debug level when Verbose;
// each service adds its own "service" attribute.
func (c *Common) Logger() *slog.Logger {
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
// build receives the process's metrics (never nil) to record into.
func Main(name string, c Common, build func(*nats.Conn, *slog.Logger, *metrics.Metrics) (Runner, error)) int {
	log := c.Logger()
	if c.NATSURL == "" {
		c.NATSURL = Env("NATS_URL", nats.DefaultURL)
	}
	m := metrics.New()
	if p, ok := gcPercent(os.Getenv("GOGC")); ok {
		debug.SetGCPercent(p)
	}
	if c.Nice != 0 {
		if err := setNice(c.Nice); err != nil {
			log.Warn("niceness not set", "nice", c.Nice, "err", err)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Traces go out over OTLP/HTTP when the OTEL_* environment asks; the
	// spans still buffered are flushed at exit.
	shutdownTraces, err := otlp.Setup(ctx, "actionbus-"+name)
	if err != nil {
		log.Error("traces", "err", err)
		return 2
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdownTraces(sctx); err != nil {
			log.Warn("traces not flushed", "err", err)
		}
	}()
	// Each service gets its own inbox prefix, so that least-privilege users
	// (deploy/nats) can receive replies only on their own inboxes.
	opts := []nats.Option{nats.Name("actionbus-" + name), nats.CustomInboxPrefix("_INBOX_" + name), nats.MaxReconnects(-1),
		nats.ReconnectWait(500 * time.Millisecond), nats.RetryOnFailedConnect(true),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			log.Error("nats async error", "subject", subject, "err", err)
		})}
	if c.Creds != "" {
		opts = append(opts, nats.UserCredentials(c.Creds))
	}
	nc, err := nats.Connect(c.NATSURL, opts...)
	if err != nil {
		log.Error("connect", "url", RedactURL(c.NATSURL), "err", err)
		return 1
	}
	defer func() { _ = nc.Drain() }()
	svc, err := build(nc, log, m)
	if err != nil {
		log.Error("configure", "err", err)
		return 2
	}
	if c.MetricsAddr != "" {
		healthy := func(context.Context) error {
			if !nc.IsConnected() {
				return fmt.Errorf("not connected to NATS (%s)", nc.Status())
			}
			return nil
		}
		ready := func(ctx context.Context) error {
			if err := healthy(ctx); err != nil {
				return err
			}
			if rc, ok := svc.(ReadyChecker); ok {
				return rc.CheckReady(ctx)
			}
			return nil
		}
		srv, err := metrics.Serve(c.MetricsAddr, m, healthy, ready, log)
		if err != nil {
			log.Error("metrics server", "addr", c.MetricsAddr, "err", err)
			return 2
		}
		log.Info("metrics and health", "addr", srv.Addr())
		defer srv.Close()
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
	// A process started before provisioning (a container next to the
	// provision job) waits for what it needs, not ready meanwhile.
	if rc, ok := svc.(ReadyChecker); ok {
		for {
			err := rc.CheckReady(ctx)
			if err == nil || ctx.Err() != nil {
				break
			}
			log.Warn("waiting for the topology (actionbus provision)", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	if err := svc.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		log.Error("stopped", "err", err)
		fmt.Fprintln(os.Stderr, name+":", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

// RedactURL returns a server URL list (comma-separated) with every
// password replaced by "xxxxx", for logs and errors.
func RedactURL(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil {
			parts[i] = u.Redacted()
		} else {
			parts[i] = "<unparsable url>"
		}
	}
	return strings.Join(parts, ",")
}
