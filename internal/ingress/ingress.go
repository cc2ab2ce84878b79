// Package ingress is the one writer of the requests stream. Tenants (and
// the services' own clients) publish run requests, cancels, inputs and
// approvals' answers on their run subjects,
// {prefix}.run.{tenant}.{runId}.{verb}, which the tenant accounts import
// as services; the ingress answers them in a queue group, and publishes
// each event into the requests stream itself, under the services-only
// subject [events.Subjects.Ingested]:
//
//   - the tenant comes from the subject alone (the import fixes it);
//   - only the CloudEvents headers cross (ce-*, Content-Type, and the
//     W3C trace headers): every Nats-* header — message ids, expected
//     last sequences and message ids, rollups, schedules, TTLs — is
//     dropped, so nothing a tenant writes asks the stream about another
//     tenant's messages;
//   - the message id is the ingress's: "<tenant>.<the client's message id
//     or the event id>", so republishing still deduplicates, per tenant,
//     and never across tenants.
//
// The publisher is answered with the stream's publish acknowledgement, as
// JetStream would answer it (nats.go's js.Publish works unchanged), or a
// JetStream-shaped error; the answer goes only to an inbox or a service
// import's response subject, never to an arbitrary reply subject.
package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// QueueGroup is the queue group every ingress answers in.
const QueueGroup = "actionbus-ingress"

// Defaults of [Config].
const (
	DefaultConcurrency = 256
	DefaultTimeout     = 10 * time.Second
)

// Config configures a [Service].
type Config struct {
	// Prefix is the subject prefix; default "ab".
	Prefix string
	// Concurrency bounds the publishes in flight; default 256. Requests
	// beyond it wait in the subscription's pending buffer.
	Concurrency int
	// Timeout bounds one publish into the stream; default 10 s.
	Timeout time.Duration
	// Logger receives the service's logs; nil discards them.
	Logger *slog.Logger
	// MarkFirstOfRun stores a run's request that is its run's first
	// message in the requests stream marked so ([FirstOfRunHeader]); set
	// it only where [MarksFirstOfRun] says so of the stream. Default
	// false: nothing is marked.
	MarkFirstOfRun bool
}

func (c *Config) setDefaults() {
	if c.Prefix == "" {
		c.Prefix = events.DefaultPrefix
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Validate reports configuration errors.
func (c *Config) Validate() error {
	if c.Concurrency < 1 || c.Timeout <= 0 {
		return errors.New("ingress: Concurrency and Timeout must be positive")
	}
	return bus.Topology{Prefix: c.Prefix}.Validate()
}

// Service is the ingress. Several instances (one per dispatcher) share
// one queue group: each request is stored and answered once.
type Service struct {
	cfg      Config
	nc       *nats.Conn
	js       jetstream.JetStream
	subjects events.Subjects
	log      *slog.Logger
	slots    chan struct{}
	wg       sync.WaitGroup
	subs     []*nats.Subscription
	mu       sync.Mutex
	stopped  bool
	stopOnce sync.Once
}

// New returns an ingress on nc. It serves once started.
func New(nc *nats.Conn, cfg Config) (*Service, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return &Service{cfg: cfg, nc: nc, js: js, subjects: events.MustSubjects(cfg.Prefix),
		log: cfg.Logger.With("service", "ingress"), slots: make(chan struct{}, cfg.Concurrency)}, nil
}

// Start subscribes to every request subject and returns once the server
// has the subscriptions. Call Stop when done.
func (s *Service) Start() error {
	for _, subject := range s.subjects.RequestSubjects() {
		sub, err := s.nc.QueueSubscribe(subject, QueueGroup, s.dispatch)
		if err != nil {
			s.Stop()
			return err
		}
		s.subs = append(s.subs, sub)
	}
	return s.nc.Flush()
}

// Stop unsubscribes and waits for the publishes in hand to be answered.
func (s *Service) Stop() {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		s.stopped = true
		s.mu.Unlock()
		for _, sub := range s.subs {
			_ = sub.Unsubscribe()
		}
		s.wg.Wait()
	})
}

