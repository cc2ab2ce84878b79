package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/tracing"
)

// HandlerFunc handles one received, validated event. Returning nil acks the
// message. Returning an error naks it with a delay so that it is redelivered
// (for transient failures such as a revision conflict); wrap the error with
// [Permanent] to terminate the message instead, or with [Rejection] to
// reject it (as [Bus.Receive] rejects an invalid event).
type HandlerFunc func(ctx context.Context, r *events.Received, msg jetstream.Msg) error

// permanentError marks an error that redelivery cannot fix.
type permanentError struct{ err error }

func (p permanentError) Error() string { return p.err.Error() }
func (p permanentError) Unwrap() error { return p.err }

// Permanent marks err as not retryable: [Bus.Serve] terminates the message
// instead of redelivering it.
func Permanent(err error) error { return permanentError{err} }

// IsPermanent reports whether err, or an error it wraps, was marked
// [Permanent].
func IsPermanent(err error) bool { return errors.As(err, new(permanentError)) }

// rejectionError marks an event its handler refuses on its merits.
type rejectionError struct{ err error }

func (r rejectionError) Error() string { return r.err.Error() }
func (r rejectionError) Unwrap() error { return r.err }

// Rejection marks err as a verdict on the event itself (a typed
// *actionbus.Error): [Bus.Serve] rejects the message ([Bus.Reject]) and
// acks it, as it does an event that fails validation.
func Rejection(err error) error { return rejectionError{err} }

// laterError hands a message's settlement to whoever sends on done.
type laterError struct{ done <-chan error }

func (laterError) Error() string { return "events: settled later" }

// Later is a handler's answer when its work ends after it returns (the
// auditor appends a run's records in batches): [Bus.Serve] takes the next
// message at once, and settles this one with the error received on done,
// by the rules a returned error follows (nil acks, [Permanent] terminates,
// [Rejection] rejects, anything else retries). The message holds a place
// in the consumer's MaxAckPending until then, not a handler slot; done
// must receive exactly once.
func Later(done <-chan error) error { return laterError{done} }

// ServeOptions configures [Bus.Serve].
type ServeOptions struct {
	// Name identifies the consumer in logs and rejected events.
	Name string
	// Concurrency bounds handlers running at once; default 1.
	Concurrency int
	// NakDelay is the first redelivery delay after a handler error; it
	// doubles per delivery up to 30s. Default 100ms.
	NakDelay time.Duration
	// Observer, when set, sees every message handled (for metrics).
	Observer ServeObserver
	// OnReject, when set, is called after a message was rejected and its
	// event.rejected published, with the rejection's reason; an error
	// naks the message so that it is rejected again later. The
	// dispatcher uses it to end a rejected run request.
	OnReject func(ctx context.Context, msg jetstream.Msg, reason error) error
	// OrderBy, when set, keys each message by its subject: messages with
	// the same non-empty key are handled one after another, in the order
	// they were pulled (a run's events, for the auditor's chain); others
	// run concurrently.
	OrderBy func(subject string) string
	// AckAll, when set, settles the messages of a consumer whose
	// AckPolicy is all instead of acknowledging each: see [AckAllSettler].
	// Nil acknowledges each message (AckPolicy explicit).
	AckAll AckAllSettler

	// PriorityGroup, when set, pulls as a member of that priority group
	// of the consumer: of a pinned consumer ([Topology.Partitions]) only
	// the client the server pinned receives messages.
	PriorityGroup string
	// PullExpiry is how long each pull request lives; default 10 s. A
	// pinned client keeps its pin by pulling again within the consumer's
	// PinnedTTL, so a pinned consumer's pulls expire sooner.
	PullExpiry time.Duration
	// DrainGrace, when set, lets the handlers in hand go on for that long
	// after ctx ends (Serve stops pulling at once); then their context is
	// canceled too. Zero cancels them with ctx. A dispatcher that hands a
	// partition to another drains it, so that the transitions in hand
	// finish instead of being redelivered; the grace bounds what waits on
	// a context (a held result lingering for the run's next write).
	DrainGrace time.Duration
	// Linger, when set, pulls in bursts (see burstPull): what the consumer
	// holds, up to LingerBatch messages, is asked for at once, and asked
	// for again at once when the burst was full, else after Linger; a
	// burst that finds nothing leaves one single-message pull waiting (up
	// to PullExpiry, then another), so an idle consumer costs no more than
	// with a long-poll pull. For a consumer that need not see each message
	// the moment it is stored; not with PriorityGroup (ignored there).
	Linger time.Duration
	// LingerBatch bounds a burst; default 256.
	LingerBatch int

	// maxDeliver is the consumer's MaxDeliver (0: unknown or unbounded).
	maxDeliver int
}

