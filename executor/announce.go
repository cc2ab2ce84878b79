package executor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// An executor never writes the catalog: it announces what it hosts on its
// pool's announce subject (a request to the registrar the dispatchers
// host, one queue group) and the registrar records it, refusing what
// would remove or shadow another pool's entry. The registrar's verdict is
// the reply: an executor whose announcement is refused (catalog_conflict,
// invalid_definition, invalid_skill, catalog_limit_exceeded) does not
// start, and one that no registrar answers (or that a registrar answers
// registrar_unavailable: busy with the pool) before Config.AnnounceTimeout
// fails with registrar_unavailable.

// announceBackoff bounds the waits between announcement attempts while no
// registrar answers: 100 ms doubling to 2 s.
const (
	announceFirstWait = 100 * time.Millisecond
	announceMaxWait   = 2 * time.Second
	// announceAttempt bounds one request.
	announceAttempt = 5 * time.Second
)

// announcements splits what e hosts into announcements that each fit
// within limit bytes of data (the last one carries removed). An entry
// larger than limit alone still goes in its own announcement; the server
// refuses it and the executor fails with that error.
func announcements(executor, pool string, defs, skills []entry, removed []string, limit int) []events.PoolAnnounced {
	var out []events.PoolAnnounced
	cur := events.PoolAnnounced{Executor: executor, Pool: pool}
	size := 0
	flush := func() {
		out = append(out, cur)
		cur = events.PoolAnnounced{Executor: executor, Pool: pool}
		size = 0
	}
	for _, d := range defs {
		if size > 0 && size+d.size > limit {
			flush()
		}
		cur.Actions = append(cur.Actions, d.obj)
		size += d.size
	}
	for _, s := range skills {
		if size > 0 && size+s.size > limit {
			flush()
		}
		cur.Skills = append(cur.Skills, s.obj)
		size += s.size
	}
	cur.Removed = removed
	flush()
	return out
}

// entry is an announced entry as a JSON object, and its encoded size.
type entry struct {
	obj  map[string]any
	size int
}

func toEntry(v any) (entry, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return entry{}, err
	}
	var obj map[string]any
	if err := json.Unmarshal(b, &obj); err != nil {
		return entry{}, err
	}
	return entry{obj: obj, size: len(b)}, nil
}

// announce sends what e hosts to the registrar and returns the action
// names recorded. removed are the names to take out.
func (e *Executor) announce(ctx context.Context, removed []string) error {
	var defs, sks []entry
	for _, d := range e.reg.Definitions() {
		b, err := toEntry(d)
		if err != nil {
			return fmt.Errorf("executor: announce %s: %w", d.Name, err)
		}
		defs = append(defs, b)
	}
	e.skillsMu.Lock()
	hosted := append([]Skill(nil), e.skills...)
	e.skillsMu.Unlock()
	for _, s := range hosted {
		b, err := toEntry(s)
		if err != nil {
			return fmt.Errorf("executor: announce skill %s: %w", s.Name, err)
		}
		sks = append(sks, b)
	}
	limit := 256 << 10
	if mp := e.nc.MaxPayload(); mp > 0 && int64(limit) > mp/2 {
		limit = int(mp / 2)
	}
	deadline, cancel := context.WithTimeout(ctx, e.cfg.AnnounceTimeout)
	defer cancel()
	for _, a := range announcements(e.cfg.ID, e.cfg.Pool, defs, sks, removed, limit) {
		if err := e.announceOne(deadline, a); err != nil {
			return err
		}
	}
	return nil
}

// announceOne sends one announcement, retrying with backoff while no
// registrar answers, until ctx ends.
func (e *Executor) announceOne(ctx context.Context, a events.PoolAnnounced) error {
	subject := e.topo.Subjects().Announce(e.cfg.Pool)
	ev, err := e.bus.New(events.TypePoolAnnounced, events.NewID(), "", "", a, events.Extension{Name: events.ExtPool, Value: e.cfg.Pool})
	if err != nil {
		return fmt.Errorf("executor: announce: %w", err)
	}
	msg, err := bus.Encode(subject, ev, bus.ModeBinary)
	if err != nil {
		return fmt.Errorf("executor: announce: %w", err)
	}
	wait := announceFirstWait
	var last error
	for {
		actx, cancel := context.WithTimeout(ctx, announceAttempt)
		reply, err := e.nc.RequestMsgWithContext(actx, msg)
		cancel()
		if err == nil {
			var r events.AnnounceReply
			if err := json.Unmarshal(reply.Data, &r); err != nil {
				return fmt.Errorf("executor: the registrar's reply does not decode: %w", err)
			}
			if r.Error == nil {
				return nil
			}
			if r.Error.Code != actionbus.CodeRegistrarUnavailable {
				return r.Error
			}
			err = r.Error // the registrar is busy with this pool: retry
		} else if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("executor: announce: %w", err)
		}
		last = err
		e.log.Info("no registrar answered the announcement yet; retrying", "err", err, "wait", wait)
		select {
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
				return (&actionbus.Error{Code: actionbus.CodeRegistrarUnavailable,
					Message: fmt.Sprintf("no registrar (dispatcher) answered the announcement of pool %s on %s before the deadline (%v)", e.cfg.Pool, subject, last)}).
					WithDetail("pool", e.cfg.Pool)
			}
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, announceMaxWait)
	}
}
