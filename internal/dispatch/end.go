package dispatch

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/jsoncodec"
	"github.com/actionbus/actionbus/internal/run"
)

// A run's end is usually its commit. When the state a transition ends
// the run from is one this dispatcher wrote under its current fence of
// the run's partition (see fences), the terminal event is published first,
// expecting that fence (the server refuses it once another dispatcher
// fenced the partition), naming the events the transition applied, and
// no state is written after it (endIsCommit; else the ended state is
// written after it): a run's end puts one stored write on the client's
// path instead of two in sequence, each an fsync where the server syncs
// every write, and the run stores one write fewer.
//
// What makes it safe, with the state as stored the one before the end:
//   - Any other writer of the run's state must have read the revision this
//     dispatcher wrote, after it was written, so after this dispatcher's
//     fence; and every read of a state from the bucket by an owner looks,
//     in the same request, for the run's stored end and for the partition's
//     last fence, from a replica that holds the last end this dispatcher
//     committed (lookEnd). A reader that finds another's fence gives way
//     (errFenced); one that finds the end rebuilds the ended state from
//     what the end names (repair), so no transition is applied after a
//     run's end, whether or not its ended state was written.
//   - The fence check makes the end itself fail once a successor fenced:
//     a dispatcher that lost its partition while paused cannot publish an
//     end the successor, which read the state after its fence, does not
//     know of.
//   - A crash after the end, before the events that ended the run are
//     acknowledged, redelivers them; the next owner reads the state, finds
//     the end and rebuilds the ended state, and its releases and signals
//     are sent then.
//   - Readers that are not the owner (a retry, a replay) rebuild the ended
//     state the same way (endedState) and write nothing.
//
// A state this dispatcher only read (after a restart, a partition move or
// a write conflict) ends the other way: state first, revision-checked,
// then the end.

// endFirst commits a transition that ends run st: st was read at revision
// (written by this dispatcher under fence of partition p, last at
// lastWrite), its outbox set and val its encoding. It publishes the
// outbox, the end expecting the fence; the end is the transition's commit
// when endIsCommit allows (no state is written: the end names what the
// transition applied), else the state is written after it. The events
// that led here are acknowledged once that is done: a failure after the
// end is published hands them back, and their redelivery adopts the
// stored end.
func (d *Dispatcher) endFirst(ctx context.Context, st *run.State, revision uint64, val []byte, p int, fence uint64, applied []*job, lastWrite time.Time) error {
	header := d.fences.header(p, fence)
	header.Set(endedByHeader, endedBy(applied))
	d.tellPools(st) // before the end: see tellPools
	endSeq, err := d.publishWith(ctx, st, st.Outbox, header)
	if bus.IsRevisionConflict(err) {
		// The fence is not the partition's last: another dispatcher fenced
		// it since, or it aged out of the stream (it is renewed then, with
		// a publish that expects none). The events are redelivered.
		d.cache.drop(st.RunID)
		if _, rerr := d.fences.renew(ctx, p, fence); rerr != nil {
			d.fences.lost(p, fence)
			d.log.Info("run end refused: another dispatcher fenced the partition", "run_id", st.RunID, "partition", p)
		}
		return fmt.Errorf("dispatch: run %s: its end: %w", st.RunID, errFenced)
	}
	if tooLarge := overPayload(err); tooLarge != nil {
		d.cache.drop(st.RunID)
		d.log.Warn("an event of the run is over the server's max payload; failing the run", "run_id", st.RunID, "err", tooLarge.Message)
		return d.failStored(ctx, st.RunID, tooLarge)
	}
	if err != nil {
		// The end may be stored (an acknowledgement lost, a release that
		// failed after it): the next read of the run must expect a fence
		// stored after it.
		d.fences.lost(p, fence)
		d.cache.drop(st.RunID)
		return err
	}
	d.cfg.Metrics.RunEnded(string(st.Kind), string(st.Status), st.UpdatedAt.Sub(st.CreatedAt))
	if d.crashAfterEnd != nil && d.crashAfterEnd(st.RunID) {
		d.cache.drop(st.RunID)
		d.fences.lost(p, fence) // as a restarted process would, it fences again
		// What the process held in memory is lost with it: a run admitted
		// unstored, and its request, handed back.
		d.deferred.crashed(st.RunID)
		return errSimulatedCrash
	}
	if d.endIsCommit(st, applied, lastWrite) {
		d.fences.endStored(p, fence, endSeq, d.endFilters(st))
		d.endCommitted(st)
		// The bucket still holds revision, whose outbox was sent.
		d.cache.put(st, revision, fence)
		return nil
	}
	uctx, cancel := bus.Bounded(ctx)
	rev, err := d.runs.Update(uctx, st.RunID, val, revision)
	cancel()
	if err != nil {
		// The end is stored after this dispatcher's fence: a replica that
		// holds the fence may not hold the end, so the next read of the
		// run must expect a newer fence (published after the end).
		d.fences.lost(p, fence)
		d.cache.drop(st.RunID)
		if bus.IsRevisionConflict(err) {
			d.stateConflict(st.RunID)
		}
		// The end is adopted and written by the events' redelivery, or
		// by the republisher (flushStored) should they run out first;
		// the alarm, the backstop until then, is canceled then.
		d.unsent.add(st.RunID)
		return err
	}
	d.endCommitted(st)
	d.cache.put(st, rev, fence)
	return nil
}

