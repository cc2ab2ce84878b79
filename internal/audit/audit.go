// Package audit is the auditor service: it consumes every stream of the
// deployment and publishes one audit record per event on the run's audit
// subject ({prefix}.audit.{runId}.{kind}), with payloads minimized by the
// payload policy before anything is written. Records of a run form one
// hash chain across kinds (each record hashes the previous one), so
// removing or altering a record is detectable. Sinks (JSON lines, SQLite)
// copy the audit stream to durable stores, each from its own consumer.
//
// The auditor never changes or acknowledges on behalf of other services; it
// has its own durable consumers. It is not an access-control layer: who
// may read the live run streams (full payloads) is a matter of NATS
// permissions.
package audit

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/actions/actionstore"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/canonical"
	"github.com/actionbus/actionbus/internal/metrics"
	"github.com/actionbus/actionbus/internal/payload"
)

// Config configures a [Service].
type Config struct {
	// Prefix is the subject prefix; default "ab".
	Prefix string
	// Concurrency bounds events audited at once per consumer; default 16.
	Concurrency int
	// FlushAfter is how long a run's records wait for more records of the
	// run before they are appended together, in one message; default
	// 100ms. A batch whose last record came less than PullLinger+25ms ago
	// waits until then (up to twice FlushAfter), so that a record of an
	// event stored before it, read a burst later by another consumer,
	// takes its place in the same append. MaxBatch records are appended
	// at once. The events stay unacknowledged until their records are
	// stored.
	FlushAfter time.Duration
	// MaxBatch bounds the records of one append; default 64 (at most
	// 256, what the audit.appended schema allows).
	MaxBatch int
	// AckEvery spaces the acknowledgements of each consumer: one
	// acknowledges every event up to the last whose record, and every
	// record before it, is stored; default 50ms.
	AckEvery time.Duration
	// PullLinger is how long the auditor waits, once it has audited
	// everything its consumers held, before it asks them again: it reads
	// events in bursts, waking once per PullLinger under a trickle of
	// runs instead of once per event; default 50ms. Negative reads each
	// event as it is stored.
	PullLinger time.Duration
	// Logger receives the auditor's logs; nil discards them.
	Logger *slog.Logger
	// Payload is the default payload policy; actions override it with
	// their own audit policy. The zero value means payload.Default;
	// unset modes take payload.Default's.
	Payload payload.Policy
	// Metrics records audit records and event handling; nil records
	// nothing.
	Metrics *metrics.Metrics
	// Sinks are fed from the audit stream while the auditor runs, each
	// from its own durable consumer. The caller opens and closes them.
	Sinks []Sink
	// Seed is the auditor's signing key: an nkeys account seed ("SA...",
	// see [LoadOrCreateKey]). The last record of every append is signed
	// with it. Nil draws a key for this process only, which no verifier
	// can pin across a restart: tests and throwaway stacks only.
	Seed []byte
}

// Service is the auditor service.
type Service struct {
	cfg    Config
	js     jetstream.JetStream
	bus    *bus.Bus
	topo   bus.Topology
	log    *slog.Logger
	build  *Builder
	chains *chains
	key    ed25519.PrivateKey
	pub    string
	// maxRecord bounds one record's encoding (see [Fit]).
	maxRecord int
}

// New returns an auditor using nc.
// DefaultConcurrency is how many events an auditor audits at once per
// stream unless configured.
const DefaultConcurrency = 16

// Batching and reading defaults (Config.FlushAfter, Config.MaxBatch,
// Config.AckEvery, Config.PullLinger).
const (
	DefaultFlushAfter = 100 * time.Millisecond
	DefaultMaxBatch   = 64
	DefaultAckEvery   = 50 * time.Millisecond
	DefaultPullLinger = 50 * time.Millisecond
	maxBatchLimit     = 256
	// settleMargin is what a batch waits for more records past its last,
	// beyond a PullLinger (see flushWait): a consumer's burst handled.
	settleMargin = 25 * time.Millisecond
)

