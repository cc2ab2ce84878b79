package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/keymutex"
	"github.com/actionbus/actionbus/internal/tracing"
)

// A run's records are appended to its chain in batches: records wait in
// memory (their events unacknowledged) until FlushAfter has passed since
// the first of them, or MaxBatch records wait, and are then appended as
// one audit.appended message. A batch whose last record came less than a
// settle ago waits that long for more (up to twice FlushAfter): the
// consumers read in bursts, a linger apart, and a record whose event was
// stored earlier may still be on its way (see [flushWait]). A one-action
// run is usually one append, written after the run ended, off its
// critical path. The run's terminal
// event does not end the batch: the auditor reads each stream with its own
// consumer, and a run's request or work item may reach it after the run's
// end; the window lets them join the same append.
//
// Appends of one chain are serialized (one batch at a time, in the order
// the records arrived); the expected-last-sequence check of each append
// keeps a second auditor from interleaving, and the chain head (hash,
// stream sequence, the events already recorded) is kept in memory per run
// while the run is active.

// appendTimeout bounds one append, including its retries.
const appendTimeout = 30 * time.Second

// maxHeads bounds the chain heads kept in memory; maxHeadIDs the event ids
// kept per head (for the duplicate check of redelivered events).
const (
	maxHeads   = 20000
	maxHeadIDs = 1024
)

// batch is the records of one chain waiting to be appended.
type batch struct {
	chain, tenant, runID string
	records              []events.AuditRecorded
	// stored is when each record's event was stored (its stream's
	// timestamp), by which the batch is ordered before it is appended.
	stored []time.Time
	// sizes bound each record's encoding (see [Fit]): an append holds
	// records up to maxBytes.
	sizes []int
	done  []chan<- error
	// trace is the run's starting trace context, the first one its
	// records carry (its append's span joins the run's trace).
	trace *tracing.Run
	// again says a record's event may have its record stored already (it
	// was delivered before): the chain's events are then read from the
	// whole chain, not from its cached head or last append.
	again bool
	timer *time.Timer
	// first and last are when the first and the last record were added.
	first, last time.Time
}

// flushWait is how much longer a batch whose first record was added at
// first and last at last waits at now: until flushAfter has passed since
// its first record and its last record is settle old. The auditor's
// consumers do not read each stream at the same moment (each reads in
// bursts, a linger apart), so a record whose event was stored before the
// last one's may come up to a linger later; appended in the batch, it is
// put in its place (see inStoredOrder), where an append of its own would
// follow the later record. Never past twice flushAfter since the first
// record: a run that never pauses is appended all the same.
func flushWait(first, last, now time.Time, flushAfter, settle time.Duration) time.Duration {
	settled := min(last.Add(settle).Sub(now), first.Add(2*flushAfter).Sub(now))
	return max(first.Add(flushAfter).Sub(now), settled, 0)
}

// head is the end of a chain: the last record's hash and the stream
// sequence of the message holding it, and the ids of the events already
// recorded (all of them while the run is cached, those of the last
// message after a read).
type head struct {
	hash string
	seq  uint64
	ids  map[string]struct{}
	// n is the last record's number (0 for an empty chain or a format-1
	// record).
	n uint64
	// outcomes maps each call (id and attempt) that has an outcome record
	// to the event id of that outcome; full says it covers the whole
	// chain (else only the last message).
	outcomes map[string]string
	full     bool
}

// storedKey names the stored event a record records: its stream and
// sequence (format 2), else (and for a rejection) its event id. A copy of an event stored again
// (the same id at another position) is another stored event.
func storedKey(r events.AuditRecorded) string {
	// A rejection names the rejected event, which may have its own record
	// (and other rejections): it is known by its own id.
	if r.Source != nil && r.Kind != KindRejected {
		return r.Source.Stream + "/" + strconv.FormatUint(r.Source.Seq, 10)
	}
	return r.EventID
}

// unseen returns the records whose events the chain does not hold yet: a
// redelivered event (its ack was lost, or its append's ack was) is not
// recorded twice.
func (h head) unseen(recs []events.AuditRecorded) []events.AuditRecorded {
	out := make([]events.AuditRecorded, 0, len(recs))
	for _, r := range recs {
		if _, dup := h.ids[storedKey(r)]; !dup {
			out = append(out, r)
		}
	}
	return out
}