// endIsCommit reports whether a run's end, published first, is the
// transition's commit, with no ended state written after it: the ended
// state is then the state as stored plus the events the end names
// (endedByHeader), which every reader rebuilds (repair). That takes:
//   - the run completed. A failed or canceled run may be retried, and a
//     retry reuses what its ended state says its calls did; a rebuild
//     applies the named events against the world as it is then (approval
//     keys, policy, the clock), and one that no longer ends the run as
//     stored (a denial signed with a key since retired) falls back to the
//     state as stored, without the results the transition recorded, which
//     a retry would run again. A completed run is never retried: its
//     ended state is read by replays and listings only.
//   - every event applied stored: one the dispatcher made itself (a
//     capacity check) names nothing a reader can find.
//   - the state stored last within half the runs bucket's TTL (the run
//     retention): the state as stored then outlives the end by no less.
func (d *Dispatcher) endIsCommit(st *run.State, applied []*job, lastWrite time.Time) bool {
	if st.Status != run.StatusCompleted {
		return false
	}
	for _, j := range applied {
		if j.pos == "" {
			return false
		}
	}
	return d.stateTTL == 0 || time.Since(lastWrite) < d.stateTTL/2
}

// lookEnd reads, in one batch direct get, run st's stored end (nil if it
// has none) and partition p's last fence, which must be fence: another
// dispatcher's is errFenced. The replica that answers must hold the fence
// and the last end this dispatcher stored under it without a state
// (fences.lastEnd), else the read is retried (fenceUnseen, or after a new
// fence). An event on a terminal subject without the run's end id is not
// its end (only the services may publish there; its id is derived from
// the run's secret id key).
func (d *Dispatcher) lookEnd(ctx context.Context, st *run.State, p int, fence uint64) (*endInStream, error) {
	subjects := d.bus.Subjects()
	mark := d.fences.lastEnd(p, fence)
	filters := append([]string{subjects.Fence(p)}, d.endFilters(st)...)
	for _, s := range mark.subjects {
		if !slices.Contains(filters, s) {
			filters = append(filters, s)
		}
	}
	gctx, cancel := bus.Bounded(ctx)
	defer cancel()
	msgs, err := jetstreamext.GetLastMsgsFor(gctx, d.js, d.topo.StreamRuns(), filters)
	if err != nil {
		return nil, fmt.Errorf("dispatch: run %s: reading its stored end: %w", st.RunID, err)
	}
	var end *endInStream
	fenceSubject, fenced, marked := subjects.Fence(p), false, mark.seq == 0
	for m, err := range bus.AsStored(msgs) {
		if err != nil {
			return nil, fmt.Errorf("dispatch: run %s: reading its stored end: %w", st.RunID, err)
		}
		if m.Subject == fenceSubject {
			if m.Sequence > fence {
				d.fences.lost(p, fence)
				return nil, fmt.Errorf("dispatch: run %s: %w", st.RunID, errFenced)
			}
			// An older fence: the replica that answered has not stored
			// this dispatcher's yet (a direct get may be served by a
			// follower), so it may not hold an end stored before it.
			fenced = m.Sequence == fence
			continue
		}
		if m.Sequence >= mark.seq {
			// The replica holds the last end stored under the fence (any
			// message stored after it would do).
			marked = true
		}
		if tenant, runID := subjects.RunFromSubject(m.Subject); tenant != st.TenantOrDefault() || runID != st.RunID {
			continue // the last end's, of another run
		}
		e, err := endOf(st, m)
		if err != nil {
			return nil, bus.Permanent(fmt.Errorf("dispatch: run %s: %w", st.RunID, err))
		}
		if e == nil {
			d.log.Warn("ignoring a terminal event that is not the run's", "run_id", st.RunID, "subject", m.Subject)
			continue
		}
		end = e
	}
	if !fenced {
		return nil, d.fenceUnseen(ctx, st.RunID, p, fence)
	}
	if !marked {
		// The replica lags behind an end stored after the fence (or that
		// end is no longer in the stream): under a new fence, stored after
		// it, the fence is the mark again.
		d.fences.lost(p, fence)
		return nil, fmt.Errorf("dispatch: run %s: the read did not hold the partition's last end: %w", st.RunID, errFenced)
	}
	return end, nil
}