// AckAllSettler settles the messages of an ack-all consumer for
// [Bus.Serve], which never acknowledges or terminates one itself: on such
// a consumer an acknowledgement (and a termination) covers every message
// at or before it, so only the settler, which knows which messages are
// done, may send one. Serve still naks a message to have it delivered
// again.
type AckAllSettler interface {
	// Take is called with each message as it is pulled, in delivery
	// order, before it is handled; false: do not handle it (it is done,
	// or being handled, and was only delivered again).
	Take(msg jetstream.Msg) bool
	// Done is called once a message needs no more handling: its handler
	// answered nil, its rejection is published, its failure is permanent,
	// or it failed on its last delivery.
	Done(msg jetstream.Msg)
	// Failed is called before a failed message is nak'd: its next
	// delivery is to be handled again.
	Failed(msg jetstream.Msg)
}

// ServeObserver sees what [Bus.Serve] does with each message.
type ServeObserver interface {
	// HandleStarted is called when a message is taken; redelivered says
	// JetStream delivered it before.
	HandleStarted(consumer string, redelivered bool)
	// HandleDone is called with the outcome: "ok", "retry", "permanent"
	// or "rejected".
	HandleDone(consumer, outcome string, took time.Duration)
	// Rejected is called for a message rejected as malformed or invalid.
	Rejected(consumer string)
}

// pullExpiry is how long each pull request of Serve lives. The server
// sends heartbeats for a pull at half of it; two missed (10 s) tell the
// client that the server holds no pull of its (a restart, a consumer
// leader that moved, a request lost), and it asks again. At nats.go's
// default (30 s) a consumer could sit idle that long with messages to
// deliver; a handler's nak then waited as long for its redelivery.
const pullExpiry = 10 * time.Second

