package dispatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/run"
	"github.com/actionbus/actionbus/internal/tracing"
)

// ReplayedLog is a run as its stored log implies it, beside the state the
// runs bucket holds for it.
type ReplayedLog struct {
	// Stored is the run's state in the runs bucket.
	Stored *run.State
	// Replayed is the state the run's log implies: its request and every
	// event of it the dispatcher consumed, applied in stored order.
	Replayed *run.State
	// Events are the types of the events applied, in order.
	Events []string
}

// ReplayLog reads the stored log of run runID of tenant — what the
// dispatcher consumed of it: its request, cancels, inputs and approvals'
// answers (the requests stream), decisions, results and synthesis parts
// (the runs stream) and fired timers (the timers stream) — and applies it
// through a new machine, as a dispatcher does: [run.Machine.Start] with
// the run's stored id key for the request, then [run.Machine.Apply] for
// every other event in the order the server stored them, arming timers
// the same way. It reads the world as it is now (catalog, policy,
// skills, artifacts) and writes nothing: the clock of each transition is
// the stored time of its event, a retry's claim on the run it retries is
// read and not written, and an action under a limit is refused (the grant
// it got is not in the log). The run must have ended.
func (d *Dispatcher) ReplayLog(ctx context.Context, tenant, runID string) (*ReplayedLog, error) {
	stored, err := d.endedState(ctx, tenant, runID, false)
	if err != nil {
		return nil, fmt.Errorf("dispatch: replay %s: %w", runID, err)
	}
	log, err := d.storedLog(ctx, tenant, runID)
	if err != nil {
		return nil, fmt.Errorf("dispatch: replay %s: %w", runID, err)
	}
	if len(log) == 0 || log[0].typ != events.TypeRunRequested {
		return nil, fmt.Errorf("dispatch: replay %s: the log does not start with its request", runID)
	}
	clock := &replayEnv{frozenEnv{env: env{d}}}
	m := run.New(clock, d.machineConfig())
	out := &ReplayedLog{Stored: stored}
	var st *run.State
	var ahead []logged // events ahead of the run when they came (run.ErrAhead)
	for i := 0; i < len(log); i++ {
		e := log[i]
		if !e.retried {
			clock.at = e.at
			out.Events = append(out.Events, e.typ)
		}
		if req, ok := e.rec.Data.(*events.RunRequested); ok {
			if st != nil {
				continue // a republished request changes nothing
			}
			req.Tenant = e.rec.Tenant
			var effects []run.Effect
			if st, effects, err = m.Start(ctx, req, stored.IDKey); err != nil {
				return nil, err
			}
			if effects, err = m.Settle(ctx, clock, st, effects); err != nil {
				return nil, err
			}
			// The run's trace is the caller's, else the dispatcher's span:
			// the shell's choice, taken from the stored state.
			if st.Trace = tracing.RunOfEvent(e.rec.Event); st.Trace == nil {
				st.Trace = stored.Trace
			}
			st.Outbox = run.Dedupe(run.ArmAdmitted(st, effects, e.at, d.cfg.ActionGrace))
			continue
		}
		if st == nil {
			continue
		}
		if st.CheckTenant(e.rec.Tenant) != nil {
			continue
		}
		effects, err := m.Apply(ctx, st, run.Event{ID: e.rec.Event.ID(), Data: e.rec.Data})
		if errors.Is(err, run.ErrAhead) {
			// Stored before what asks for it is applied (its live
			// dispatcher handed it back): it is applied again after the
			// next event that changes the run, as it was then.
			e.retried = true
			ahead = append(ahead, e)
			continue
		}
		if err == nil {
			effects, err = m.Settle(ctx, clock, st, effects)
		}
		if err != nil {
			return nil, err
		}
		if len(ahead) > 0 && len(effects) > 0 {
			log = append(log[:i+1:i+1], append(ahead, log[i+1:]...)...)
			ahead = nil
		}
		effects, _ = run.Stored(effects)
		if len(effects) == 0 {
			continue
		}
		st.Outbox = run.Dedupe(run.Arm(st, effects, clock.at))
		st.UpdatedAt = clock.at.UTC()
	}
	if st == nil {
		return nil, fmt.Errorf("dispatch: replay %s: no request in the log", runID)
	}
	out.Replayed = st
	return out, nil
}