// dispatch serves one request on a goroutine of its own, at most
// Concurrency at once.
func (s *Service) dispatch(m *nats.Msg) {
	s.slots <- struct{}{}
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		<-s.slots
		return // the publisher's retry reaches another instance
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer func() { <-s.slots; s.wg.Done() }()
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
		defer cancel()
		answer := s.serve(ctx, m)
		if answer == nil || !bus.AnswerableReply(m.Reply) {
			return
		}
		if err := s.nc.Publish(m.Reply, answer); err != nil {
			s.log.Debug("answer failed", "err", err)
		}
	}()
}

// serve stores one request and returns the publisher's answer; nil when
// the stream did not answer (a leader being elected, a server going
// away): the publisher is then not answered at all, so its publish times
// out as it would have against the stream itself, and its retry (same
// message id, deduplicated) stores the request once.
func (s *Service) serve(ctx context.Context, m *nats.Msg) []byte {
	out, err := Ingest(s.subjects, m)
	if err != nil {
		return ErrorAnswer(err)
	}
	publish := func() (*jetstream.PubAck, error) {
		return s.js.PublishMsg(ctx, out, jetstream.WithRetryAttempts(10), jetstream.WithRetryWait(100*time.Millisecond))
	}
	first := s.cfg.MarkFirstOfRun && markFirstOfRun(s.subjects, m.Subject, out)
	ack, err := publish()
	if first && bus.IsRevisionConflict(err) {
		// The run has a message stored already: this request is stored
		// as any other, unmarked (a republished one is deduplicated).
		unmarkFirstOfRun(out)
		ack, err = publish()
	}
	if err != nil {
		var api *jetstream.APIError
		if !errors.As(err, &api) {
			s.log.Warn("store failed; the publisher retries", "subject", out.Subject, "err", err)
			return nil
		}
		return ErrorAnswer(err)
	}
	body, err := json.Marshal(ack)
	if err != nil {
		return ErrorAnswer(err)
	}
	return body
}

// Ingest builds the message the ingress stores for m, a request published
// on a run subject: the stored subject names the subject's tenant, run and
// verb ([events.Subjects.Ingested]); the headers are m's CloudEvents
// headers only ([Carried]); the message id is [MsgID]. A subject that is
// not a request subject of a valid tenant is refused (invalid_tenant,
// subject_mismatch).
func Ingest(subjects events.Subjects, m *nats.Msg) (*nats.Msg, error) {
	tenant, runID, verb, ok := subjects.RequestFromSubject(m.Subject)
	if !ok {
		return nil, actionbus.Errorf(actionbus.CodeSubjectMismatch, "not a request subject")
	}
	if err := events.CheckTenant(tenant); err != nil {
		return nil, err
	}
	out := &nats.Msg{Subject: subjects.Ingested(tenant, runID, verb), Header: nats.Header{}, Data: m.Data}
	for k, v := range m.Header {
		if Carried(k) {
			out.Header[k] = v
		}
	}
	if id := MsgID(tenant, m.Header); id != "" {
		out.Header.Set(jetstream.MsgIDHeader, id)
	}
	return out, nil
}

// FirstOfRunHeader marks a run's request that the ingress stored as the
// first message of its run in the requests stream: the stream stored it
// only if it held no message on the run's subjects
// (Nats-Expected-Last-Subject-Sequence 0 over {prefix}.run.{tenant}.{runId}.>),
// decided by the stream's leader as it stored it. Only the ingress writes
// the stream, and no publisher's header crosses ([Carried]), so the mark is
// the ingress's word: the dispatcher admits a run so marked, on its first
// delivery, without reading the stream to tell whether an earlier request
// of the run is stored. A request stored unmarked (by an ingress before
// this mark, or not the run's first) is told by reading. Only a stream of
// one replica has its requests marked ([MarksFirstOfRun]).
const FirstOfRunHeader = "Ab-First-Of-Run"

