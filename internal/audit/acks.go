package audit

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/internal/bus"
)

// acks settles the messages of one ack-all auditor consumer for
// [bus.Bus.Serve] ([bus.AckAllSettler]): an [ackWindow] decides,
// and acks acknowledges the message it names, at most once per
// Config.AckEvery, so that one acknowledgement covers the events of many
// appends.
type acks struct {
	name  string
	cons  jetstream.Consumer
	every time.Duration
	log   *slog.Logger

	mu   sync.Mutex
	win  *ackWindow[jetstream.Msg]
	kick chan struct{}
	// waitingSince is when the window started waiting for messages to
	// come again (the process's start, or a gap in the deliveries).
	waitingSince time.Time
	// again is the last stream sequence the consumer this one replaced
	// had delivered ([bus.MetaDeliveredBefore]): a message up to it
	// may have its record stored although it is delivered for the first
	// time.
	again uint64
}

// newAcks returns the settler of cons, whose info was read before
// anything was pulled from it in this process.
func newAcks(name string, cons jetstream.Consumer, every time.Duration, log *slog.Logger) *acks {
	info := cons.CachedInfo()
	a := &acks{name: name, cons: cons, every: every, log: log, kick: make(chan struct{}, 1),
		win: newAckWindow[jetstream.Msg](info.AckFloor.Stream, info.Delivered.Stream, info.Delivered.Consumer, info.NumAckPending), waitingSince: time.Now()}
	if v, ok := info.Config.Metadata[bus.MetaDeliveredBefore]; ok {
		a.again, _ = strconv.ParseUint(v, 10, 64)
	}
	return a
}

// Take implements [bus.AckAllSettler].
func (a *acks) Take(msg jetstream.Msg) bool {
	md, err := msg.Metadata()
	if err != nil {
		return true // not a JetStream message: nothing to settle
	}
	a.mu.Lock()
	waiting := a.win.waitingForEarlier()
	handle, alone := a.win.take(md.Sequence.Stream, md.Sequence.Consumer, md.NumDelivered, msg)
	if !waiting && a.win.waitingForEarlier() {
		a.waitingSince = time.Now()
		a.log.Warn("deliveries lost (a gap in the consumer's sequence): acknowledging nothing until they come again", "consumer", a.name,
			"delivery", md.Sequence.Consumer)
	}
	a.mu.Unlock()
	if alone {
		if err := msg.Ack(); err != nil {
			a.log.Warn("ack failed", "consumer", a.name, "seq", md.Sequence.Stream, "err", err)
		}
	}
	return handle
}

// Done implements [bus.AckAllSettler].
func (a *acks) Done(msg jetstream.Msg) {
	md, err := msg.Metadata()
	if err != nil {
		return
	}
	a.mu.Lock()
	a.win.stored(md.Sequence.Stream)
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// Failed implements [bus.AckAllSettler].
func (a *acks) Failed(msg jetstream.Msg) {
	md, err := msg.Metadata()
	if err != nil {
		return
	}
	a.mu.Lock()
	a.win.failed(md.Sequence.Stream)
	a.mu.Unlock()
}

// maybeStored reports whether the record of msg may be stored already: it
// was delivered before, or by the consumer this one replaced.
func (a *acks) maybeStored(md *jetstream.MsgMetadata) bool {
	return md.NumDelivered > 1 || md.Sequence.Stream <= a.again
}

// ack acknowledges what the window allows now.
func (a *acks) ack() {
	a.mu.Lock()
	msg, seq, ok := a.win.next()
	a.mu.Unlock()
	if !ok {
		return
	}
	if err := msg.Ack(); err != nil {
		a.log.Warn("ack failed", "consumer", a.name, "seq", seq, "err", err)
	}
}

// run acknowledges until ctx ends, and once more then (after Serve has
// settled what it handled). While the messages an earlier process left
// unacknowledged have not all come again, it reads the consumer every
// ack wait: a message that will not come again (it ran out of deliveries,
// or aged out of its stream) would hold every acknowledgement back.
func (a *acks) run(ctx context.Context, served <-chan struct{}) {
	wait := a.cons.CachedInfo().Config.AckWait
	if wait <= 0 {
		wait = bus.DefaultAckWait
	}
	check := time.NewTicker(wait)
	defer check.Stop()
	for {
		select {
		case <-served:
			a.ack()
			return
		case <-a.kick:
			a.ack()
			// Acknowledgements are spaced: the next covers whatever was
			// stored meanwhile.
			select {
			case <-served:
				a.ack()
				return
			case <-time.After(a.every):
			}
		case <-check.C:
			a.mu.Lock()
			due := time.Since(a.waitingSince) > 2*wait
			a.mu.Unlock()
			a.checkEarlier(ctx, due)
		}
	}
}

// checkEarlier stops waiting for the earlier process's messages (and the
// lost deliveries) when the consumer holds no unacknowledged message
// beyond those the window knows (only after two ack waits since the
// waiting began, by when every one of them was due again).
func (a *acks) checkEarlier(ctx context.Context, due bool) {
	a.mu.Lock()
	waiting, held := a.win.waitingForEarlier(), a.win.size()
	a.mu.Unlock()
	if !waiting || !due {
		return
	}
	info, err := a.cons.Info(ctx)
	if err != nil {
		return
	}
	if info.NumAckPending <= held {
		a.log.Warn("events left unacknowledged by an earlier auditor, or whose delivery was lost, did not come again; acknowledging on", "consumer", a.name,
			"unacknowledged", info.NumAckPending)
		a.mu.Lock()
		a.win.forgetEarlier()
		a.mu.Unlock()
		a.ack()
	}
}