// endOf is run st's end as stored in m, nil when m is another event (one
// without the run's end id: only the run's end carries it).
func endOf(st *run.State, m *jetstream.RawStreamMsg) (*endInStream, error) {
	e, err := bus.Decode(m.Subject, m.Header, m.Data)
	if err != nil {
		return nil, fmt.Errorf("its stored end does not decode: %w", err)
	}
	if e.ID() != run.EndID(st) {
		return nil, nil
	}
	entry, ok := events.Lookup(e.Type())
	if !ok {
		return nil, nil
	}
	data := entry.New()
	if err := events.DataAs(e, data); err != nil {
		return nil, fmt.Errorf("its stored end does not decode: %w", err)
	}
	t, ok := run.StoredEnd(data)
	if !ok {
		return nil, nil
	}
	end := &endInStream{Terminal: t, endedBy: parseEndedBy(m.Header.Get(endedByHeader)), at: m.Time}
	switch d := data.(type) {
	case *events.RunCompleted:
		end.usage = d.Usage
	case *events.RunFailed:
		end.usage = d.Usage
	case *events.RunCanceled:
		end.usage = d.Usage
	}
	return end, nil
}

// fenceUnseen is lookEnd's error when the answer did not hold this
// dispatcher's fence of partition p: the replica that answered is behind
// (the read is retried), or the fence is no longer in the stream (it aged
// out with the stream's MaxAge, or was purged), and it is published again
// if no other dispatcher fenced since (fences.renew). Either way the
// transition is retried, under the fence then current.
func (d *Dispatcher) fenceUnseen(ctx context.Context, runID string, p int, fence uint64) error {
	if _, err := d.fences.renew(ctx, p, fence); err != nil && !bus.IsRevisionConflict(err) {
		return err
	}
	return fmt.Errorf("dispatch: run %s: the read did not hold the partition's fence %d: %w", runID, fence, errFenced)
}

// loadOwned reads the stored state of runID, a run of a partition this
// dispatcher serves, for a transition: after its fence (fences.ensure),
// with lookEnd. A state whose end is stored but not written is returned
// ended (repair, from the run's log), adopted true, its outbox what the
// end implies besides its event (to be written and published:
// commitAdopted). fence is this
// dispatcher's on the run's partition.
func (d *Dispatcher) loadOwned(ctx context.Context, runID string) (st *run.State, entry jetstream.KeyValueEntry, adopted bool, fence uint64, err error) {
	st, entry, end, fence, err := d.loadOwnedEnd(ctx, runID)
	if err != nil || end == nil {
		return st, entry, false, fence, err
	}
	repaired, outbox := d.repair(ctx, st, end, nil)
	repaired.Outbox = outbox
	return repaired, entry, true, fence, nil
}

