package dispatch

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/actionbus/actionbus/internal/run"
)

// deferredAlarms arms the alarms of new runs late, or never. Every run is
// admitted with an alarm (its deadline, its first stage's), but most runs
// end long before it would fire; arming it costs a stored schedule, its
// acknowledgement and, once the run ends, a purge — four messages and a
// write to disk for a one-action run that takes milliseconds.
//
// So a new run's alarm is held for Config.AlarmDelay, and with it the run's
// request, unacknowledged ([bus.Later]). When the run ends within the
// delay its request is acknowledged and no schedule is ever stored; when it
// does not, the alarm is armed and then the request acknowledged. A crash
// of the holder leaves the request unacknowledged: redelivered, it finds
// the run stored and arms its alarm again ([run.Rearm]) — so no run is
// ever without an alarm once its request is acknowledged.
//
// At most maxDeferred alarms are held at once; beyond that a new run's
// alarm is armed at once (a burst of long runs must not hold back the
// requests consumer, whose MaxAckPending the held requests count in).
type deferredAlarms struct {
	d     *Dispatcher
	delay time.Duration
	max   int

	mu   sync.Mutex
	held map[string]*heldAlarm // by run id

	// crash, set by tests, simulates a crash of the holder when it returns
	// true: the alarm is never armed and the request is handed back.
	crash func(runID string) bool
}

// heldAlarm is one new run's alarm, not yet armed.
type heldAlarm struct {
	st    *run.State // tenant, run id and trace, for rendering
	alarm run.Effect
	done  chan error // settles the run's request
	timer *time.Timer
}

// maxDeferred bounds the alarms held at once.
const maxDeferred = 512

func newDeferredAlarms(d *Dispatcher, delay time.Duration) *deferredAlarms {
	return &deferredAlarms{d: d, delay: delay, max: maxDeferred, held: map[string]*heldAlarm{}}
}

// hold takes the alarm of a newly stored run out of its effects when it can
// be deferred, and returns the effects to publish now and the channel that
// settles the run's request (nil: nothing held, the caller publishes
// everything and acknowledges as usual).
func (a *deferredAlarms) hold(ctx context.Context, st *run.State, effects []run.Effect) ([]run.Effect, chan error) {
	if a.delay <= 0 || st.IsTerminal() {
		return effects, nil
	}
	rest, alarm, ok := run.SplitAlarm(effects)
	if !ok {
		return effects, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.held) >= a.max || a.held[st.RunID] != nil {
		return effects, nil
	}
	h := &heldAlarm{st: &run.State{RunID: st.RunID, Tenant: st.Tenant, Trace: st.Trace}, alarm: run.Deferred(alarm), done: make(chan error, 1)}
	h.timer = time.AfterFunc(a.delay, func() { a.arm(ctx, st.RunID, h) })
	a.held[st.RunID] = h
	return rest, h.done
}

// take removes the held alarm of runID, if it is still held by h (nil:
// whichever is held).
func (a *deferredAlarms) take(runID string, h *heldAlarm) *heldAlarm {
	a.mu.Lock()
	defer a.mu.Unlock()
	cur := a.held[runID]
	if cur == nil || (h != nil && cur != h) {
		return nil
	}
	delete(a.held, runID)
	cur.timer.Stop()
	return cur
}

// arm arms a held alarm whose delay passed with its run still going, then
// settles the run's request with the outcome.
func (a *deferredAlarms) arm(ctx context.Context, runID string, h *heldAlarm) {
	if a.take(runID, h) == nil {
		return // the run ended, or a later alarm superseded it
	}
	if a.crash != nil && a.crash(runID) {
		h.done <- errSimulatedCrash
		return
	}
	if ctx.Err() != nil {
		// Shutting down: the request is handed back, and whoever takes
		// it arms the alarm again.
		h.done <- ctx.Err()
		return
	}
	h.done <- a.d.publish(ctx, h.st, []run.Effect{h.alarm})
}

// ended settles the request of a run that ended while its alarm was held:
// no schedule was stored for it (by this dispatcher), so none needs
// canceling. It reports whether the run's alarm was held.
func (a *deferredAlarms) ended(runID string) bool {
	h := a.take(runID, nil)
	if h == nil {
		return false
	}
	h.done <- nil
	return true
}

// superseded settles the request of a run whose alarm a later transition
// armed (a schedule of the run's is stored): the held one is not needed.
func (a *deferredAlarms) superseded(runID string) {
	if h := a.take(runID, nil); h != nil {
		h.done <- nil
	}
}

// release hands back the requests of every held alarm (the dispatcher is
// stopping): whoever takes a request next arms its run's alarm again.
func (a *deferredAlarms) release() {
	a.mu.Lock()
	held := a.held
	a.held = map[string]*heldAlarm{}
	a.mu.Unlock()
	for _, h := range held {
		h.timer.Stop()
		h.done <- errReleased
	}
}

// errReleased settles a held request when the dispatcher stops.
var errReleased = errors.New("dispatch: stopping; the run's alarm is armed by whoever takes its request next")

// holds reports whether the alarm of runID is held.
func (a *deferredAlarms) holds(runID string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.held[runID] != nil
}