// logged is one stored event of a run's log.
type logged struct {
	rec *events.Received
	typ string
	at  time.Time
	// pos is where the event is stored (storedAt).
	pos string
	// retried marks an event a replay applies again after it was ahead
	// of the run (run.ErrAhead).
	retried bool
}

// storedLog reads the events of one run the dispatcher consumes from the
// three streams it consumes, ordered by the time the server stored them.
func (d *Dispatcher) storedLog(ctx context.Context, tenant, runID string) ([]logged, error) {
	s := d.bus.Subjects()
	var all []logged
	for _, src := range []struct {
		stream  string
		filters []string
	}{
		{d.topo.StreamRequests(), []string{s.RunEvents(tenant, runID)}},
		{d.topo.StreamRuns(), slices.Concat(s.StoredForms(tenant, runID, "decision"), s.StoredForms(tenant, runID, "result"), s.StoredForms(tenant, runID, "synthesized"))},
		{d.topo.StreamTimers(), s.StoredForms(tenant, runID, "timer")},
	} {
		got, err := d.readStream(ctx, src.stream, src.filters)
		if err != nil {
			return nil, err
		}
		all = append(all, got...)
	}
	slices.SortStableFunc(all, func(a, b logged) int { return a.at.Compare(b.at) })
	return all, nil
}

// readStream reads every message of stream on filters, decoded as the
// dispatcher decodes what it consumes (a message it would reject is left
// out: it never reached the machine), in stored order. It reads with
// batch direct gets, page by page until a page comes back empty, each
// message at the subject and sequence the server gives it
// (bus.ReadAsStored): the deployed dispatcher user may make them on the
// three streams a run's log is in, and may not create consumers there (an
// ordered consumer was refused, and a repair waited out its deadline).
func (d *Dispatcher) readStream(ctx context.Context, stream string, filters []string) ([]logged, error) {
	const page = 256
	type read struct {
		seq uint64
		logged
	}
	var all []read
	for _, filter := range filters {
		for seq := uint64(1); ; {
			gctx, cancel := bus.Bounded(ctx)
			msgs, err := jetstreamext.GetBatch(gctx, d.js, stream, page, jetstreamext.GetBatchSubject(filter), jetstreamext.GetBatchSeq(seq))
			if err != nil {
				cancel()
				return nil, fmt.Errorf("reading %s: %w", stream, err)
			}
			n := 0
			// The server's subject and sequence, not a publisher's own
			// header (an executor writes the runs stream): paging by a
			// forged sequence never ended.
			for m, err := range bus.AsStored(msgs) {
				if err != nil {
					cancel()
					return nil, fmt.Errorf("reading %s: %w", stream, err)
				}
				n++
				seq = m.Sequence + 1
				rec, err := d.bus.Receive(m.Subject, m.Header, m.Data)
				if err != nil {
					continue
				}
				all = append(all, read{m.Sequence, logged{rec: rec, typ: rec.Event.Type(), at: m.Time, pos: position(stream, m.Sequence)}})
			}
			cancel()
			if err := ctx.Err(); err != nil {
				// A page cut short by the deadline reads as an end.
				return nil, fmt.Errorf("reading %s: %w", stream, err)
			}
			if n == 0 {
				break
			}
		}
	}
	slices.SortFunc(all, func(a, b read) int { return cmp.Compare(a.seq, b.seq) })
	out := make([]logged, len(all))
	for i, r := range all {
		out[i] = r.logged
	}
	return out, nil
}

// replayEnv is the dispatcher's world for a replay: a frozenEnv whose
// clock is the stored time of the event being applied, which refuses an
// action under a limit (a replay applies the whole log, and whether the
// call got its slot then, or waited, is not in it).
type replayEnv struct {
	frozenEnv
}

// Acquire grants an action without a limit and refuses one under a limit.
func (e *replayEnv) Acquire(ctx context.Context, _ *run.State, c run.CallState) (run.Capacity, error) {
	spec, err := e.limitOf(ctx, c.Action)
	if err != nil {
		return run.Capacity{}, err
	}
	if !spec.IsZero() {
		return run.Capacity{}, fmt.Errorf("dispatch: replay: action %s is under a limit, whose grant is not in the log", c.Action)
	}
	return run.Capacity{OK: true}, nil
}
