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
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/gowebpki/jcs"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/events"
	"github.com/actionbus/actionbus/internal/keymutex"
	"github.com/actionbus/actionbus/internal/metrics"
)

// Config configures a [Service].
type Config struct {
	// Prefix is the subject prefix; default "ab".
	Prefix string
	// Concurrency bounds events audited at once per consumer; default 16.
	Concurrency int
	// Logger receives the auditor's logs; nil discards them.
	Logger *slog.Logger
	// Payload is the default payload policy; actions override it with
	// their own audit policy. The zero value means DefaultPayloadPolicy;
	// unset modes take DefaultPayloadPolicy's.
	Payload PayloadPolicy
	// Metrics records audit records and event handling; nil records
	// nothing.
	Metrics *metrics.Metrics
	// Sinks are fed from the audit stream while the auditor runs, each
	// from its own durable consumer. The caller opens and closes them.
	Sinks []Sink
}

// Service is the auditor service.
type Service struct {
	cfg    Config
	js     jetstream.JetStream
	bus    *events.Bus
	topo   events.Topology
	log    *slog.Logger
	locks  *keymutex.Striped
	stream jetstream.Stream
	build  *Builder

	// heads caches the last record (hash and stream sequence) of each
	// active run's chain, so appending usually skips a read. A stale head
	// fails the append (expected last sequence) and is re-read.
	headsMu sync.Mutex
	heads   map[string]chainHead
}

type chainHead struct {
	hash string
	seq  uint64
}

const maxHeads = 20000

// New returns an auditor using nc.
// DefaultConcurrency is how many events an auditor audits at once per
// stream unless configured.
const DefaultConcurrency = 16

func (c *Config) setDefaults() {
	if c.Prefix == "" {
		c.Prefix = events.DefaultPrefix
	}
	if c.Concurrency <= 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	// Each payload mode not given takes the default policy's.
	if c.Payload.Input == "" {
		c.Payload.Input = DefaultPayloadPolicy.Input
	}
	if c.Payload.Output == "" {
		c.Payload.Output = DefaultPayloadPolicy.Output
	}
	if c.Payload.Error == "" {
		c.Payload.Error = DefaultPayloadPolicy.Error
	}
}

// Validate reports configuration errors: an unknown payload mode, a bad
// redaction path, a prefix that is not a subject token.
func (c *Config) Validate() error {
	if err := c.Payload.Validate(); err != nil {
		return err
	}
	return events.Topology{Prefix: c.Prefix}.Validate()
}

func New(nc *nats.Conn, cfg Config) (*Service, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger.With("service", "auditor")
	bus, err := events.Open(nc, events.BusConfig{Prefix: cfg.Prefix, Source: "/actionbus/auditor", Logger: log, ReceiverValidates: true})
	if err != nil {
		return nil, err
	}
	js := bus.JetStream()
	return &Service{cfg: cfg, js: js, bus: bus, topo: events.Topology{Prefix: cfg.Prefix}, log: log, locks: keymutex.New(256), heads: map[string]chainHead{},
		build: &Builder{Defaults: cfg.Payload, Prefix: cfg.Prefix}}, nil
}

// Run audits until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	if err := s.topo.Check(ctx, s.js, s.topo.Needs("auditor", "")); err != nil {
		return err
	}
	var err error
	if s.stream, err = s.js.Stream(ctx, s.topo.StreamAudit()); err != nil {
		return err
	}
	catKV, err := s.js.KeyValue(ctx, s.topo.BucketCatalog())
	if err != nil {
		return err
	}
	view, err := actions.NewCatalog(catKV).Watch(ctx)
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
	g, gctx := errgroup.WithContext(ctx)
	for _, c := range s.topo.Needs("auditor", "").Consumers {
		cons, err := s.js.Consumer(ctx, c.Stream, c.Config.Durable)
		if err != nil {
			return err
		}
		name := c.Config.Durable
		g.Go(func() error {
			// A run's events are audited in the order they were stored,
			// so its chain ends with its terminal record.
			opts := events.ServeOptions{Name: name, Concurrency: s.cfg.Concurrency, OrderBy: s.bus.Subjects().RunIDFromSubject}
			if s.cfg.Metrics != nil {
				opts.Observer = s.cfg.Metrics
			}
			return s.bus.Serve(gctx, cons, opts, s.handle)
		})
	}
	for _, sink := range s.cfg.Sinks {
		g.Go(func() error { return RunSink(gctx, s.bus, s.topo, sink) })
	}
	s.log.Info("auditor serving")
	return g.Wait()
}