// Serve pulls messages from cons and runs h on each, at most
// opts.Concurrency at a time, until ctx ends; then it stops pulling and
// waits for running handlers (which see ctx canceled) before returning.
//
// Ack outcomes are decided here, in one place: a message that fails
// decoding or validation is rejected ([Bus.Reject]) and acked; a handler's
// nil acks; a [Permanent] error terminates; any other error naks with
// backoff. Errors are logged once, here.
func (b *Bus) Serve(ctx context.Context, cons jetstream.Consumer, opts ServeOptions, h HandlerFunc) error {
	if opts.Concurrency <= 0 {
		opts.Concurrency = 1
	}
	if opts.NakDelay <= 0 {
		opts.NakDelay = 100 * time.Millisecond
	}
	log := b.log.With("consumer", opts.Name)
	if info := cons.CachedInfo(); info != nil {
		opts.maxDeliver = info.Config.MaxDeliver
	}
	if opts.PullExpiry <= 0 {
		opts.PullExpiry = pullExpiry
	}
	pullOpts := []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(opts.Concurrency), jetstream.PullExpiry(opts.PullExpiry)}
	if opts.PriorityGroup != "" {
		pullOpts = append(pullOpts, jetstream.PullPriorityGroup(opts.PriorityGroup))
	}
	open := func() (jetstream.MessagesContext, error) { return cons.Messages(pullOpts...) }
	if opts.Linger > 0 && opts.PriorityGroup == "" {
		if opts.LingerBatch <= 0 {
			opts.LingerBatch = 256
		}
		open = func() (jetstream.MessagesContext, error) {
			return newBurstPull(cons, opts.LingerBatch, opts.Linger, opts.PullExpiry), nil
		}
	}
	handlerCtx := ctx
	if opts.DrainGrace > 0 {
		hctx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
		defer cancelHandlers() // after the handlers are done (deferred before them)
		stopGrace := context.AfterFunc(ctx, func() { time.AfterFunc(opts.DrainGrace, cancelHandlers) })
		defer stopGrace()
		handlerCtx = hctx
	}
	iter, err := open()
	if err != nil {
		return fmt.Errorf("events: serve %s: %w", opts.Name, err)
	}
	var iterMu sync.Mutex
	// On stop, the iterator drains rather than stops: a stopped one drops
	// the messages it fetched and holds, unacknowledged, which the server
	// then delivers again only after the consumer's ack wait (30 s) — a
	// partition handed to another dispatcher sat that long on the events
	// in flight. Drained, it returns them, and handBack naks them for the
	// next consumer at once.
	stop := context.AfterFunc(ctx, func() {
		iterMu.Lock()
		defer iterMu.Unlock()
		iter.Drain()
	})
	defer stop()
	stopped := func() error {
		iterMu.Lock()
		defer iterMu.Unlock()
		b.handBack(log, opts, iter)
		return nil
	}
	pause := func(d time.Duration) {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}

	// Concurrency workers live as long as Serve: a goroutine per message
	// would grow a fresh stack for every event (decoding and schema
	// validation recurse deeply), which the profile showed costing a
	// tenth of a service's CPU.
	slots := make(chan struct{}, opts.Concurrency)
	var lanesMu sync.Mutex
	lanes := map[string]*lane{}
	type item struct {
		msg jetstream.Msg
		key string
	}
	work := make(chan item)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(work)
	for range opts.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range work {
				msg := it.msg
				for {
					b.handle(handlerCtx, log, opts, msg, h, &wg)
					<-slots
					if it.key == "" {
						break
					}
					lanesMu.Lock()
					l := lanes[it.key]
					if len(l.pending) == 0 {
						delete(lanes, it.key)
						lanesMu.Unlock()
						break
					}
					msg, l.pending = l.pending[0], l.pending[1:]
					lanesMu.Unlock()
				}
			}
		}()
	}
	for {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return stopped()
		}
		msg, err := iter.Next()
		if err == nil && ctx.Err() != nil {
			<-slots
			handBackMsg(log, opts, msg)
			return stopped()
		}
		if err != nil {
			<-slots
			if ctx.Err() != nil {
				return stopped()
			}
			// A server going away, a consumer leader moving, missed
			// heartbeats: the service keeps serving. An iterator that
			// ended without being stopped is replaced.
			log.Warn("pull interrupted; serving on", "err", err)
			pause(250 * time.Millisecond)
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrBadRequest) {
				next, err := open()
				if err != nil {
					log.Warn("pull not restarted; retrying", "err", err)
					pause(time.Second)
					continue
				}
				iterMu.Lock()
				iter.Stop()
				iter = next
				iterMu.Unlock()
				if ctx.Err() != nil {
					return stopped()
				}
			}
			continue
		}
		if canonical := b.subjects.Canonical(msg.Subject()); canonical != msg.Subject() {
			msg = storedMsg{msg, canonical}
		}
		if opts.AckAll != nil && !opts.AckAll.Take(msg) {
			<-slots
			continue
		}
		key := ""
		if opts.OrderBy != nil {
			key = opts.OrderBy(msg.Subject())
		}
		if key != "" {
			lanesMu.Lock()
			if l, busy := lanes[key]; busy {
				// The key's worker takes it when done with the one before.
				l.pending = append(l.pending, msg)
				lanesMu.Unlock()
				continue
			}
			lanes[key] = &lane{}
			lanesMu.Unlock()
		}
		// A slot is held for every message fetched and not yet handled,
		// so with this one taken at most Concurrency-1 are being handled:
		// a worker is free, or about to be.
		work <- item{msg, key}
	}
}