func (c *Config) setDefaults() {
	if c.Prefix == "" {
		c.Prefix = events.DefaultPrefix
	}
	if c.Concurrency <= 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.FlushAfter <= 0 {
		c.FlushAfter = DefaultFlushAfter
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.AckEvery <= 0 {
		c.AckEvery = DefaultAckEvery
	}
	if c.PullLinger == 0 {
		c.PullLinger = DefaultPullLinger
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	// Each payload mode not given takes the default policy's.
	if c.Payload.Input == "" {
		c.Payload.Input = payload.Default.Input
	}
	if c.Payload.Output == "" {
		c.Payload.Output = payload.Default.Output
	}
	if c.Payload.Error == "" {
		c.Payload.Error = payload.Default.Error
	}
}

// Validate reports configuration errors: an unknown payload mode, a bad
// redaction path, a prefix that is not a subject token.
func (c *Config) Validate() error {
	if c.MaxBatch > maxBatchLimit {
		return fmt.Errorf("audit: MaxBatch %d is over %d", c.MaxBatch, maxBatchLimit)
	}
	if err := c.Payload.Validate(); err != nil {
		return err
	}
	return bus.Topology{Prefix: c.Prefix}.Validate()
}

func New(nc *nats.Conn, cfg Config) (*Service, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger.With("service", "auditor")
	eb, err := bus.Open(nc, bus.BusConfig{Prefix: cfg.Prefix, Source: "/actionbus/auditor", Logger: log, ReceiverValidates: true})
	if err != nil {
		return nil, err
	}
	if cfg.Seed == nil {
		if cfg.Seed, err = NewKey(); err != nil {
			return nil, err
		}
	}
	key, err := keyPair(cfg.Seed)
	if err != nil {
		return nil, fmt.Errorf("audit: auditor key: %w", err)
	}
	pub, _ := key.PublicKey()
	private, err := signingKey(key)
	if err != nil {
		return nil, fmt.Errorf("audit: auditor key: %w", err)
	}
	js := eb.JetStream()
	s := &Service{key: private, pub: pub, cfg: cfg, js: js, bus: eb, topo: bus.Topology{Prefix: cfg.Prefix}, log: log,
		build: &Builder{Defaults: cfg.Payload, Prefix: cfg.Prefix}}
	// A record takes at most an eighth of the server's max payload, an
	// append at most half: the seal, the envelope and the headers fit in
	// the rest whatever the records hold.
	maxPayload := bus.MaxPayload(nc)
	s.maxRecord = min(DefaultMaxRecordBytes, maxPayload/8)
	s.chains = newChains(cfg.FlushAfter, max(cfg.PullLinger, 0)+settleMargin, cfg.MaxBatch, maxPayload/2, s.append)
	return s, nil
}

// Run audits until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	if err := s.topo.Check(ctx, s.js, s.topo.Needs("auditor", "")); err != nil {
		return err
	}
	catKV, err := s.js.KeyValue(ctx, s.topo.BucketCatalog())
	if err != nil {
		return err
	}
	view, err := actionstore.NewCatalog(catKV, actionstore.WithLogger(s.log)).Follow(ctx, s.js, 0)
	if err != nil {
		return err
	}
	s.build.Lookup = func(name string) (*actions.AuditPolicy, string) {
		e, err := view.Get(ctx, name)
		if err != nil {
			return nil, ""
		}
		return e.AuditPolicy, string(e.Mode)
	}
	// Appends outlive a canceled ctx, so that records waiting in a batch
	// when the auditor stops are stored and their events acknowledged.
	s.chains.ctx = context.WithoutCancel(ctx)
	g, gctx := errgroup.WithContext(ctx)
	stop := context.AfterFunc(gctx, s.chains.stop)
	defer stop()
	for _, c := range s.topo.Needs("auditor", "").Consumers {
		cons, err := s.js.Consumer(ctx, c.Stream, c.Config.Durable)
		if err != nil {
			return err
		}
		name := c.Config.Durable
		// A run's events are audited in the order they were stored, so
		// its chain ends with its terminal record.
		opts := bus.ServeOptions{Name: name, Concurrency: s.cfg.Concurrency, OrderBy: s.bus.Subjects().RunIDFromSubject, Linger: max(s.cfg.PullLinger, 0)}
		if s.cfg.Metrics != nil {
			opts.Observer = s.cfg.Metrics
		}
		var acks *acks
		if cons.CachedInfo().Config.AckPolicy == jetstream.AckAllPolicy {
			// Provisioned as declared: events are acknowledged by
			// position. (A consumer provisioned before has each event
			// acknowledged until it is provisioned again.)
			acks = newAcks(name, cons, s.cfg.AckEvery, s.log)
			opts.AckAll = acks
		}
		g.Go(func() error {
			if acks == nil {
				return s.bus.Serve(gctx, cons, opts, s.handler(nil))
			}
			served := make(chan struct{})
			acked := make(chan struct{})
			go func() { defer close(acked); acks.run(gctx, served) }()
			err := s.bus.Serve(gctx, cons, opts, s.handler(acks))
			close(served)
			<-acked
			return err
		})
	}
	for _, sink := range s.cfg.Sinks {
		g.Go(func() error { return RunSink(gctx, s.bus, s.topo, sink) })
	}
	s.log.Info("auditor serving", "auditor_key", s.pub)
	return g.Wait()
}