// chains batches records per chain and keeps the heads of active chains.
type chains struct {
	flushAfter time.Duration
	// settle is how long a batch waits past flushAfter for more records
	// after its last (see flushWait).
	settle   time.Duration
	maxBatch int
	// maxBytes bounds the records of one append (their sizes' sum), well
	// under the server's max payload: the seal and the envelope add to it.
	maxBytes int
	append   func(ctx context.Context, b *batch) error
	// ctx is the context appends run under; it is not canceled when the
	// auditor stops, so that waiting records are still stored.
	ctx   context.Context
	locks *keymutex.Striped

	mu       sync.Mutex
	pending  map[string]*batch
	heads    map[string]head
	stopping bool // records are appended at once: the auditor stops
}

func newChains(flushAfter, settle time.Duration, maxBatch, maxBytes int, appendFn func(context.Context, *batch) error) *chains {
	return &chains{flushAfter: flushAfter, settle: settle, maxBatch: maxBatch, maxBytes: maxBytes, append: appendFn, ctx: context.Background(),
		locks: keymutex.New(256), pending: map[string]*batch{}, heads: map[string]head{}}
}

// add queues rec, whose event was stored at stored and whose encoding is
// at most size bytes, on its chain and returns where the outcome of its
// append is sent. A full batch is appended before add returns.
func (c *chains) add(chain, tenant string, rec events.AuditRecorded, size int, stored time.Time, again bool, tr *tracing.Run) <-chan error {
	done := make(chan error, 1)
	c.mu.Lock()
	now := time.Now()
	b := c.pending[chain]
	if b == nil {
		fresh := &batch{chain: chain, tenant: tenant, runID: rec.RunID, first: now}
		fresh.timer = time.AfterFunc(c.flushAfter, func() { c.flush(chain, fresh, true) })
		c.pending[chain], b = fresh, fresh
	}
	b.last = now
	if b.trace == nil {
		// A caller that does not trace sends a request without a run
		// context; the dispatcher starts the run's trace, and the events
		// it publishes carry it: the append joins that trace rather than
		// starting one of its own.
		b.trace = tr
	}
	b.records = append(b.records, rec)
	b.stored = append(b.stored, stored)
	b.sizes = append(b.sizes, size)
	b.again = b.again || again
	b.done = append(b.done, done)
	full := len(b.records) >= c.maxBatch || c.stopping
	c.mu.Unlock()
	if full {
		c.flush(chain, b, false)
	}
	return done
}

