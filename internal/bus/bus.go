package bus

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/jsoncodec"
	"github.com/actionbus/actionbus/internal/tracing"
)

// BusConfig configures a [Bus].
type BusConfig struct {
	// Prefix is the subject prefix; default [events.DefaultPrefix].
	Prefix string
	// Source is the CloudEvent source of published events, e.g.
	// "/actionbus/dispatcher". Required.
	Source string
	// Mode is the content mode of published events; default ModeBinary.
	Mode Mode
	// DataContentType of published data; default application/json.
	DataContentType string
	// Logger receives one line per rejected event; nil discards.
	Logger *slog.Logger
	// ReceiverValidates skips the data-schema check of published events
	// (the CloudEvent envelope is still checked): every receiver validates
	// each event's data against its schema at the trust boundary, so a
	// service does not pay twice for events it produces itself. Default
	// false: a client learns of a bad request at once.
	ReceiverValidates bool
	// JetStreamDomain, when set, reaches JetStream by that domain
	// ($JS.<domain>.API.>): a service connected through a leaf node to a
	// cluster whose JetStream has that domain. Default "": the server
	// connected to.
	JetStreamDomain string
}

func (c *BusConfig) setDefaults() {
	if c.Prefix == "" {
		c.Prefix = events.DefaultPrefix
	}
	if c.DataContentType == "" {
		c.DataContentType = events.ContentTypeJSON
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports configuration errors.
func (c *BusConfig) Validate() error {
	if c.Source == "" {
		return errors.New("events: BusConfig.Source is required")
	}
	if !events.SupportedContentType(c.DataContentType) {
		return fmt.Errorf("events: unsupported DataContentType %q", c.DataContentType)
	}
	if c.Mode != ModeBinary && c.Mode != ModeStructured {
		return fmt.Errorf("events: unknown mode %d", c.Mode)
	}
	_, err := events.NewSubjects(c.Prefix)
	return err
}

// Bus publishes and receives actionbus events on JetStream. It validates
// every event against the catalog and its schema on the way out and on the
// way in. A Bus is safe for concurrent use.
type Bus struct {
	js       jetstream.JetStream
	subjects events.Subjects
	cfg      BusConfig
	log      *slog.Logger
}

// NewBus returns a Bus publishing through js.
func NewBus(js jetstream.JetStream, cfg BusConfig) (*Bus, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := events.CompileSchemas(); err != nil {
		return nil, err
	}
	return &Bus{js: js, subjects: events.MustSubjects(cfg.Prefix), cfg: cfg, log: cfg.Logger}, nil
}

// Open returns a Bus publishing through a new JetStream context on nc; the
// context is [Bus.JetStream].
func Open(nc *nats.Conn, cfg BusConfig) (*Bus, error) {
	js, err := jetstream.New(nc)
	if cfg.JetStreamDomain != "" {
		js, err = jetstream.NewWithDomain(nc, cfg.JetStreamDomain)
	}
	if err != nil {
		return nil, fmt.Errorf("events: jetstream: %w", err)
	}
	return NewBus(js, cfg)
}

// Subjects returns the subjects of the bus's prefix.
func (b *Bus) Subjects() events.Subjects { return b.subjects }

// JetStream returns the underlying JetStream context.
func (b *Bus) JetStream() jetstream.JetStream { return b.js }

// New builds an event of eventType with the given id and data. A non-empty
// tenant and runID are also set as the tenant and runid extensions. The
// event is validated when it is published.
func (b *Bus) New(eventType, id, tenant, runID string, data any, ext ...events.Extension) (*event.Event, error) {
	e := event.New()
	e.SetID(id)
	e.SetType(eventType)
	e.SetSource(b.cfg.Source)
	e.SetTime(time.Now())
	if u := events.SchemaURL(eventType); u != "" {
		e.SetDataSchema(u)
	}
	if runID != "" {
		e.SetExtension(events.ExtRunID, runID)
	}
	if tenant != "" {
		e.SetExtension(events.ExtTenant, tenant)
	}
	for _, x := range ext {
		e.SetExtension(x.Name, x.Value)
	}
	if err := events.SetData(&e, b.cfg.DataContentType, data); err != nil {
		return nil, err
	}
	return &e, nil
}

// Publish validates e and publishes it on subject with Nats-Msg-Id set to the
// event id. A republished event with the same id within the stream's
// duplicate window is stored once (the ack then reports Duplicate).
// Extra options (e.g. jetstream.WithExpectLastSequencePerSubject) are passed
// to JetStream.
func (b *Bus) Publish(ctx context.Context, subject string, e *event.Event, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if err := b.validateOutgoing(e); err != nil {
		return nil, fmt.Errorf("events: publish %s: %w", e.Type(), err)
	}
	msg, err := Encode(subject, e, b.cfg.Mode)
	if err != nil {
		return nil, err
	}
	tracing.Inject(ctx, msg.Header)
	if err := b.checkSize(e.Type(), msg); err != nil {
		return nil, err
	}
	// An acknowledgement lost with a server must not hold the caller
	// until its own deadline: the publish is bounded and can be retried
	// (the event id makes the retry a duplicate).
	if live(e.Type()) {
		if err := b.js.Conn().PublishMsg(msg); err != nil {
			return nil, fmt.Errorf("events: publish %s on %s: %w", e.Type(), subject, err)
		}
		return &jetstream.PubAck{}, nil
	}
	pctx, cancel := context.WithTimeout(ctx, PublishTimeout)
	defer cancel()
	ack, err := b.js.PublishMsg(pctx, msg, opts...)
	if err != nil {
		return nil, fmt.Errorf("events: publish %s on %s: %w", e.Type(), subject, err)
	}
	return ack, nil
}

// Emit builds an event with [Bus.New] and publishes it on the subject the
// catalog gives its type ([events.Subjects.SubjectFor]).
func (b *Bus) Emit(ctx context.Context, eventType, id, tenant, runID, pool string, data any, ext ...events.Extension) (*event.Event, error) {
	e, _, err := b.emit(ctx, eventType, id, tenant, runID, pool, data, ext...)
	return e, err
}

// emit is [Bus.Emit], with the acknowledgement of the publish (empty for
// a live event).
func (b *Bus) emit(ctx context.Context, eventType, id, tenant, runID, pool string, data any, ext ...events.Extension) (*event.Event, *jetstream.PubAck, error) {
	subject, err := b.subjects.SubjectFor(eventType, tenant, runID, pool)
	if err != nil {
		return nil, nil, err
	}
	if eventType == events.TypeActionRequested && pool != "" {
		ext = append(ext, events.Extension{Name: events.ExtPool, Value: pool})
	}
	ext = append(ext, traceExtensions(ctx)...)
	e, err := b.New(eventType, id, tenant, runID, data, ext...)
	if err != nil {
		return nil, nil, err
	}
	ack, err := b.Publish(ctx, subject, e)
	if err != nil {
		return nil, nil, err
	}
	return e, ack, nil
}

// traceExtensions are the distributed-tracing extensions of the run
// context in ctx ([tracing.WithRun]): none when ctx holds none.
func traceExtensions(ctx context.Context) []events.Extension {
	r := tracing.RunFromContext(ctx)
	if r == nil {
		return nil
	}
	ext := []events.Extension{{Name: tracing.ExtTraceParent, Value: r.Parent}}
	if r.State != "" {
		ext = append(ext, events.Extension{Name: tracing.ExtTraceState, Value: r.State})
	}
	return ext
}

// validateOutgoing checks the data of an event about to be published,
// unless receivers validate ([BusConfig.ReceiverValidates]); [Encode]
// checks its envelope. Receivers do not check the data of the dispatcher's
// events (ValidateIncoming): in a test binary they are checked here, so
// that a dispatcher building an invalid event fails its tests.
func (b *Bus) validateOutgoing(e *event.Event) error {
	if !b.cfg.ReceiverValidates || (testing.Testing() && events.FromDispatcher(e.Type())) {
		return events.Validate(e)
	}
	return nil
}

// live reports whether events of eventType go on core NATS only
// ([events.Entry.Live]).
func live(eventType string) bool {
	e, ok := events.Lookup(eventType)
	return ok && e.Live
}

// Schedule headers (JetStream message scheduling).
const (
	HeaderSchedule       = "Nats-Schedule"
	HeaderScheduleTarget = "Nats-Schedule-Target"
)

// TimerEmission returns the schedule of a durable timer: the timer.fired
// event published on the run's schedule subject name, to be copied by the
// server onto the run's timer subject at (rounded up to the second).
func (b *Bus) TimerEmission(id, tenant, name string, at time.Time, t *events.TimerFired) events.Emission {
	at = at.UTC().Truncate(time.Second).Add(time.Second)
	t.DueAt = at
	return events.Emission{
		Type: events.TypeTimerFired, ID: id, Tenant: tenant, RunID: t.RunID, Data: t,
		Ext:     []events.Extension{{Name: events.ExtCycle, Value: t.Cycle}},
		Subject: b.subjects.Schedule(tenant, t.RunID, name),
		Header: nats.Header{
			HeaderSchedule:       []string{"@at " + at.Format(time.RFC3339)},
			HeaderScheduleTarget: []string{b.subjects.Run(tenant, t.RunID, "timer")},
		},
	}
}

// EmitAll validates and publishes several events at once: every publish is
// sent before any acknowledgement is awaited, so a batch costs about one
// round trip. It returns the stream sequence each event was stored at, in
// batch order (0 for a live event, which nothing stores), or the first
// error; events published before it stay published (their ids make a
// retry safe).
func (b *Bus) EmitAll(ctx context.Context, batch []events.Emission) ([]uint64, error) {
	seqs := make([]uint64, len(batch))
	if len(batch) == 1 && batch[0].Subject == "" && batch[0].Header == nil {
		x := batch[0]
		_, ack, err := b.emit(ctx, x.Type, x.ID, x.Tenant, x.RunID, x.Pool, x.Data, x.Ext...)
		if err != nil {
			return nil, err
		}
		seqs[0] = ack.Sequence
		return seqs, nil
	}
	futures := make([]jetstream.PubAckFuture, 0, len(batch))
	stored := make([]int, 0, len(batch)) // the batch index of each future
	traced := traceExtensions(ctx)
	for i, x := range batch {
		subject := x.Subject
		if subject == "" {
			var err error
			if subject, err = b.subjects.SubjectFor(x.Type, x.Tenant, x.RunID, x.Pool); err != nil {
				return nil, err
			}
		}
		e, err := b.New(x.Type, x.ID, x.Tenant, x.RunID, x.Data, append(x.Ext, traced...)...)
		if err != nil {
			return nil, err
		}
		if err := b.validateOutgoing(e); err != nil {
			return nil, fmt.Errorf("events: publish %s: %w", x.Type, err)
		}
		msg, err := Encode(subject, e, b.cfg.Mode)
		if err != nil {
			return nil, err
		}
		for k, v := range x.Header {
			msg.Header[k] = v
		}
		tracing.Inject(ctx, msg.Header)
		if err := b.checkSize(x.Type, msg); err != nil {
			return nil, err
		}
		if live(x.Type) {
			// Live events go out on core NATS with the batch: nothing
			// stores them, so there is no acknowledgement to wait for.
			if err := b.js.Conn().PublishMsg(msg); err != nil {
				return nil, fmt.Errorf("events: publish %s on %s: %w", x.Type, subject, err)
			}
			continue
		}
		f, err := b.js.PublishMsgAsync(msg)
		if err != nil {
			return nil, fmt.Errorf("events: publish %s on %s: %w", x.Type, subject, err)
		}
		futures = append(futures, f)
		stored = append(stored, i)
	}
	// A publish the server never acknowledges (a permissions violation,
	// no stream) must not hang the caller.
	timeout := time.NewTimer(PublishTimeout)
	defer timeout.Stop()
	for k, f := range futures {
		select {
		case ack := <-f.Ok():
			seqs[stored[k]] = ack.Sequence
		case err := <-f.Err():
			return nil, fmt.Errorf("events: publish on %s: %w", f.Msg().Subject, err)
		case <-timeout.C:
			return nil, fmt.Errorf("events: publish on %s: no acknowledgement within %s", f.Msg().Subject, PublishTimeout)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return seqs, nil
}

// checkSize refuses a message the server would refuse: one over the
// connection's max payload (headers included).
func (b *Bus) checkSize(eventType string, msg *nats.Msg) error {
	if err := OverPayload(b.js.Conn(), eventType+" event", int64(len(msg.Data))+headerSize(msg.Header), 0); err != nil {
		return err
	}
	return nil
}

// OverPayload returns a typed payload_too_large error when a message of
// size bytes (what names it: an event, a run state) would not fit the
// server's max payload less headroom (bytes kept for headers), and nil
// otherwise or when nc has no server limit yet. The error names what, its
// size and the limit, so the caller can fail what produced it instead of
// retrying for ever.
func OverPayload(nc *nats.Conn, what string, size, headroom int64) *actionbus.Error {
	if nc == nil {
		return nil
	}
	limit := nc.MaxPayload() - headroom
	if limit <= 0 || size <= limit {
		return nil
	}
	return (&actionbus.Error{Code: actionbus.CodePayloadTooLarge,
		Message: fmt.Sprintf("%s of %d bytes is over the %d bytes the server takes in one message", what, size, limit)}).
		WithDetail("event", what).WithDetail("bytes", size).WithDetail("limit", limit)
}

// headerSize is the size of h as NATS sends it.
func headerSize(h nats.Header) int64 {
	if len(h) == 0 {
		return 0
	}
	n := int64(len("NATS/1.0\r\n\r\n"))
	for k, vs := range h {
		for _, v := range vs {
			n += int64(len(k) + len(": ") + len(v) + len("\r\n"))
		}
	}
	return n
}

// Bounded returns ctx with a PublishTimeout deadline. JetStream writes
// through nats.go (key-value updates included) wait for their
// acknowledgement as long as ctx allows; an acknowledgement lost with a
// server would otherwise hold the caller, and any lock it holds, for ever.
func Bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, PublishTimeout)
}

// PublishTimeout bounds the wait for JetStream to acknowledge a batch.
const PublishTimeout = 10 * time.Second

// Receive decodes, validates and types a consumed message, and checks it
// against its subject ([events.Subjects.CheckBinding]). The error is an
// *actionbus.Error; hand it to [Bus.Reject].
func (b *Bus) Receive(subject string, h nats.Header, body []byte) (*events.Received, error) {
	subject = b.subjects.Canonical(subject)
	e, err := Decode(subject, h, body)
	if err != nil {
		return nil, err
	}
	if err := events.ValidateIncoming(e); err != nil {
		return nil, err
	}
	entry, _ := events.Lookup(e.Type())
	data := entry.New()
	if err := events.DataAs(e, data); err != nil {
		return nil, err
	}
	if err := b.subjects.CheckBinding(subject, e, data); err != nil {
		return nil, err
	}
	tenant := events.StringExtension(e, events.ExtTenant)
	return &events.Received{Event: e, Data: data, Subject: subject, Tenant: tenant}, nil
}

// Reject handles a message that failed [Bus.Receive]: it republishes the
// original headers and body under a new id on the rejected-events subject,
// with the reason, and logs once. The caller acks msg when Reject returns
// nil, and naks it (to retry later) otherwise: nothing is lost.
//
// The rejection never speaks for the run the subject names: it publishes
// nothing under another event's id and no run event. A service that must
// answer a rejected event (the dispatcher ends a rejected run request that
// names no existing run) does so in [ServeOptions.OnReject].
func (b *Bus) Reject(ctx context.Context, msg jetstream.Msg, consumer string, reason error) error {
	rej := events.EventRejected{
		OriginalSubject: msg.Subject(),
		OriginalHeaders: boundedHeaders(msg.Headers(), MaxRejectedHeader, MaxRejectedHeaders),
		OriginalData:    msg.Data(),
		Consumer:        consumer,
	}
	cutOriginal(&rej, MaxRejectedData)
	if abErr := new(actionbus.Error); errors.As(reason, &abErr) {
		rej.Reason = *abErr
	} else {
		rej.Reason = actionbus.Error{Code: actionbus.CodeEventRejected, Message: reason.Error()}
	}
	rej.Reason.Details = nil
	if rej.Reason.Message == "" {
		rej.Reason.Message = reason.Error()
	}
	rej.Reason.Message = clip(rej.Reason.Message, MaxRejectedHeader)
	// A fresh id: a derived one could be predicted, and pre-empted, by
	// any other publisher of the rejected stream. A message rejected
	// twice (a lost ack) is recorded twice, with the same stream sequence.
	id := events.NewID()
	stream := "unknown"
	if md, err := msg.Metadata(); err == nil {
		stream = md.Stream
		rej.Stream = md.Stream
		rej.StreamSequence = md.Sequence.Stream
	}
	if runID := b.subjects.RunIDFromSubject(msg.Subject()); events.ValidRunID(runID) {
		rej.RunID = runID
	}
	fitRejection(&rej, b.rejectionBudget())
	if _, err := b.emitRejected(ctx, stream, id, rej); err != nil {
		return fmt.Errorf("events: reject message from %s: %w", msg.Subject(), err)
	}
	b.log.Warn("event rejected", "subject", clip(msg.Subject(), 256), "consumer", consumer,
		"code", rej.Reason.Code, "reason", rej.Reason.Message, "rejected_id", id)
	return nil
}

// Bounds of what a rejection keeps of the original message (see
// [EventRejected]): its body's first MaxRejectedData bytes, each header
// value's first MaxRejectedHeader bytes, MaxRejectedHeaders header values
// in all. The rejection of a message at the server's max payload then
// still fits in one.
const (
	MaxRejectedData    = 32 << 10
	MaxRejectedHeader  = 1 << 10
	MaxRejectedHeaders = 64
)

// rejectionBudget bounds the data of a rejection: a quarter of the
// server's max payload (the envelope's headers and JSON's escaping of
// what the original holds take the rest), at least 4 KiB.
func (b *Bus) rejectionBudget() int { return max(4<<10, MaxPayload(b.js.Conn())/4) }

// DefaultMaxPayload is nats-server's default max payload (1 MiB).
const DefaultMaxPayload = 1 << 20

// MaxPayload is the largest message nc's server takes, or
// DefaultMaxPayload while nc has not learned it (not connected yet).
func MaxPayload(nc *nats.Conn) int {
	if nc != nil && nc.MaxPayload() > 0 {
		return int(nc.MaxPayload())
	}
	return DefaultMaxPayload
}

// fitRejection shrinks what rej keeps of the original message until its
// encoding is within limit bytes — the fixed bounds hold a message at the
// default max payload, not one whose headers JSON escapes six-fold on a
// server with a smaller one: header values to 64 bytes (16 in all), then
// the body to its first KiB, then only the original's subject, size and
// hash. A rejection always fits, so the original is never redelivered for
// ever for want of one.
func fitRejection(rej *events.EventRejected, limit int) {
	fits := func() bool {
		b, err := jsoncodec.Marshal(rej)
		return err == nil && len(b) <= limit
	}
	if fits() {
		return
	}
	rej.OriginalHeaders = boundedHeaders(rej.OriginalHeaders, 64, 16)
	if fits() {
		return
	}
	cutOriginal(rej, 1<<10)
	if fits() {
		return
	}
	rej.OriginalHeaders = nil
	cutOriginal(rej, 0)
	rej.OriginalSubject = clip(rej.OriginalSubject, 256)
	rej.Reason.Message = clip(rej.Reason.Message, 256)
}

// cutOriginal keeps the first n bytes of the original body, with the size
// and hash of the whole (once: a second cut keeps them).
func cutOriginal(rej *events.EventRejected, n int) {
	if len(rej.OriginalData) <= n {
		return
	}
	if rej.OriginalDataHash == "" {
		sum := sha256.Sum256(rej.OriginalData)
		rej.OriginalDataBytes, rej.OriginalDataHash = len(rej.OriginalData), hex.EncodeToString(sum[:])
	}
	rej.OriginalData = rej.OriginalData[:n]
}

// boundedHeaders is what a rejection keeps of the original headers: each
// name and value to valueMax bytes, count values in all (by name order).
func boundedHeaders(h map[string][]string, valueMax, count int) map[string][]string {
	if len(h) == 0 {
		return nil
	}
	out, n := make(map[string][]string, len(h)), 0
	for _, k := range slices.Sorted(maps.Keys(h)) {
		for _, v := range h[k] {
			if n == count {
				return out
			}
			out[clip(k, valueMax)] = append(out[clip(k, valueMax)], clip(v, valueMax))
			n++
		}
	}
	return out
}

func (b *Bus) emitRejected(ctx context.Context, stream, id string, rej events.EventRejected) (*event.Event, error) {
	e, err := b.New(events.TypeEventRejected, id, "", rej.RunID, rej)
	if err != nil {
		return nil, err
	}
	_, err = b.Publish(ctx, b.subjects.Rejected(stream), e)
	return e, err
}

// IsRevisionConflict reports whether a revision-checked write lost to
// another writer: a key-value create of a key that exists, or an update
// or publish whose expected last sequence is no longer the last. The
// caller reads again and retries.
func IsRevisionConflict(err error) bool {
	var apiErr *jetstream.APIError
	// A replicated stream reports the lost race as 10164 where one of a
	// single replica says 10071.
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) ||
		(errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant))
}

// PutRevision writes val at key if the key is still at rev (0: the key
// must not exist yet), the write of a read-modify-write loop; a write that
// lost to another writer is a revision conflict ([IsRevisionConflict]).
func PutRevision(ctx context.Context, kv jetstream.KeyValue, key string, val []byte, rev uint64) error {
	if rev == 0 {
		_, err := kv.Create(ctx, key, val)
		return err
	}
	_, err := kv.Update(ctx, key, val, rev)
	return err
}

// clip cuts s to n bytes for a log line or an error detail.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
