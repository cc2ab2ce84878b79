package dispatch

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/internal/bus"
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
// A run admitted on its request's first delivery may be held with its
// alarm without being stored at all (holdAdmitted): its request, still
// unacknowledged, is what a successor admits it from again, and the
// state is created when the alarm is armed — or never, for a run whose
// completed end is its commit (see Dispatcher.admitUnstored).
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
	// arming, set by tests, is told when a held alarm's delay has passed,
	// before arm waits for the run's lock.
	arming func(runID string)
}

// heldAlarm is one new run's alarm, not yet armed.
type heldAlarm struct {
	st    *run.State // tenant, run id and trace, for rendering
	alarm run.Effect
	done  chan error // settles the run's request
	timer *time.Timer
	// admitted is the encoded state of a run admitted unstored (nil: its
	// admission stored it): created before the alarm is armed.
	admitted []byte
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
	return a.holdAdmitted(ctx, st, effects, nil)
}

// holdAdmitted is hold for a run whose admission stored no state:
// admitted, its encoded state, is created when the alarm is armed, and
// read by the run's owner meanwhile (admitted) should its cached copy be
// gone. A run that cannot be held so (nil channel) must be stored.
func (a *deferredAlarms) holdAdmitted(ctx context.Context, st *run.State, effects []run.Effect, admitted []byte) ([]run.Effect, chan error) {
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
	h := &heldAlarm{st: &run.State{RunID: st.RunID, Tenant: st.Tenant, Trace: st.Trace}, alarm: run.Deferred(alarm), done: make(chan error, 1), admitted: admitted}
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
//
// It holds the run's lock while it does, as transitions do: the admission
// that held the alarm may still be handing the run's work out (a publish
// waits up to bus.PublishTimeout for the server, ten times the default
// delay, when a stream is electing a leader). A state created from
// admitted meanwhile holds no outbox, so had that publish then failed, the
// run would have been stored as waiting for work never published, and its
// request, delivered again, would find it stored and publish nothing: the
// run waited for its decision timeout (seen when a cluster node was killed
// as a run was admitted). Behind the lock, an admission that failed has
// taken its alarm back before arm looks for it.
func (a *deferredAlarms) arm(ctx context.Context, runID string, h *heldAlarm) {
	if a.arming != nil {
		a.arming(runID)
	}
	unlock := a.d.locks.Lock(runID)
	defer unlock()
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
	if h.admitted != nil {
		// The run outlived the delay unstored: its state is created
		// first, as admitted (a transition that wrote it since, from its
		// cached copy, got there first: ErrKeyExists, and what it wrote
		// stands).
		cctx, cancel := bus.Bounded(ctx)
		_, err := a.d.runs.Create(cctx, runID, h.admitted)
		cancel()
		if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			h.done <- err
			return
		}
	}
	h.done <- a.d.publish(ctx, h.st, []run.Effect{h.alarm})
}

// crashed drops what is held of run runID as a crashed process loses it
// (a test's simulated crash): the run's request is handed back.
func (a *deferredAlarms) crashed(runID string) {
	if h := a.take(runID, nil); h != nil {
		h.done <- errSimulatedCrash
	}
}

// admitted returns the encoded state of run runID as its unstored
// admission held it (nil: none is held).
func (a *deferredAlarms) admitted(runID string) []byte {
	a.mu.Lock()
	defer a.mu.Unlock()
	if h := a.held[runID]; h != nil {
		return h.admitted
	}
	return nil
}

// room reports whether another alarm may be held now.
func (a *deferredAlarms) room() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.delay > 0 && len(a.held) < a.max
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
