// Command auditor runs the actionbus auditor service.
package main

import (
	"flag"
	"log/slog"
	"os"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus/internal/audit"
	"github.com/actionbus/actionbus/internal/metrics"
	"github.com/actionbus/actionbus/internal/payload"
	"github.com/actionbus/actionbus/internal/service"
)

func main() {
	c := service.Common{Nice: service.AuditorNice}
	c.Flags(flag.CommandLine)
	concurrency := flag.Int("concurrency", service.EnvInt("ACTIONBUS_CONCURRENCY", audit.DefaultConcurrency), "events audited at once per stream (env ACTIONBUS_CONCURRENCY)")
	flushAfter := flag.Duration("flush-after", service.EnvDuration("ACTIONBUS_AUDIT_FLUSH_AFTER", audit.DefaultFlushAfter), "how long a run's records wait for more of its records before they are appended together (env ACTIONBUS_AUDIT_FLUSH_AFTER)")
	maxBatch := flag.Int("max-batch", service.EnvInt("ACTIONBUS_AUDIT_MAX_BATCH", audit.DefaultMaxBatch), "records of one append at most, up to 256 (env ACTIONBUS_AUDIT_MAX_BATCH)")
	ackEvery := flag.Duration("ack-every", service.EnvDuration("ACTIONBUS_AUDIT_ACK_EVERY", audit.DefaultAckEvery), "spacing of each consumer's acknowledgements, each covering every event up to the last whose record and all before it are stored (env ACTIONBUS_AUDIT_ACK_EVERY)")
	pullLinger := flag.Duration("pull-linger", service.EnvDuration("ACTIONBUS_AUDIT_PULL_LINGER", audit.DefaultPullLinger), "how long the auditor waits, once it has read everything stored, before it reads again (events in bursts, not one wake per event); negative reads each event as it is stored (env ACTIONBUS_AUDIT_PULL_LINGER)")
	var pol payload.Policy
	flag.StringVar(&pol.Input, "audit-input", service.Env("ACTIONBUS_AUDIT_INPUT", payload.Default.Input), "default input payload mode: full, redacted, hash, omit (env ACTIONBUS_AUDIT_INPUT)")
	flag.StringVar(&pol.Output, "audit-output", service.Env("ACTIONBUS_AUDIT_OUTPUT", payload.Default.Output), "default output payload mode: full, redacted, summary, hash, omit (env ACTIONBUS_AUDIT_OUTPUT)")
	flag.StringVar(&pol.Error, "audit-error", service.Env("ACTIONBUS_AUDIT_ERROR", payload.Default.Error), "default error payload mode: full, redacted, summary, omit (env ACTIONBUS_AUDIT_ERROR)")
	redact := flag.String("redact-paths", service.Env("ACTIONBUS_REDACT_PATHS", ""), "comma-separated JSON Pointers redacted in every payload, e.g. /password,/token (env ACTIONBUS_REDACT_PATHS)")
	jsonl := flag.String("sink-jsonl", service.Env("ACTIONBUS_SINK_JSONL", ""), "copy the audit stream to this JSON-lines file (env ACTIONBUS_SINK_JSONL)")
	sqlitePath := flag.String("sink-sqlite", service.Env("ACTIONBUS_SINK_SQLITE", ""), "copy the audit stream to this SQLite database (env ACTIONBUS_SINK_SQLITE)")
	keyFile := flag.String("key-file", service.Env("ACTIONBUS_AUDITOR_KEY_FILE", audit.DefaultKeyFile()), "the auditor's signing key, an nkeys account seed; created (with its public key in FILE.pub) when missing (env ACTIONBUS_AUDITOR_KEY_FILE)")
	flag.Parse()
	if *redact != "" {
		pol.RedactPaths = strings.Split(*redact, ",")
	}
	os.Exit(service.Main("auditor", c, func(nc *nats.Conn, log *slog.Logger, m *metrics.Metrics) (service.Runner, error) {
		var seed []byte
		if *keyFile != "" {
			var err error
			var created bool
			if seed, created, err = audit.LoadOrCreateKey(*keyFile); err != nil {
				return nil, err
			}
			if created {
				log.Info("auditor key created", "file", *keyFile)
			}
		} else {
			log.Warn("no auditor key file: signing with a key for this process only, which verifiers cannot pin across a restart")
		}
		var sinks []audit.Sink
		if *jsonl != "" {
			s, err := audit.OpenJSONL(*jsonl)
			if err != nil {
				return nil, err
			}
			sinks = append(sinks, s)
		}
		if *sqlitePath != "" {
			s, err := audit.OpenSQLite(*sqlitePath)
			if err != nil {
				return nil, err
			}
			sinks = append(sinks, s)
		}
		// The sinks stay open until the process exits; each write is
		// synced before it is acknowledged.
		return audit.New(nc, audit.Config{Prefix: c.Prefix, Concurrency: *concurrency, FlushAfter: *flushAfter, MaxBatch: *maxBatch, AckEvery: *ackEvery, PullLinger: *pullLinger, Logger: log, Payload: pol, Sinks: sinks, Metrics: m, Seed: seed})
	}))
}