// endInStream is a run's end as stored: its terminal and the events its
// transition applied (endedByHeader).
type endInStream struct {
	*run.Terminal
	endedBy []endedEvent
	// at is when the end was stored: the time of the transition's commit.
	at time.Time
	// usage is what the run's LLM calls used, as its end says.
	usage *events.RunUsage
}

// endedByHeader, on an end published first, names the events the
// transition that ended the run applied to the state last written, in
// order, each as its type, id and stored position ("<type> <id>
// <stream>:<sequence>", comma-separated): a repair applies exactly those
// (see Dispatcher.repair), found where they are stored. Neither an id nor
// a type and id name one event: a client chooses its events' ids (and
// hears the ids an end names), and may store several events of its own
// type under one id (another Nats-Msg-Id; a cancel sent before its run,
// rejected but stored), so only the position is taken to find an event,
// in hand or in the log.
const endedByHeader = "Ab-Ended-By"

// endedEvent names an event an end was published for: its type, id and
// stored position. One without a position (a capacity check, which is
// not stored; a header of an earlier release) names nothing a repair can
// find, and the end is adopted then.
type endedEvent struct{ typ, id, pos string }

func (e endedEvent) String() string { return e.typ + " " + e.id + " " + e.pos }

// storedAt is the position of a stored message: its stream and stream
// sequence.
func storedAt(meta *jetstream.MsgMetadata) string { return position(meta.Stream, meta.Sequence.Stream) }

// position is the position of the message at sequence seq of stream, as
// an end names it (storedAt).
func position(stream string, seq uint64) string { return stream + ":" + strconv.FormatUint(seq, 10) }

func endedBy(jobs []*job) string {
	names := make([]string, len(jobs))
	for i, j := range jobs {
		names[i] = endedEvent{typ: j.typ, id: j.ev.ID, pos: j.pos}.String()
	}
	return strings.Join(names, ",")
}

func parseEndedBy(header string) []endedEvent {
	if header == "" {
		return nil
	}
	var out []endedEvent
	for _, name := range strings.Split(header, ",") {
		var e endedEvent
		switch f := strings.Fields(name); len(f) {
		case 3:
			e = endedEvent{typ: f[0], id: f[1], pos: f[2]}
		case 2:
			e = endedEvent{typ: f[0], id: f[1]}
		default:
			e = endedEvent{id: strings.TrimSpace(name)}
		}
		out = append(out, e)
	}
	return out
}

// loadOwnedEnd is [Dispatcher.loadOwned] without the adoption: end is
// the run's stored end when its state, not ended, is to adopt it.
func (d *Dispatcher) loadOwnedEnd(ctx context.Context, runID string) (st *run.State, entry jetstream.KeyValueEntry, end *endInStream, fence uint64, err error) {
	p, fence, err := d.fences.ensure(ctx, runID)
	if err != nil {
		return nil, nil, nil, 0, err
	}
	if st, entry, err = d.loadStored(ctx, runID); err != nil {
		return nil, nil, nil, fence, err
	}
	if st.Fence > fence {
		// Written by a dispatcher that fenced the partition after this
		// one did.
		d.fences.lost(p, fence)
		return nil, nil, nil, fence, fmt.Errorf("dispatch: run %s: its state was written under fence %d: %w", runID, st.Fence, errFenced)
	}
	if st.IsTerminal() {
		return st, entry, nil, fence, nil
	}
	end, err = d.lookEnd(ctx, st, p, fence)
	return st, entry, end, fence, err
}