// ChainHash is the hash of a record: SHA-256 over the RFC 8785 canonical
// JSON of the record with its hash and sig fields empty (prevHash, and in
// format 2 v, n, source and signer, included).
func ChainHash(rec events.AuditRecorded) string {
	rec.Hash, rec.Sig = "", ""
	b, err := canonical.Marshal(rec)
	if err != nil {
		b, _ = json.Marshal(rec) // a record always has a canonical form
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Verify checks a run's chain of records in order: each record's hash is
// right and names its predecessor. It returns the index of the first broken
// record, or -1. It checks no signature: [Check] does.
func Verify(records []events.AuditRecorded) int {
	prev := ""
	for i, r := range records {
		if r.PrevHash != prev || ChainHash(r) != r.Hash {
			return i
		}
		prev = r.Hash
	}
	return -1
}

// HasTerminal reports whether a run's chain holds its terminal record
// (run completed, failed or canceled). The chain of a run that ended and
// lacks it was cut off: [Verify] cannot see that, since every remaining
// link is intact.
func HasTerminal(records []events.AuditRecorded) bool {
	for _, r := range records {
		if r.Kind == KindRun && (r.Status == "completed" || r.Status == "failed" || r.Status == "canceled") {
			return true
		}
	}
	return false
}

// PublicKey is the auditor's public key ("A..."), which verifiers pin.
func (s *Service) PublicKey() string { return s.pub }

// CheckReady reports whether the streams, consumers and buckets the
// auditor needs exist (the /readyz probe).
func (s *Service) CheckReady(ctx context.Context) error {
	return s.topo.Check(ctx, s.js, s.topo.Needs("auditor", ""))
}

// Behind compares a sink's copy of a run's chain with the chain on the
// audit stream and says how the sink falls short: its last record is
// followed on the stream by more (a tail cut back to an earlier signed
// append, such as the duplicates a forgery left after the run's terminal
// record), or is not on the stream although earlier ones are (a sink that
// went its own way). Records are matched by hash, so a stream whose
// oldest records aged out still matches. It returns "" when the sink's
// last record is the stream's last, or when the two share no record.
func Behind(sink, stream []events.AuditRecorded) string {
	if len(sink) == 0 {
		return ""
	}
	at := make(map[string]int, len(stream))
	for i, r := range stream {
		at[r.Hash] = i
	}
	last := sink[len(sink)-1]
	if j, ok := at[last.Hash]; ok {
		if more := len(stream) - 1 - j; more > 0 {
			return fmt.Sprintf("truncated: the audit stream holds %d more record(s) after the sink's last (record %d)", more, len(sink))
		}
		return ""
	}
	for _, r := range sink {
		if _, ok := at[r.Hash]; ok {
			return fmt.Sprintf("diverges: the sink's last record (record %d) is not on the audit stream, which holds the records before it", len(sink))
		}
	}
	return ""
}