type lane struct{ pending []jetstream.Msg }

// handBackWait bounds how long a stopped Serve waits for its drained
// iterator to return what it fetched (the server's answer to the
// unsubscribe); what comes later waits for the ack wait.
const handBackWait = 5 * time.Second

// handBack drains iter, which Serve stopped pulling, and naks every
// message it fetched and did not hand to a handler, so that the server
// delivers them again at once — to the consumer's next client — instead
// of after the ack wait.
func (b *Bus) handBack(log *slog.Logger, opts ServeOptions, iter jetstream.MessagesContext) {
	iter.Drain()
	deadline := time.Now().Add(handBackWait)
	for {
		wait := time.Until(deadline)
		if wait <= 0 {
			log.Warn("stopped pulling with fetched events not handed back; they come back after the ack wait")
			return
		}
		msg, err := iter.Next(jetstream.NextMaxWait(wait))
		if err != nil {
			if !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				log.Warn("handing back fetched events", "err", err)
			}
			return
		}
		handBackMsg(log, opts, msg)
	}
}

// handBackMsg naks msg, fetched and never handled, for immediate
// redelivery. An ack-all consumer's messages are left to its ack wait:
// there the settler owns every settlement, and one it did not take is
// not its to nak. A message fetched on its last delivery is never
// delivered again, handed back or not: that is said once, loudly, as a
// handler's failure on its last delivery is (see settle).
func handBackMsg(log *slog.Logger, opts ServeOptions, msg jetstream.Msg) {
	if md, err := msg.Metadata(); err == nil && opts.maxDeliver > 0 && md.NumDelivered >= uint64(opts.maxDeliver) {
		log.Error("an event fetched on its last delivery was never handled (the client stopped); it will not be delivered again",
			"subject", msg.Subject(), "deliveries", md.NumDelivered)
	}
	if opts.AckAll != nil {
		return
	}
	if err := msg.Nak(); err != nil {
		log.Debug("hand back", "subject", msg.Subject(), "err", err)
	}
}

// storedMsg is a message read from a stream whose stored subject carries
// the run's partition: its Subject is the one it was published on
// ([events.Subjects.Canonical]), which handlers, the binding check and
// rejections read.
type storedMsg struct {
	jetstream.Msg
	subject string
}

func (m storedMsg) Subject() string { return m.subject }

// handle receives msg and runs h on it; a handler that answers [Later] is
// settled by a goroutine counted in wg.
func (b *Bus) handle(ctx context.Context, log *slog.Logger, opts ServeOptions, msg jetstream.Msg, h HandlerFunc, wg *sync.WaitGroup) {
	start := time.Now()
	if o := opts.Observer; o != nil {
		md, _ := msg.Metadata()
		o.HandleStarted(opts.Name, md != nil && md.NumDelivered > 1)
	}
	rec, err := b.Receive(msg.Subject(), msg.Headers(), msg.Data())
	if err != nil {
		b.settle(ctx, log, opts, msg, nil, Rejection(err), start)
		return
	}
	// The handler runs in the trace context of the span that sent the
	// event (its traceparent header), when it has one.
	herr := h(tracing.Extract(ctx, msg.Headers()), rec, msg)
	var later laterError
	if errors.As(herr, &later) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.settle(ctx, log, opts, msg, rec, <-later.done, start)
		}()
		return
	}
	b.settle(ctx, log, opts, msg, rec, herr, start)
}

