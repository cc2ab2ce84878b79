package audit

import "slices"

// ackWindow decides which message of one auditor consumer (AckPolicy
// all) may be acknowledged: acknowledging a message acknowledges every
// message of the consumer at or before its stream sequence, so the
// auditor acknowledges only the last of a run of messages whose records
// are all stored — never one past a message whose record is not.
//
// Messages are known by their stream sequence: the server's ack floor of
// an ack-all consumer is a stream sequence, and a redelivery keeps its
// stream sequence but gets a new consumer sequence. A consumer delivers
// new messages in stream order, so when a message is taken, every earlier
// message of the consumer's subjects was taken before it; the gaps between
// taken sequences are other subjects' messages, which the consumer does
// not hold. The exception is the messages an earlier process was handed
// and did not acknowledge: they come again only after the ack wait, after
// newer ones. Their number is known when the process starts (the
// consumer's unacknowledged count); nothing is acknowledged until each of
// them was taken again (or [ackWindow.forgetEarlier] is called).
//
// Deliveries can also be lost while the process runs: a pull whose
// client stopped listening (a fetch that timed out, a connection that
// moved) while the server delivered to it. The server counts them
// delivered, so they too come again only after the ack wait, and an
// acknowledgement of a later message would cover them. The window sees
// them as a gap in the consumer sequence (every delivery, a redelivery
// too, takes the next one), and treats them as the earlier process's:
// nothing is acknowledged until as many messages it did not hold, on a
// second or later delivery, were taken.
//
// It decides only; the caller acknowledges the messages it names. It is
// not safe for concurrent use.
type ackWindow[T any] struct {
	// floor is the stream sequence acknowledged last: every message of
	// the consumer at or before it is stored.
	floor uint64
	// seqs are the held messages' sequences, ascending; held their state.
	seqs []uint64
	held map[uint64]*heldMsg[T]
	// earlierTo and earlierLeft are the last stream sequence delivered
	// before this process started and how many messages at or before it
	// were unacknowledged then and are not taken yet.
	earlierTo   uint64
	earlierLeft int
	// lastDelivery is the highest consumer sequence seen; lostLeft how
	// many deliveries were missed (gaps in the consumer sequence) and
	// have not come again.
	lastDelivery uint64
	lostLeft     int
}

type heldMsg[T any] struct {
	msg T
	// deliveries is the highest delivery count taken of it.
	deliveries uint64
	stored     bool
	// failed says its last handling failed: its next delivery is handled
	// again (else a delivery while it is handled is not).
	failed bool
}

// newAckWindow returns the window of a consumer whose ack floor is
// floor, which had delivered up to stream sequence delivered (its
// delivery at consumer sequence deliveries) and held pending messages
// unacknowledged when the process started.
func newAckWindow[T any](floor, delivered, deliveries uint64, pending int) *ackWindow[T] {
	w := &ackWindow[T]{floor: floor, held: map[uint64]*heldMsg[T]{}, lastDelivery: deliveries}
	if pending > 0 && delivered > floor {
		w.earlierTo, w.earlierLeft = delivered, pending
	}
	return w
}

// take records the delivery of the message at stream sequence seq,
// delivered as the consumer's delivery number delivery and for the
// deliveries-th time. It answers whether the message is to be handled
// (false: its record is stored, or is being stored, and it is only
// delivered again), and whether this delivery is to be acknowledged on
// its own (a message at or before the floor, whose acknowledgement the
// server did not take: every message before it is stored).
func (w *ackWindow[T]) take(seq, delivery, deliveries uint64, msg T) (handle, ackAlone bool) {
	if delivery > w.lastDelivery+1 {
		w.lostLeft += int(delivery - w.lastDelivery - 1)
	}
	w.lastDelivery = max(w.lastDelivery, delivery)
	if seq <= w.floor {
		return false, true
	}
	if h, ok := w.held[seq]; ok {
		// Deliveries of it between the one taken before and this one
		// were lost: they have come again.
		w.found(deliveries - min(deliveries, h.deliveries+1))
		h.msg, h.deliveries = msg, max(h.deliveries, deliveries) // the newest delivery is the one the server answers
		handle, h.failed = h.failed, false
		return handle, false
	}
	if w.earlierLeft > 0 && seq <= w.earlierTo {
		w.earlierLeft--
	} else {
		// A message delivered before and never taken: its lost
		// deliveries have come again.
		w.found(deliveries - min(deliveries, 1))
	}
	w.held[seq] = &heldMsg[T]{msg: msg, deliveries: deliveries}
	if n := len(w.seqs); n == 0 || w.seqs[n-1] < seq {
		w.seqs = append(w.seqs, seq)
	} else {
		i, _ := slices.BinarySearch(w.seqs, seq)
		w.seqs = slices.Insert(w.seqs, i, seq)
	}
	return true, false
}

// found records that n lost deliveries have come again.
func (w *ackWindow[T]) found(n uint64) {
	w.lostLeft -= int(min(n, uint64(w.lostLeft)))
}

// stored records that the message at seq needs no further handling: its
// record is stored (or it can never have one, and the server would not
// deliver it again).
func (w *ackWindow[T]) stored(seq uint64) {
	if h, ok := w.held[seq]; ok {
		h.stored = true
	}
}

// failed records that handling the message at seq failed: it is not
// stored, and its next delivery is handled again.
func (w *ackWindow[T]) failed(seq uint64) {
	if h, ok := w.held[seq]; ok && !h.stored {
		h.failed = true
	}
}

// next returns the message to acknowledge now, if any: the last held
// message before the first whose record is not stored. Every held
// message up to it is dropped, and the floor moves to it.
func (w *ackWindow[T]) next() (msg T, seq uint64, ok bool) {
	if w.waitingForEarlier() {
		return msg, 0, false
	}
	n := 0
	for n < len(w.seqs) && w.held[w.seqs[n]].stored {
		n++
	}
	if n == 0 {
		return msg, 0, false
	}
	seq = w.seqs[n-1]
	msg = w.held[seq].msg
	for _, s := range w.seqs[:n] {
		delete(w.held, s)
	}
	w.seqs = slices.Delete(w.seqs, 0, n)
	w.floor = seq
	return msg, seq, true
}

// waitingForEarlier reports whether messages delivered before this
// process started, or whose delivery was lost, are still to come again
// (nothing is acknowledged until they are).
func (w *ackWindow[T]) waitingForEarlier() bool { return w.earlierLeft > 0 || w.lostLeft > 0 }

// forgetEarlier stops waiting for the earlier process's messages and the
// lost deliveries: the server holds no unacknowledged message the window
// does not know (the caller read that from the consumer).
func (w *ackWindow[T]) forgetEarlier() { w.earlierLeft, w.lostLeft = 0, 0 }

// size is how many messages the window holds unacknowledged.
func (w *ackWindow[T]) size() int { return len(w.seqs) }