// stop appends every waiting batch now, and every record added from now
// on at once: the auditor is stopping, and its consumers wait for the
// records they handed over before they return.
func (c *chains) stop() {
	c.mu.Lock()
	c.stopping = true
	waiting := make([]string, 0, len(c.pending))
	for chain := range c.pending {
		waiting = append(waiting, chain)
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, chain := range waiting {
		wg.Go(func() { c.flush(chain, nil, false) })
	}
	wg.Wait()
}

// flush appends the batch waiting on chain, MaxBatch records per
// message, and tells each record's event the outcome. Given which, only
// that batch: a flush asked for a batch (full, or its timer fired) that
// another flush appended meanwhile leaves the chain's next batch to its
// own time. Timed (its timer fired), the batch is appended only if it
// waits no longer (see flushWait), judged once the chain's appends before
// it are done; else its timer is set again.
func (c *chains) flush(chain string, which *batch, timed bool) {
	unlock := c.locks.Lock(chain)
	defer unlock()
	c.mu.Lock()
	b := c.pending[chain]
	if b == nil || which != nil && b != which {
		c.mu.Unlock()
		return // appended by an earlier flush
	}
	if timed && !c.stopping {
		if wait := flushWait(b.first, b.last, time.Now(), c.flushAfter, c.settle); wait > 0 {
			b.timer.Reset(wait)
			c.mu.Unlock()
			return
		}
	}
	delete(c.pending, chain)
	c.mu.Unlock()
	b.timer.Stop()
	b.inStoredOrder()
	ctx, cancel := context.WithTimeout(c.ctx, appendTimeout)
	defer cancel()
	var err error
	for part := *b; len(b.records) > 0 && err == nil; b.records, b.sizes = b.records[len(part.records):], b.sizes[len(part.records):] {
		part.records = b.records[:c.partLen(b.sizes)]
		if err = c.append(ctx, &part); bus.IsPermanent(err) {
			err = c.appendEach(ctx, part)
		}
	}
	for _, d := range b.done {
		d <- err
	}
}

// partLen is how many of the records (of the given sizes) the next append
// holds: at most maxBatch, and at most maxBytes (but always one).
func (c *chains) partLen(sizes []int) int {
	n, total := 0, 0
	for n < len(sizes) && n < c.maxBatch && (n == 0 || total+sizes[n] <= c.maxBytes) {
		total += sizes[n]
		n++
	}
	return n
}

// appendEach appends part's records one by one, after their append
// together was refused for good: one record that cannot be stored (it
// fails its schema, or is too large for the server) must not take the
// records of its batch with it. A record refused alone is stored
// [Stripped] of its payloads, so the chain still records its event.
func (c *chains) appendEach(ctx context.Context, part batch) error {
	for _, rec := range part.records {
		one := part
		one.records = []events.AuditRecorded{rec}
		err := c.append(ctx, &one)
		if bus.IsPermanent(err) {
			one.records = []events.AuditRecorded{Stripped(rec, err)}
			err = c.append(ctx, &one)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// inStoredOrder orders the batch's records by when their events were
// stored, keeping arrival order among equal times. A run's events come to
// the auditor through one consumer per stream, each in its stream's
// order, but the consumers do not wait for each other: an executor's
// result (runs stream) may arrive before the work item it answers (work
// stream). The chain then reads in the order things happened.
func (b *batch) inStoredOrder() {
	idx := make([]int, len(b.records))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(i, j int) int { return b.stored[i].Compare(b.stored[j]) })
	recs, stored, sizes := make([]events.AuditRecorded, len(idx)), make([]time.Time, len(idx)), make([]int, len(idx))
	for k, i := range idx {
		recs[k], stored[k], sizes[k] = b.records[i], b.stored[i], b.sizes[i]
	}
	b.records, b.stored, b.sizes = recs, stored, sizes
}

// head returns chain's cached head.
func (c *chains) head(chain string) (head, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.heads[chain]
	return h, ok
}

// advance records an append: the chain now ends with recs, stored at seq.
// Heads stay cached after a run ended (until maxHeads evicts them), since
// its stale timers and late records still come.
func (c *chains) advance(chain string, h head, recs []events.AuditRecorded, seq uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	last := recs[len(recs)-1]
	ids := h.ids
	if ids == nil || len(ids)+len(recs) > maxHeadIDs {
		ids = map[string]struct{}{} // past the bound, only the newest are checked
	}
	for _, r := range recs {
		ids[storedKey(r)] = struct{}{}
	}
	outcomes := h.outcomes
	if outcomes == nil {
		outcomes = map[string]string{}
	}
	for _, r := range recs {
		if k, ok := outcomeKey(r); ok && r.Status != StatusDuplicate {
			outcomes[k] = r.EventID
		}
	}
	if _, cached := c.heads[chain]; !cached && len(c.heads) >= maxHeads {
		for k := range c.heads {
			delete(c.heads, k)
			break
		}
	}
	c.heads[chain] = head{hash: last.Hash, seq: seq, ids: ids, n: last.N, outcomes: outcomes, full: h.full}
}

// forget drops chain's cached head: after a failed append, the chain may
// or may not hold the batch, and is read again.
func (c *chains) forget(chain string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.heads, chain)
}

// handler returns the handler of a consumer settled by a (nil: each event
// acknowledged): it builds an event's record and queues it on its run's
// chain; the event is settled once the record is stored.
func (s *Service) handler(a *acks) bus.HandlerFunc {
	return func(_ context.Context, r *events.Received, msg jetstream.Msg) error {
		rec := s.build.Record(r)
		size := Fit(&rec, len(r.Event.Data()), s.maxRecord)
		tenant := events.TenantOr(rec.Tenant)
		var stored time.Time
		again := false
		if msg != nil {
			if md, err := msg.Metadata(); err == nil {
				stored = md.Timestamp
				if rec.Source == nil {
					rec.Source = &events.AuditSource{Stream: md.Stream, Seq: md.Sequence.Stream}
				}
				again = md.NumDelivered > 1 || a != nil && a.maybeStored(md)
			}
		}
		return bus.Later(s.chains.add(s.bus.Subjects().RunAudit(tenant, rec.RunID), tenant, rec, size, stored, again, tracing.RunOfEvent(r.Event)))
	}
}

// append stores one batch at the end of its chain.
func (s *Service) append(ctx context.Context, b *batch) error {
	ctx, span := tracing.Tracer().Start(tracing.Parent(ctx, b.trace), "audit append", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(tracing.RunIDKey.String(b.runID), tracing.TenantKey.String(b.tenant), tracing.RecordsKey.Int(len(b.records))))
	defer span.End()
	ctx = tracing.WithRun(ctx, b.trace)
	subject := s.bus.Subjects().AuditAppend(b.tenant, b.runID)
	for attempt := 0; attempt < 10; attempt++ {
		h, cached := s.chains.head(b.chain)
		// A run's request is its first record as a rule: its chain is
		// taken to be empty without reading it (the expected sequence 0
		// fails the append when it is not, and the chain is read then).
		first := !cached && attempt == 0 && b.records[0].EventType == events.TypeRunRequested && !b.again
		if first {
			h.full = true // an empty chain holds no outcome
		}
		switch {
		case b.again:
			// An event delivered again may have its record anywhere in
			// the chain (its acknowledgement waited for other events'
			// records, and the run went on meanwhile).
			var err error
			if h, err = s.scan(ctx, b.chain); err != nil {
				return err
			}
		case (!cached || attempt > 0) && !first:
			var err error
			if h, err = s.last(ctx, b.chain); err != nil {
				return err
			}
		}
		recs := h.unseen(b.records)
		if len(recs) == 0 {
			return nil // every record was stored before (redeliveries)
		}
		if !h.full && slices.ContainsFunc(recs, isOutcome) {
			// Which calls have their outcome recorded is read from the
			// whole chain (after a restart, or when the head was evicted).
			var err error
			if h.outcomes, err = s.outcomes(ctx, b.chain, h.seq); err != nil {
				return err
			}
			h.full = true
		}
		recs = markDuplicates(h.outcomes, recs)
		if err := s.seal(&h, recs); err != nil {
			return bus.Permanent(err)
		}
		data := &events.AuditAppended{RunID: b.runID, Tenant: recs[0].Tenant, Records: recs}
		e, err := s.bus.New(events.TypeAuditAppended, appendID(recs), b.tenant, b.runID, data)
		if err != nil {
			return bus.Permanent(err)
		}
		// One writer per chain: the append fails if any message of the
		// run was stored after the head it extends.
		ack, err := s.bus.Publish(ctx, subject, e, jetstream.WithExpectLastSequenceForSubject(h.seq, b.chain))
		if actionbus.CodeOf(err) == actionbus.CodePayloadTooLarge {
			return bus.Permanent(err) // the same records are as large next time
		}
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
			continue // another auditor extended the chain; read it again
		}
		if err != nil {
			s.chains.forget(b.chain)
			return err
		}
		if ack.Duplicate {
			// Stored before, under the same id: the head is re-read.
			s.chains.forget(b.chain)
			return nil
		}
		s.chains.advance(b.chain, h, recs, ack.Sequence)
		for _, r := range recs {
			s.cfg.Metrics.AuditRecord(r.Kind)
		}
		return nil
	}
	return fmt.Errorf("audit: run %s: too many concurrent appends", b.runID)
}

// appendID names an append by the stored events it records (their ids
// and stream positions), so that publishing the same batch again is
// deduplicated by JetStream, and a copy of an event stored again (under
// the same id, at another position) is not.
func appendID(recs []events.AuditRecorded) string {
	parts := make([]any, 0, 3*len(recs))
	for i, r := range recs {
		if i > 0 {
			parts = append(parts, r.EventID)
		}
		if r.Source != nil {
			parts = append(parts, r.Source.Stream, r.Source.Seq)
		}
	}
	return events.DerivedID(recs[0].EventID, append(parts, "audit")...)
}

// auditMsg reads one message of the audit stream with the message get:
// the auditor writes that stream, so its permissions hold no direct get
// of it (accounts.DirectGetsOfOwnWrites).
func (s *Service) auditMsg(ctx context.Context, req bus.LeaderGet) (*jetstream.RawStreamMsg, error) {
	return bus.GetFromLeader(ctx, s.js, s.topo.StreamAudit(), req)
}

// last reads the end of a chain ("" and 0 when it is empty): the last
// message's last record, and the events its records hold.
func (s *Service) last(ctx context.Context, chain string) (head, error) {
	msg, err := s.auditMsg(ctx, bus.LeaderGet{LastFor: chain})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return head{}, nil
	}
	if err != nil {
		return head{}, err
	}
	r, err := s.bus.Receive(msg.Subject, msg.Header, msg.Data)
	if err != nil {
		return head{}, fmt.Errorf("audit: last record of %s: %w", chain, err)
	}
	recs, err := events.AuditRecordsOf(r)
	if err != nil {
		return head{}, fmt.Errorf("audit: last record of %s: %w", chain, err)
	}
	if len(recs) == 0 {
		return head{}, fmt.Errorf("audit: last message of %s holds no record", chain)
	}
	h := head{hash: recs[len(recs)-1].Hash, seq: msg.Sequence, ids: map[string]struct{}{}, n: recs[len(recs)-1].N, outcomes: map[string]string{}}
	for _, rec := range recs {
		h.ids[storedKey(rec)] = struct{}{}
		if k, ok := outcomeKey(rec); ok && rec.Status != StatusDuplicate {
			h.outcomes[k] = rec.EventID
		}
	}
	return h, nil
}