// repair ends st, the state as read of a run whose end is stored and
// whose ended state was not written (its writer published the end first
// and crashed, or its write failed), and returns the state to write with
// what it implies besides its event (slots released).
//
// The ended state is the state as read plus what the transition that
// ended the run applied — a call's result, which a retry of the run
// reuses; a step — and the end names the events that transition applied
// (endedByHeader). repair applies exactly those, in that order, to a
// copy, their effects dropped, and keeps the copy if it ends the run as
// stored. It takes them from batch, the events in hand (they were not
// acknowledged, so they come back), and those not in hand — they came
// back apart, a late first delivery found the end before them, or the
// caller has none (the republisher) — from the run's stored log. Anything
// else in hand (a result of a canceled run that finished after the end, a
// grant sent after it) is no part of that transition and meets the ended
// state, as it does without a crash. When a named event is in neither
// (one the log does not hold, such as a capacity check), or the copy ends
// otherwise, the end is adopted on the state as read
// (run.Machine.Adopt), without what the transition recorded besides it.
// The recomputation runs in a frozenEnv (the clock at the end's stored
// time, no slot, token or artifact taken or stored again); the releases
// its transitions imply (a finished call's slot, which the writer may not
// have released before it died) are kept either way.
func (d *Dispatcher) repair(ctx context.Context, st *run.State, end *endInStream, batch []*job) (*run.State, []run.Effect) {
	rebuilt, releases := d.recompute(ctx, st, end, batch)
	if rebuilt != nil {
		return rebuilt, releases
	}
	return st, append(releases, d.machine.Adopt(st, end.Terminal)...)
}

// namedEvent is an event the end of a run names, with the tenant its
// subject names.
type namedEvent struct {
	ev     run.Event
	tenant string
}

// recompute applies the events that end names (from batch, else from the
// run's stored log) to a copy of st, as repair describes, and returns the
// copy if it ends as end, with the releases of slots its transitions
// implied (and, if it does not, of every slot it holds).
func (d *Dispatcher) recompute(ctx context.Context, st *run.State, end *endInStream, batch []*job) (*run.State, []run.Effect) {
	if len(end.endedBy) == 0 {
		return nil, nil
	}
	named := make(map[endedEvent]*namedEvent, len(end.endedBy))
	for _, e := range end.endedBy {
		named[e] = nil
	}
	missing := len(named)
	for _, j := range batch {
		key := endedEvent{typ: j.typ, id: j.ev.ID, pos: j.pos}
		if n, ok := named[key]; ok && n == nil && key.pos != "" {
			named[key] = &namedEvent{ev: j.ev, tenant: j.tenant}
			missing--
		}
	}
	if missing > 0 && !d.namedFromLog(ctx, st, named) {
		return nil, nil
	}
	val, err := st.Encode()
	if err != nil {
		return nil, nil
	}
	copied, err := run.DecodeState(val)
	if err != nil {
		return nil, nil
	}
	// The transition happened already: it is applied again in the world as
	// it was (the clock at the end's stored time), taking no slot or token
	// and storing no artifact a second time (frozenEnv).
	at := end.at
	if at.IsZero() {
		at = time.Now()
	}
	world := &frozenEnv{env: env{d}, at: at}
	frozen := run.New(world, d.machineConfig())
	var releases, all []run.Effect
	for _, e := range end.endedBy {
		n := named[e]
		if copied.IsTerminal() || copied.CheckTenant(n.tenant) != nil {
			continue
		}
		effects, err := frozen.Apply(ctx, &copied, n.ev)
		if err == nil {
			effects, err = frozen.Settle(ctx, world, &copied, effects)
		}
		if err != nil {
			effects = nil // nothing decided
		}
		all = append(all, effects...)
		for _, e := range effects {
			if e.Kind == run.EffectRelease {
				releases = append(releases, e)
			}
		}
		if err != nil {
			break
		}
	}
	if !copied.IsTerminal() || !sameEnd(copied.Terminal, end.Terminal) {
		return nil, append(releases, d.machine.Adopt(&copied, end.Terminal)...)
	}
	// The state as its writer would have stored it with the end: updated
	// when the end was stored, its outbox what the transition implied (a
	// writer that repairs it sets its own).
	stored, _ := run.Stored(all)
	if !end.at.IsZero() {
		copied.UpdatedAt = end.at
	}
	copied.Outbox = run.Dedupe(run.Arm(&copied, stored, copied.UpdatedAt))
	return &copied, releases
}