func (s *Service) handle(ctx context.Context, r *events.Received, _ jetstream.Msg) error {
	rec := s.build.Record(r)
	tenant := events.TenantOr(rec.Tenant)
	subject := s.bus.Subjects().Audit(tenant, rec.RunID, rec.Kind)
	chain := s.bus.Subjects().RunAudit(tenant, rec.RunID)
	unlock := s.locks.Lock(rec.RunID)
	defer unlock()
	for attempt := 0; attempt < 10; attempt++ {
		s.headsMu.Lock()
		head, cached := s.heads[rec.RunID]
		s.headsMu.Unlock()
		prevHash, lastSeq := head.hash, head.seq
		// A run's request is its first record as a rule: its chain is
		// taken to be empty without reading it (the expected sequence 0
		// fails the append when it is not, and the chain is read then).
		first := !cached && attempt == 0 && rec.EventType == events.TypeRunRequested
		if (!cached || attempt > 0) && !first {
			var err error
			if prevHash, lastSeq, err = s.last(ctx, chain); err != nil {
				return err
			}
		}
		rec.PrevHash = prevHash
		rec.Hash = ChainHash(rec)
		e, err := s.bus.New(events.TypeAuditRecorded, events.DerivedID(r.Event.ID(), "audit"), tenant, rec.RunID, &rec)
		if err != nil {
			return events.Permanent(err)
		}
		// One writer per chain: the append fails if any record of the run
		// was stored after the one this record names.
		ack, err := s.bus.Publish(ctx, subject, e, jetstream.WithExpectLastSequenceForSubject(lastSeq, chain))
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
			continue // another auditor extended the chain; re-read it
		}
		if err != nil {
			return err
		}
		s.setHead(rec, ack)
		if !ack.Duplicate {
			s.cfg.Metrics.AuditRecord(rec.Kind)
		}
		return nil
	}
	return fmt.Errorf("audit: run %s: too many concurrent appends", rec.RunID)
}

func (s *Service) setHead(rec events.AuditRecorded, ack *jetstream.PubAck) {
	s.headsMu.Lock()
	defer s.headsMu.Unlock()
	switch {
	case ack.Duplicate:
		// The record was stored before (a redelivery); the cached head
		// may not be the chain's end any more.
		delete(s.heads, rec.RunID)
	case rec.EventType == events.TypeRunCompleted || rec.EventType == events.TypeRunFailed || rec.EventType == events.TypeRunCanceled:
		delete(s.heads, rec.RunID)
	default:
		if len(s.heads) >= maxHeads {
			for k := range s.heads {
				delete(s.heads, k)
				break
			}
		}
		s.heads[rec.RunID] = chainHead{hash: rec.Hash, seq: ack.Sequence}
	}
}

// last returns the hash and stream sequence of the last record matching
// subject, a run's chain filter ("" and 0 when there is none).
func (s *Service) last(ctx context.Context, subject string) (string, uint64, error) {
	msg, err := s.stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, err
	}
	ev, err := events.Decode(msg.Subject, msg.Header, msg.Data)
	if err != nil {
		return "", 0, fmt.Errorf("audit: last record of %s: %w", subject, err)
	}
	var prev events.AuditRecorded
	if err := events.DataAs(ev, &prev); err != nil {
		return "", 0, fmt.Errorf("audit: last record of %s: %w", subject, err)
	}
	return prev.Hash, msg.Sequence, nil
}

// ChainHash is the hash of a record: SHA-256 over the RFC 8785 canonical
// JSON of the record with its hash field empty (prevHash included).
func ChainHash(rec events.AuditRecorded) string {
	rec.Hash = ""
	b, _ := json.Marshal(rec)
	if c, err := jcs.Transform(b); err == nil {
		b = c
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Verify checks a run's chain of records in order: each record's hash is
// right and names its predecessor. It returns the index of the first broken
// record, or -1.
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

// CheckReady reports whether the streams, consumers and buckets the
// auditor needs exist (the /readyz probe).
func (s *Service) CheckReady(ctx context.Context) error {
	return s.topo.Check(ctx, s.js, s.topo.Needs("auditor", ""))
}