// scan reads the whole chain: its end, the events of all its records and
// the calls whose outcome it holds.
func (s *Service) scan(ctx context.Context, chain string) (head, error) {
	h := head{ids: map[string]struct{}{}, outcomes: map[string]string{}, full: true}
	for seq := uint64(1); ; {
		msg, err := s.auditMsg(ctx, bus.LeaderGet{Seq: seq, NextFor: chain})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return h, nil
		}
		if err != nil {
			return head{}, err
		}
		seq = msg.Sequence + 1
		r, err := s.bus.Receive(msg.Subject, msg.Header, msg.Data)
		if err != nil {
			continue // not a record; verify reports it
		}
		recs, err := events.AuditRecordsOf(r)
		if err != nil || len(recs) == 0 {
			continue
		}
		h.hash, h.seq, h.n = recs[len(recs)-1].Hash, msg.Sequence, recs[len(recs)-1].N
		for _, rec := range recs {
			h.ids[storedKey(rec)] = struct{}{}
			if k, ok := outcomeKey(rec); ok && rec.Status != StatusDuplicate {
				if _, seen := h.outcomes[k]; !seen {
					h.outcomes[k] = rec.EventID
				}
			}
		}
	}
}

// outcomes reads the calls whose outcome chain holds, from its messages up
// to stream sequence upto.
func (s *Service) outcomes(ctx context.Context, chain string, upto uint64) (map[string]string, error) {
	out := map[string]string{}
	for seq := uint64(1); seq <= upto; {
		msg, err := s.auditMsg(ctx, bus.LeaderGet{Seq: seq, NextFor: chain})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, err
		}
		if msg.Sequence > upto {
			break
		}
		seq = msg.Sequence + 1
		r, err := s.bus.Receive(msg.Subject, msg.Header, msg.Data)
		if err != nil {
			continue // not a record; verify reports it
		}
		recs, err := events.AuditRecordsOf(r)
		if err != nil {
			continue
		}
		for _, rec := range recs {
			if k, ok := outcomeKey(rec); ok && rec.Status != StatusDuplicate {
				if _, seen := out[k]; !seen {
					out[k] = rec.EventID
				}
			}
		}
	}
	return out, nil
}

// seal makes recs the next format-2 records after h: numbered on, linked
// to h's hash and each other, the last one signed.
func (s *Service) seal(h *head, recs []events.AuditRecorded) error {
	prev, n := h.hash, h.n
	for i := range recs {
		n++
		recs[i].V, recs[i].N, recs[i].PrevHash = FormatSigned, n, prev
		if i == len(recs)-1 {
			recs[i].Signer = s.pub
		}
		recs[i].Hash = ChainHash(recs[i])
		prev = recs[i].Hash
	}
	sign(s.key, &recs[len(recs)-1])
	return nil
}