// settle acks, retries, terminates or rejects msg by its handler's error.
func (b *Bus) settle(ctx context.Context, log *slog.Logger, opts ServeOptions, msg jetstream.Msg, rec *events.Received, herr error, start time.Time) {
	outcome := "ok"
	if o := opts.Observer; o != nil {
		defer func() { o.HandleDone(opts.Name, outcome, time.Since(start)) }()
	}
	var rejected rejectionError
	switch {
	case errors.As(herr, &rejected):
		outcome = "rejected"
		b.rejectServed(ctx, log, opts, msg, rejected.err)
	case herr == nil && opts.AckAll != nil:
		opts.AckAll.Done(msg)
	case herr == nil:
		if err := msg.Ack(); err != nil && ctx.Err() == nil {
			log.Warn("ack failed", "subject", msg.Subject(), "err", err)
		}
	case errors.As(herr, new(permanentError)):
		outcome = "permanent"
		log.Error("event handling failed permanently", "subject", msg.Subject(), "type", rec.Event.Type(), "id", rec.Event.ID(), "err", herr)
		if opts.AckAll != nil {
			opts.AckAll.Done(msg) // a termination would acknowledge every message before it
			return
		}
		_ = msg.TermWithReason(herr.Error())
	default:
		outcome = "retry"
		delay := opts.NakDelay
		md, err := msg.Metadata()
		if err == nil {
			for i := uint64(1); i < md.NumDelivered && delay < 30*time.Second; i++ {
				delay *= 2
			}
		}
		last := err == nil && opts.maxDeliver > 0 && md.NumDelivered >= uint64(opts.maxDeliver)
		switch {
		case ctx.Err() != nil:
		case last:
			// The server delivers it no more: said once, loudly.
			log.Error("event handling failed on its last delivery; it will not be delivered again", "subject", msg.Subject(),
				"type", rec.Event.Type(), "id", rec.Event.ID(), "deliveries", md.NumDelivered, "err", herr)
		default:
			log.Debug("event handling failed; will retry", "subject", msg.Subject(), "type", rec.Event.Type(), "delay", delay, "err", herr)
		}
		if opts.AckAll != nil {
			if last && ctx.Err() == nil {
				opts.AckAll.Done(msg)
				return
			}
			opts.AckAll.Failed(msg)
		}
		_ = msg.NakWithDelay(delay)
	}
}

// rejectServed rejects a served message ([Bus.Reject]), answers it
// (OnReject) and acks it; when either fails it naks, so nothing is lost.
func (b *Bus) rejectServed(ctx context.Context, log *slog.Logger, opts ServeOptions, msg jetstream.Msg, err error) {
	if opts.Observer != nil {
		opts.Observer.Rejected(opts.Name)
	}
	// Rejections must not be lost to a canceled serve context.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	// The answer does not wait for the rejection's record: a run whose
	// request was refused ends (failed) even while the rejected stream
	// cannot take the record, which the redelivery then stores.
	rejErr := b.Reject(rctx, msg, opts.Name, err)
	if opts.OnReject != nil {
		if rerr := opts.OnReject(rctx, msg, err); rerr != nil {
			log.Error("answering a rejected event failed; message will be redelivered", "subject", clip(msg.Subject(), 256), "err", rerr)
			nakServed(opts, msg)
			return
		}
	}
	if rejErr != nil {
		log.Error("reject failed; message will be redelivered", "subject", clip(msg.Subject(), 256), "err", rejErr)
		nakServed(opts, msg)
		return
	}
	if opts.AckAll != nil {
		opts.AckAll.Done(msg)
		return
	}
	_ = msg.Ack()
}

// nakServed naks msg to have it delivered again after opts.NakDelay.
func nakServed(opts ServeOptions, msg jetstream.Msg) {
	if opts.AckAll != nil {
		opts.AckAll.Failed(msg)
	}
	_ = msg.NakWithDelay(opts.NakDelay)
}
