package bus

import (
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
// per write.
//
// Next ignores its options: it returns at once once drained or stopped.
type burstPull struct {
	cons   jetstream.Consumer
	batch  int
	linger time.Duration

	// cur is the burst being handed out; full reports whether it held
	// batch messages, so that the next is asked for at once.
	cur  jetstream.MessageBatch
	n    int
	last time.Time

	mu       sync.Mutex
	draining bool
	stopped  bool
	wake     chan struct{} // closed by Drain or Stop
}

func newBurstPull(cons jetstream.Consumer, batch int, linger time.Duration) *burstPull {
	return &burstPull{cons: cons, batch: max(batch, 1), linger: linger, wake: make(chan struct{})}
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
			if m, ok := <-p.cur.Messages(); ok {
				p.n++
				return m, nil
			}
			err, full := p.cur.Error(), p.n >= p.batch
			p.cur = nil
			if err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
				return nil, err
			}
			if !full {
				p.last = time.Now()
			}
		}
		p.mu.Lock()
		done := p.draining || p.stopped
		p.mu.Unlock()
		if done {
			return nil, jetstream.ErrMsgIteratorClosed
		}
		if wait := time.Until(p.last.Add(p.linger)); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-p.wake:
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
		close(p.wake)
	}
	set()
}
