package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// fences are the partitions' fences this dispatcher holds: for each
// partition it serves, the sequence of the fence message it published in
// the runs stream ([events.Subjects.Fence]) before its first transition of
// the partition's runs.
//
// A run's end may be published before its state is written (see
// [Dispatcher.endFirst]); nothing then stops a dispatcher that lost the
// partition while paused from publishing an end its successor does not
// know of, except the server: every such end expects the fence's last
// sequence to be its publisher's (Nats-Expected-Last-Subject-Sequence
// with -Subject), so once the successor has fenced, the old owner's ends
// are refused. Everything else the dispatchers write stays guarded by the
// run state's revision; the conditions under which an end may go first
// are [Dispatcher.endFirst]'s.
type fences struct {
	js       jetstream.JetStream
	subjects events.Subjects
	member   string

	mu      sync.Mutex
	count   int
	serving map[int]uint64 // the serving's generation, by partition
	seq     map[int]uint64 // 0: not fenced yet
	gen     uint64
	// publishing serialises the fence publishes of one partition, so that
	// a partition is fenced once at a time while mu is never held across
	// a publish (the other partitions' transitions go on meanwhile).
	publishing map[int]*sync.Mutex
	// ends is, by partition, the last end this dispatcher stored under
	// its fence there without writing the ended state (see endMark).
	ends map[int]endMark
}

// endMark is the end of a run this dispatcher stored last, under fence, in
// a partition, with no ended state written after it: its stream sequence
// and the subjects it may be stored on. A read of a run's stored end
// (lookEnd) must come from a replica that holds it: a direct get may be
// answered by a follower of a replicated stream, and one that holds the
// fence but not an end stored after it would take an ended run for one
// still going. The stream stores in sequence, so a replica that answers
// with this end holds every end stored before it.
type endMark struct {
	fence, seq uint64
	subjects   []string
}

// errNotOwner is a transition's error for a run whose partition this
// dispatcher does not serve (an in-process wake-up left from when it did).
var errNotOwner = errors.New("the run's partition is not this dispatcher's")

// errFenced is the error of a transition that found another dispatcher's
// fence on its partition: it is retried (redelivered), under a new fence
// if this dispatcher still serves the partition.
var errFenced = errors.New("another dispatcher fenced the run's partition")

func newFences(js jetstream.JetStream, subjects events.Subjects, member string) *fences {
	return &fences{js: js, subjects: subjects, member: member, serving: map[int]uint64{}, seq: map[int]uint64{}, publishing: map[int]*sync.Mutex{}, ends: map[int]endMark{}}
}

// setCount sets how many partitions the runs have (read from the stream).
func (f *fences) setCount(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.count = n
}

// open marks partition p served and returns the serving's generation;
// its fence is published by the first transition of one of its runs
// ([fences.ensure]).
func (f *fences) open(p int) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen++
	f.serving[p] = f.gen
	f.seq[p] = 0
	return f.gen
}

// close marks partition p no longer served by the serving of generation
// gen, once its transitions in hand are done (a serving opened since, the
// partition taken back meanwhile, stays).
func (f *fences) close(p int, gen uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.serving[p] != gen {
		return
	}
	delete(f.serving, p)
	delete(f.seq, p)
}

// ensure returns the partition of runID and this dispatcher's fence on it,
// publishing the fence first if it has none yet: every transition calls it
// before it reads the run's state, so a successor's fence is stored before
// anything it reads, and whatever an earlier owner published before that
// fence is visible to it.
func (f *fences) ensure(ctx context.Context, runID string) (int, uint64, error) {
	f.mu.Lock()
	p := bus.RunPartition(runID, f.count)
	seq, serving := f.seq[p], f.serving[p]
	f.mu.Unlock()
	if serving == 0 {
		return p, 0, errNotOwner
	}
	if seq != 0 {
		return p, seq, nil
	}
	unlock := f.lockPublishing(p)
	defer unlock()
	f.mu.Lock()
	seq, serving = f.seq[p], f.serving[p]
	f.mu.Unlock()
	if serving == 0 {
		return p, 0, errNotOwner
	}
	if seq != 0 {
		return p, seq, nil // fenced meanwhile
	}
	seq, err := f.publish(ctx, p, nil)
	if err != nil {
		return p, 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.serving[p] != serving {
		return p, 0, errNotOwner // handed on meanwhile
	}
	f.seq[p] = seq
	return p, seq, nil
}

// lockPublishing locks the fence publishes of partition p.
func (f *fences) lockPublishing(p int) (unlock func()) {
	f.mu.Lock()
	m, ok := f.publishing[p]
	if !ok {
		m = &sync.Mutex{}
		f.publishing[p] = m
	}
	f.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// lost forgets the fence seq on partition p after it was found superseded:
// the partition's next transition here fences again (a dispatcher that
// still serves the partition takes it back; one that lost it to a
// successor serves nothing more of it).
func (f *fences) lost(p int, seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seq[p] == seq {
		f.seq[p] = 0
	}
}

// renew publishes a fence on partition p again when the one at seq is no
// longer in the stream (it aged out with the stream's MaxAge, or an
// operator purged it) and no other dispatcher fenced since: a publish that
// expects the fence subject to be empty. It returns the new fence.
func (f *fences) renew(ctx context.Context, p int, seq uint64) (uint64, error) {
	unlock := f.lockPublishing(p)
	defer unlock()
	f.mu.Lock()
	current := f.seq[p]
	f.mu.Unlock()
	if current != seq {
		return current, nil // renewed meanwhile
	}
	next, err := f.publish(ctx, p, nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{"0"}})
	if err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seq[p] == seq {
		f.seq[p] = next
	}
	return next, nil
}

// publish stores a fence message of partition p (holding its publishing
// lock).
func (f *fences) publish(ctx context.Context, p int, h nats.Header) (uint64, error) {
	pctx, cancel := bus.Bounded(ctx)
	defer cancel()
	ack, err := f.js.PublishMsg(pctx, &nats.Msg{Subject: f.subjects.Fence(p), Header: h, Data: []byte(f.member)})
	if err != nil {
		return 0, fmt.Errorf("dispatch: fence partition %d: %w", p, err)
	}
	return ack.Sequence, nil
}

// endStored notes the end of a run stored at seq, on one of subjects,
// under fence of partition p, its ended state not written.
func (f *fences) endStored(p int, fence, seq uint64, subjects []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seq[p] != fence {
		return // fenced again since: the new fence is stored after the end
	}
	if m := f.ends[p]; m.fence != fence || seq > m.seq {
		f.ends[p] = endMark{fence: fence, seq: seq, subjects: subjects}
	}
}

// lastEnd is the end a read of partition p's runs under fence must find
// stored (zero when there is none: the fence is the mark).
func (f *fences) lastEnd(p int, fence uint64) endMark {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m := f.ends[p]; m.fence == fence {
		return m
	}
	return endMark{}
}

// header is what an end published before its state carries: the server
// stores it only while seq is the last fence of partition p.
func (f *fences) header(p int, seq uint64) nats.Header {
	return nats.Header{
		jetstream.ExpectedLastSubjSeqHeader:     []string{strconv.FormatUint(seq, 10)},
		jetstream.ExpectedLastSubjSeqSubjHeader: []string{f.subjects.Fence(p)},
	}
}
