package dispatch

import (
	"context"
	"sync"
	"time"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/limits"
	"github.com/actionbus/actionbus/internal/limits/limitstore"
	"github.com/actionbus/actionbus/internal/run"
)

// Acquire asks the limit in force for call c's action (the policy's, else
// the action's declared one) for a slot, in the limits bucket shared by
// every dispatcher.
func (e env) Acquire(ctx context.Context, st *run.State, c run.CallState) (run.Capacity, error) {
	spec, key, err := e.limitKey(ctx, st, c)
	if err != nil || spec.IsZero() {
		return run.Capacity{OK: err == nil}, err
	}
	bctx, cancel := bus.Bounded(ctx)
	defer cancel()
	g, err := e.d.limits.Acquire(bctx, key, spec, run.LimitRequest(st, c, e.d.cfg.ActionGrace))
	if err != nil {
		return run.Capacity{Key: key}, err
	}
	if g.OK {
		e.d.cfg.Metrics.CapacityWait(c.Action, 0)
	} else {
		e.d.cfg.Metrics.CapacityWait(c.Action, g.Waiting)
	}
	return run.Capacity{Key: key, OK: g.OK, RetryAt: g.RetryAt, Position: g.Position, Waiting: g.Waiting}, nil
}

// limitKey is the limit in force for call c's action (zero: none) and,
// when there is one, the key of the slot the call asks for.
func (e env) limitKey(ctx context.Context, st *run.State, c run.CallState) (limits.Spec, string, error) {
	spec, err := e.limitOf(ctx, c.Action)
	if err != nil || spec.IsZero() {
		return spec, "", err
	}
	key, err := spec.RenderKey(run.LimitCall(st, c))
	return spec, key, err
}

// limitOf is the limit in force for action (zero: none).
func (e env) limitOf(ctx context.Context, action string) (limits.Spec, error) {
	entry, err := e.d.cat.Get(ctx, action)
	if err != nil {
		return limits.Spec{}, err
	}
	return e.d.policy.Load().Config.LimitFor(action, entry.Limits), nil
}

// wakeFirst is how many waiters a freed slot wakes: the first may be gone
// (its run ended), so the next is woken too.
const wakeFirst = 2

// release frees a call's slot of a limit and wakes the first runs waiting
// on the key, whichever dispatcher holds them.
func (d *Dispatcher) release(ctx context.Context, e run.Effect) error {
	bctx, cancel := bus.Bounded(ctx)
	defer cancel()
	next, err := d.limits.Release(bctx, e.Key, e.CallID, wakeFirst)
	if err != nil {
		return err
	}
	for _, w := range next {
		d.wakes.at(w.Tenant, w.RunID, time.Now())
	}
	return nil
}

// wakeups wakes runs waiting for capacity from memory: one timer per run,
// at the earliest time asked. It only saves latency: every waiting run has
// a durable capacity timer as well.
type wakeups struct {
	d      *Dispatcher
	ctx    context.Context
	mu     sync.Mutex
	timers map[string]wakeup
}

type wakeup struct {
	at    time.Time
	timer *time.Timer
}

func newWakeups(d *Dispatcher) *wakeups {
	return &wakeups{d: d, ctx: context.Background(), timers: map[string]wakeup{}}
}

// start binds wake-ups to the dispatcher's serving context.
func (w *wakeups) start(ctx context.Context) {
	w.mu.Lock()
	w.ctx = ctx
	w.mu.Unlock()
	context.AfterFunc(ctx, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		for id, t := range w.timers {
			t.timer.Stop()
			delete(w.timers, id)
		}
	})
}

// schedule wakes the run of st at the times of its wake effects.
func (w *wakeups) schedule(st *run.State, effects []run.Effect) {
	for _, e := range effects {
		w.at(st.TenantOrDefault(), st.RunID, e.At)
	}
}

// at wakes the run at t (or at an earlier time already set).
func (w *wakeups) at(tenant, runID string, t time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ctx.Err() != nil {
		return
	}
	if cur, ok := w.timers[runID]; ok {
		if !t.Before(cur.at) {
			return
		}
		cur.timer.Stop()
	}
	ctx := w.ctx
	timer := time.AfterFunc(time.Until(t), func() {
		w.mu.Lock()
		delete(w.timers, runID)
		w.mu.Unlock()
		if err := w.d.transition(ctx, tenant, runID, run.Event{ID: events.NewID(), Data: &run.CapacityCheck{}}, "capacity-check", "", false); err != nil && ctx.Err() == nil {
			w.d.log.Debug("capacity check failed; the run's capacity timer retries", "run_id", runID, "err", err)
		}
	})
	w.timers[runID] = wakeup{at: t, timer: timer}
}

// openLimits opens the limits bucket shared by every dispatcher.
func (d *Dispatcher) openLimits(ctx context.Context) error {
	kv, err := d.js.KeyValue(ctx, d.topo.BucketLimits())
	if err != nil {
		return err
	}
	d.limits = limitstore.New(kv)
	return nil
}