// namedFromLog fills the events of named not yet found from run st's
// stored log, and reports whether every one of them is found. A log that
// cannot be read finds none: the end is adopted then.
func (d *Dispatcher) namedFromLog(ctx context.Context, st *run.State, named map[endedEvent]*namedEvent) bool {
	log, err := d.storedLog(ctx, st.TenantOrDefault(), st.RunID)
	if err != nil {
		d.log.Warn("repairing a run's end: its log could not be read; adopting the end", "run_id", st.RunID, "err", err)
		return false
	}
	for _, e := range log {
		key := endedEvent{typ: e.typ, id: e.rec.Event.ID(), pos: e.pos}
		if n, ok := named[key]; ok && n == nil {
			named[key] = &namedEvent{ev: run.Event{ID: key.id, Data: e.rec.Data}, tenant: e.rec.Tenant}
		}
	}
	for e, n := range named {
		if n == nil {
			d.log.Warn("repairing a run's end: an event that ended it is not in its log; adopting the end", "run_id", st.RunID, "event", e.String())
			return false
		}
	}
	return true
}

// sameEnd reports whether two terminals are the same end: equal once
// both are encoded and decoded again (a stored end's output is decoded
// JSON; a computed one may hold typed values).
func sameEnd(a, b *run.Terminal) bool {
	x, errA := asJSON(a)
	y, errB := asJSON(b)
	return errA == nil && errB == nil && reflect.DeepEqual(x, y)
}

func asJSON(v any) (any, error) {
	b, err := jsoncodec.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out any
	err = jsoncodec.Unmarshal(b, &out)
	return out, err
}

// commitAdopted writes st, ended by adoption (loadOwned) from the state
// read at revision, and publishes what its end implies.
func (d *Dispatcher) commitAdopted(ctx context.Context, st *run.State, revision, fence uint64) error {
	st.UpdatedAt, st.Fence = time.Now().UTC(), fence
	val, err := st.Encode()
	if err != nil {
		return bus.Permanent(err)
	}
	uctx, cancel := bus.Bounded(ctx)
	rev, err := d.runs.Update(uctx, st.RunID, val, revision)
	cancel()
	if err != nil {
		d.cache.drop(st.RunID)
		return err
	}
	return d.flush(ctx, st, rev, fence)
}

// errNotEnded is endedState's error for a run that has not ended.
var errNotEnded = errors.New("the run has not ended")

// endInFlight bounds how long a reader of a run that looks unended waits
// for its end: a client hears a run's end as the server routes it, which
// may be before the stream has stored it, so a retry or a replay asked
// for at once may not find it yet.
const endInFlight = 500 * time.Millisecond

// endPoll is how often a reader waiting for an end in flight reads again.
const endPoll = 20 * time.Millisecond

// maxEndWaits bounds the readers that wait for an end in flight at once:
// each holds a handler of the dispatcher and its run's lock, and a client
// can ask to retry its running runs as often as it likes. Beyond it, a
// run that looks unended is refused at once as one that has not ended
// (its reader may ask again).
const maxEndWaits = 4

// endedState returns the ended state of run runID, for a reader (a retry
// of it, a replay): the stored state if it ended, else the state as
// stored plus the events its stored end names (repair: the end is usually
// the commit of the transition that ended the run, and no state is
// written after it; see endIsCommit). An end not found is waited for up
// to endInFlight (errNotEnded after that: the run has not ended). The
// rebuilding takes no slot and stores nothing (frozenEnv); with release,
// the releases of slots its transitions imply are carried out (a retry
// being admitted), else left to the run's owner (a replay, a rebuild
// reading the run a retry names); no state is written.
func (d *Dispatcher) endedState(ctx context.Context, tenant, runID string, release bool) (*run.State, error) {
	st, _, err := d.loadTenantRun(ctx, tenant, runID)
	if err != nil || st.IsTerminal() {
		return st, err
	}
	end, err := d.readEnd(ctx, st)
	if err != nil {
		return nil, err
	}
	if end == nil {
		if d.endWaits.Add(1) > maxEndWaits {
			d.endWaits.Add(-1)
			return nil, errNotEnded
		}
		defer d.endWaits.Add(-1)
		if end, err = d.awaitEnd(ctx, st); err != nil {
			return nil, err
		}
	}
	return d.rebuild(ctx, st, end, release)
}

