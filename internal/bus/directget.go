package bus

import (
	"errors"
	"fmt"
	"iter"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

// ReadAsStored returns m, a message read with a direct get
// (jetstreamext.GetBatch, GetLastMsgsFor), with the subject, sequence and
// time the server stored it under. The server answers a direct get with
// the message's stored headers first and appends its own (Nats-Stream,
// Nats-Subject, Nats-Sequence, Nats-Time-Stamp) after them, and
// jetstreamext takes the first value of each: a publisher that stored one
// of those headers itself was read at a subject, sequence or time of its
// choosing — an executor's message on a run's result subject carrying
// "Nats-Subject: ab.run.<t>.<run>.completed" read as the run's end, or
// "Nats-Sequence: 1" making a reader that pages by sequence start over
// for ever. The last value of each is the server's. A message without
// them is no direct get's answer (an error).
func ReadAsStored(m *jetstream.RawStreamMsg) (*jetstream.RawStreamMsg, error) {
	last := func(name string) (string, error) {
		vs := m.Header.Values(name)
		if len(vs) == 0 {
			return "", fmt.Errorf("bus: a direct get's answer without %s", name)
		}
		return vs[len(vs)-1], nil
	}
	subject, err := last(jetstream.SubjectHeader)
	if err != nil {
		return nil, err
	}
	seqText, err := last(jetstream.SequenceHeader)
	if err != nil {
		return nil, err
	}
	seq, err := strconv.ParseUint(seqText, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("bus: a direct get's answer with sequence %q: %w", seqText, err)
	}
	stamp, err := last(jetstream.TimeStampHeaer)
	if err != nil {
		return nil, err
	}
	at, err := time.Parse(time.RFC3339Nano, stamp)
	if err != nil {
		return nil, fmt.Errorf("bus: a direct get's answer with time %q: %w", stamp, err)
	}
	out := *m
	out.Subject, out.Sequence, out.Time = subject, seq, at
	return &out, nil
}

// AsStored returns the messages of a direct get's answer (it, from
// jetstreamext.GetBatch or GetLastMsgsFor), each as the server stored it
// ([ReadAsStored]). The answer that there are no messages ends them (no
// error); an error is the last value.
func AsStored(it iter.Seq2[*jetstream.RawStreamMsg, error]) iter.Seq2[*jetstream.RawStreamMsg, error] {
	return func(yield func(*jetstream.RawStreamMsg, error) bool) {
		for m, err := range it {
			if errors.Is(err, jetstreamext.ErrNoMessages) {
				return
			}
			if err == nil {
				m, err = ReadAsStored(m)
			}
			if !yield(m, err) || err != nil {
				return
			}
		}
	}
}