// MarksFirstOfRun reports whether a requests stream of configuration cfg
// has its runs' first requests marked ([FirstOfRunHeader]), and the mark
// believed: only a stream of one replica. A replicated stream's leader
// checks an expectation over a filter subject against the messages it has
// applied and those in flight under the filter only (nats-server 2.15):
// a cancel of the run proposed but not yet applied, or a request an
// ingress without the mark stored, is not seen, and the mark could name a
// request that is not its run's first. The dispatcher then reads the
// stream instead. The ingress and the dispatcher read cfg as they start:
// after a change of the stream's replicas, restart the dispatchers.
func MarksFirstOfRun(cfg jetstream.StreamConfig) bool { return cfg.Replicas <= 1 }

// markFirstOfRun asks the stream to store out, a request stored for the
// request subject subject, only as its run's first message, marked so
// ([FirstOfRunHeader]); false for any other verb than requested.
func markFirstOfRun(subjects events.Subjects, subject string, out *nats.Msg) bool {
	tenant, runID, verb, ok := subjects.RequestFromSubject(subject)
	if !ok || verb != events.RequestedVerb {
		return false
	}
	out.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
	out.Header.Set(jetstream.ExpectedLastSubjSeqSubjHeader, subjects.Run(tenant, runID, ">"))
	out.Header.Set(FirstOfRunHeader, "1")
	return true
}

// unmarkFirstOfRun drops what markFirstOfRun set.
func unmarkFirstOfRun(out *nats.Msg) {
	out.Header.Del(jetstream.ExpectedLastSubjSeqHeader)
	out.Header.Del(jetstream.ExpectedLastSubjSeqSubjHeader)
	out.Header.Del(FirstOfRunHeader)
}

// Carried reports whether a publisher's header crosses into the stored
// event: the CloudEvents binding's headers (ce-*, Content-Type for the
// structured mode) and the W3C trace context (traceparent, tracestate),
// matched case-insensitively. Nothing else does: no Nats-* header, so
// no expectation, message id, rollup, schedule or TTL of the publisher's
// reaches the stream.
func Carried(name string) bool {
	n := strings.ToLower(name)
	return strings.HasPrefix(n, "ce-") || n == "content-type" || n == "traceparent" || n == "tracestate"
}

// maxIDLen bounds the publisher's part of a message id.
const maxIDLen = 128

// MsgID returns the message id the ingress stores a tenant's request
// under: "<tenant>.<id>", where id is the publisher's Nats-Msg-Id, or the
// event's id (ce-id) when it sent none; "" (no deduplication) when it
// sent neither or an id over 128 bytes. The tenant is the subject's, so
// two tenants' ids never collide, and one tenant's republished request
// still deduplicates within the stream's window.
func MsgID(tenant string, h nats.Header) string {
	id := h.Get(jetstream.MsgIDHeader)
	if id == "" {
		id = h.Get("ce-id")
	}
	if id == "" || len(id) > maxIDLen {
		return ""
	}
	return tenant + "." + id
}

// apiError is JetStream's error answer, which nats.go's js.Publish
// decodes into a *jetstream.APIError.
type apiError struct {
	Code        int    `json:"code"`
	ErrorCode   uint16 `json:"err_code,omitempty"`
	Description string `json:"description"`
}

// ErrorAnswer renders err as a JetStream publish error answer
// ({"error":{"code","err_code","description"}}): a JetStream API error
// as the stream gave it, any other error with its actionbus code in the
// description ("<code>: <message>") and HTTP-like status 400 (refused)
// or 503 (the stream did not answer).
func ErrorAnswer(err error) []byte {
	var out apiError
	var api *jetstream.APIError
	switch {
	case errors.As(err, &api):
		out = apiError{Code: api.Code, ErrorCode: uint16(api.ErrorCode), Description: api.Description}
	case actionbus.CodeOf(err) != actionbus.CodeInternal:
		out = apiError{Code: http.StatusBadRequest, Description: string(actionbus.CodeOf(err)) + ": " + err.Error()}
	default:
		out = apiError{Code: http.StatusServiceUnavailable, Description: string(actionbus.CodeInternal) + ": the requests stream did not answer"}
	}
	body, _ := json.Marshal(struct {
		Error apiError `json:"error"`
	}{out})
	return body
}
