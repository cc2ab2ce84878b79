package bus

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// burstPull is a [jetstream.MessagesContext] that pulls in bursts: it asks
// the consumer for what it holds (a no-wait fetch of up to batch
// messages), hands those out, and asks again at once when the burst was
// full, else after linger. A consumer that need not see each message the
// moment it is stored (the auditor, whose records wait FlushAfter anyway)
// then wakes once per linger under a trickle of events, not once per
// event, and the server sends it a burst per request instead of a message
// per write. A burst that finds nothing leaves one pull request of a
// single message waiting at the server (for up to idle, then another), so
// an idle consumer costs a request per idle, not one per linger, and the
// first event after a quiet spell is handed out as soon as it is stored.
//
// Next ignores its options: it returns at once once drained or stopped.
type burstPull struct {
	cons   jetstream.Consumer
	batch  int
	linger time.Duration
	idle   time.Duration

	// cur is the burst being handed out and n how many it handed out;
	// empty reports that the last burst found nothing. endIdle, set while
	// cur is the single-message pull of an idle consumer, releases that
	// pull's deadline.
	cur     jetstream.MessageBatch
	n       int
	empty   bool
	last    time.Time
	endIdle context.CancelFunc

	// closed is canceled by Drain or Stop: it wakes a lingering Next and
	// cancels an idle pull, which frees its subscription at once.
	closed context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	draining bool
	stopped  bool
}

func newBurstPull(cons jetstream.Consumer, batch int, linger, idle time.Duration) *burstPull {
	closed, cancel := context.WithCancel(context.Background())
	return &burstPull{cons: cons, batch: max(batch, 1), linger: linger, idle: idle, closed: closed, cancel: cancel}
}

// Next returns the next message of the current burst, asking for the next
// burst when it is done; ErrMsgIteratorClosed once stopped, or drained
// and the current burst handed out.
func (p *burstPull) Next(...jetstream.NextOpt) (jetstream.Msg, error) {
	for {
		if p.closedFor() {
			return nil, jetstream.ErrMsgIteratorClosed
		}
		if p.cur != nil {
			// A burst's channel closes once the server has answered (at
			// once for a no-wait fetch), an idle pull's once it is given
			// up (Drain and Stop cancel it) or expires: what it delivered
			// first is still handed out, for Serve to hand back.
			if m, ok := <-p.cur.Messages(); ok {
				p.n++
				return m, nil
			}
			err, full, waited := p.cur.Error(), p.n >= p.batch, p.endIdle != nil
			p.endCur()
			p.empty = p.n == 0
			if err != nil && !p.quiet(err, waited) {
				return nil, err
			}
			// What follows an idle pull's message lingers, so that the
			// events stored with it come as a burst; an idle pull that
			// expired empty is followed by the next at once.
			if !full && !(waited && p.empty) {
				p.last = time.Now()
			}
		}
		p.mu.Lock()
		done := p.draining || p.stopped
		p.mu.Unlock()
		if done {
			return nil, jetstream.ErrMsgIteratorClosed
		}
		if p.empty {
			ctx, end := context.WithTimeout(p.closed, p.idle)
			batch, err := p.cons.Fetch(1, jetstream.FetchContext(ctx))
			if err != nil {
				end()
				return nil, err
			}
			p.cur, p.n, p.endIdle = batch, 0, end
			continue
		}
		if wait := time.Until(p.last.Add(p.linger)); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-p.closed.Done():
				t.Stop()
				continue
			}
		}
		batch, err := p.cons.FetchNoWait(p.batch)
		if err != nil {
			p.last = time.Now()
			return nil, err
		}
		p.cur, p.n = batch, 0
	}
}

// quiet reports whether err ends a burst without fault: the consumer held
// nothing, or an idle pull was given up or reached its deadline.
func (p *burstPull) quiet(err error, idle bool) bool {
	return errors.Is(err, jetstream.ErrNoMessages) ||
		idle && (p.closed.Err() != nil || errors.Is(err, context.DeadlineExceeded))
}

// endCur forgets the current burst, releasing an idle pull's deadline.
func (p *burstPull) endCur() {
	if p.endIdle != nil {
		p.endIdle()
		p.endIdle = nil
	}
	p.cur = nil
}

// closedFor reports whether Next must return ErrMsgIteratorClosed now:
// stopped (what was fetched is dropped; the server delivers it again
// after the ack wait).
func (p *burstPull) closedFor() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopped
}

// Stop ends the iterator; what it fetched and did not hand out is dropped.
func (p *burstPull) Stop() { p.close(func() { p.stopped = true }) }

// Drain ends the iterator once the current burst is handed out.
func (p *burstPull) Drain() { p.close(func() { p.draining = true }) }

func (p *burstPull) close(set func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.draining && !p.stopped {
		p.cancel()
	}
	set()
}