// rebuildEnded is run st, as stored, ended as its stored end says (st
// when it has none yet).
func (d *Dispatcher) rebuildEnded(ctx context.Context, st *run.State) (*run.State, error) {
	end, err := d.readEnd(ctx, st)
	if err != nil || end == nil {
		return st, err
	}
	return d.rebuild(ctx, st, end, true)
}

// rebuild is st, as stored, ended by end (repair, for a reader); with
// release, the releases of slots its transitions imply are carried out.
func (d *Dispatcher) rebuild(ctx context.Context, st *run.State, end *endInStream, release bool) (*run.State, error) {
	ended, releases := d.repair(ctx, st, end, nil)
	if !release {
		return ended, nil
	}
	for _, e := range releases {
		if err := d.release(ctx, e); err != nil {
			return nil, err
		}
	}
	return ended, nil
}

// awaitEnd reads run st's stored end again every endPoll until it is
// found, for up to endInFlight (errNotEnded then).
func (d *Dispatcher) awaitEnd(ctx context.Context, st *run.State) (*endInStream, error) {
	wctx, cancel := context.WithTimeout(ctx, endInFlight)
	defer cancel()
	tick := time.NewTicker(endPoll)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-wctx.Done():
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, errNotEnded
		}
		end, err := d.readEnd(ctx, st)
		if err != nil || end != nil {
			return end, err
		}
	}
}

// readEnd reads run st's stored end, for a reader (no fence is
// involved): nil when it has none.
func (d *Dispatcher) readEnd(ctx context.Context, st *run.State) (*endInStream, error) {
	return readEnd(ctx, d.js, d.topo, st)
}

// ReadEnd returns the terminal event stored for run st (as its run-state
// entry holds it) in the runs stream of topo, with the usage of the run's
// LLM calls it reports, or nil: a run's end is usually the commit of the
// transition that ended it, and its state as stored is the one before
// (what ended it is named by the end). For readers that list runs; a
// dispatcher rebuilds the ended state.
func ReadEnd(ctx context.Context, js jetstream.JetStream, topo bus.Topology, st *run.State) (*run.Terminal, *events.RunUsage, error) {
	end, err := readEnd(ctx, js, topo, st)
	if end == nil || err != nil {
		return nil, nil, err
	}
	return end.Terminal, end.usage, nil
}

func readEnd(ctx context.Context, js jetstream.JetStream, topo bus.Topology, st *run.State) (*endInStream, error) {
	gctx, cancel := bus.Bounded(ctx)
	defer cancel()
	msgs, err := jetstreamext.GetLastMsgsFor(gctx, js, topo.StreamRuns(), endFilters(topo.Subjects(), st))
	if err != nil {
		return nil, fmt.Errorf("dispatch: run %s: reading its stored end: %w", st.RunID, err)
	}
	for m, err := range bus.AsStored(msgs) {
		if err != nil {
			return nil, fmt.Errorf("dispatch: run %s: reading its stored end: %w", st.RunID, err)
		}
		if end, err := endOf(st, m); err == nil && end != nil {
			return end, nil
		}
	}
	return nil, nil
}

// endFilters are the subjects run st's end may be stored on, in every
// stored form.
func (d *Dispatcher) endFilters(st *run.State) []string {
	return endFilters(d.bus.Subjects(), st)
}

func endFilters(subjects events.Subjects, st *run.State) []string {
	var filters []string
	for _, verb := range []string{"completed", "failed", "canceled"} {
		filters = append(filters, subjects.StoredForms(st.TenantOrDefault(), st.RunID, verb)...)
	}
	return filters
}
