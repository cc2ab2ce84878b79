package executor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/record"
)

// Idempotency keys (see docs/architecture.md, "Idempotent effects"):
//
//   - Before a call with a key runs, the executor reserves the key in the
//     idempotency bucket with a create-if-absent write. Keys are stored
//     as their SHA-256, never raw.
//   - A key whose result is stored replays that result: the handler does
//     not run again (result.replayed is true).
//   - A key reserved by a call still within its timeout (running on
//     another executor, or this very delivery's duplicate) is waited for
//     in the slot (the message kept in progress, so the wait spends no
//     delivery), then replayed or taken over; after the call's timeout
//     and heldKeyPatience the message is handed back with a delay.
//   - A reservation is a lease: while its handler runs (even past its
//     deadline, when it ignores its context) the holder renews it every
//     heartbeat. A reservation not renewed for three heartbeats was left
//     by a crashed executor: this executor takes it over and runs the
//     handler again, with the same key, so that a domain store can make
//     the effect itself idempotent. Without that, the effect may happen
//     twice: the runtime can replay results, not undo effects.
//   - A failed call releases its key, so a retry runs again.
//   - A key is scoped to the pool and tenant, and to the call that first
//     used it: its entry records the action, the tenant, the user and the
//     input hash, and the same key used with another action, user or
//     input is refused with
//     idempotency_key_conflict. It never returns another call's output.

// idemEntry is what the bucket holds under a key.
type idemEntry struct {
	State      string    `json:"state"` // reserved | done
	CallID     string    `json:"callId"`
	Executor   string    `json:"executor"`
	ReservedAt time.Time `json:"reservedAt"`
	TimeoutMs  int64     `json:"timeoutMs"`
	Action     string    `json:"action"`
	Tenant     string    `json:"tenant,omitempty"`
	UserID     string    `json:"userId,omitempty"`
	InputHash  string    `json:"inputHash"`
	Output     any       `json:"output,omitempty"`
	Summary    string    `json:"summary,omitempty"`
	Complete   bool      `json:"complete,omitempty"`
}

// decodeIdem decodes the idempotency record stored under key k, refusing
// one that fails schemas/idempotency-record.json (invalid_record: the
// call fails with it, and never replays what such a record holds).
func decodeIdem(k string, val []byte) (idemEntry, error) {
	if err := record.Validate(record.IdempotencyRecord, k, val); err != nil {
		return idemEntry{}, err
	}
	var held idemEntry
	if err := json.Unmarshal(val, &held); err != nil {
		return idemEntry{}, record.Invalid(record.IdempotencyRecord, k, "does not decode: %v", err)
	}
	return held, nil
}

type idemClaim struct {
	key   string
	entry idemEntry

	mu       sync.Mutex
	revision uint64
	// stopLease ends the lease's renewals and waits for the last one.
	stopLease func()
}

// leaseTTL is how long a reservation lives without renewal.
func (e *Executor) leaseTTL() time.Duration { return 3 * e.heartbeatInterval() }

// lease renews c's reservation every heartbeat until c.stop is called, so
// that no other executor takes over a key whose handler is still running.
func (e *Executor) lease(c *idemClaim) {
	done := make(chan struct{})
	stopped := make(chan struct{})
	var once sync.Once
	c.stopLease = func() {
		once.Do(func() { close(done) })
		<-stopped
	}
	go func() {
		defer close(stopped)
		t := time.NewTicker(e.heartbeatInterval())
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			renewed := c.entry
			renewed.ReservedAt = time.Now().UTC()
			val, _ := json.Marshal(renewed)
			ctx, cancel := bus.Bounded(context.Background())
			c.mu.Lock()
			rev, err := e.idem.Update(ctx, c.key, val, c.revision)
			if err == nil {
				c.revision = rev
			}
			c.mu.Unlock()
			cancel()
			if err != nil {
				e.log.Warn("idempotency lease not renewed", "call_id", c.entry.CallID, "err", err)
			}
		}
	}()
}

// stop ends the claim's lease; its revision is final afterwards.
func (c *idemClaim) stop() uint64 {
	if c.stopLease != nil {
		c.stopLease()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.revision
}

// idemKey is the bucket key of an idempotency key of a tenant on a pool:
// "<pool>.<tenant>.<sha256>". The pool prefix lets NATS permissions
// confine an executor user's writes to its own pool's records, so no pool
// can plant a "done" record (and a forged output) for another pool's
// calls; the tenant keeps tenants' keys apart, so that one tenant's key
// neither replays nor blocks (nor reveals) another's.
func idemKey(pool, tenant, key string) string {
	sum := sha256.Sum256([]byte(key))
	return pool + "." + events.TenantOr(tenant) + "." + hex.EncodeToString(sum[:])
}

// reserve claims key for req. It returns the claim, or the stored result
// to replay, or how long to wait before retrying.
func (e *Executor) reserve(ctx context.Context, key string, req *events.ActionRequested, inputHash string, timeout time.Duration) (*idemClaim, *idemEntry, time.Duration, error) {
	k := idemKey(e.cfg.Pool, req.Tenant, key)
	entry := idemEntry{State: "reserved", CallID: req.CallID, Executor: e.cfg.ID, ReservedAt: time.Now().UTC(), TimeoutMs: timeout.Milliseconds(),
		Action: req.Action, Tenant: events.TenantOr(req.Tenant), UserID: req.UserID, InputHash: inputHash}
	val, _ := json.Marshal(entry)
	for attempt := 0; attempt < 5; attempt++ {
		cctx, cancel := bus.Bounded(ctx)
		rev, err := e.idem.Create(cctx, k, val)
		cancel()
		if err == nil {
			return e.claimed(k, rev, entry), nil, 0, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, nil, 0, err
		}
		cur, err := e.idem.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // released meanwhile
		}
		if err != nil {
			return nil, nil, 0, err
		}
		held, err := decodeIdem(k, cur.Value())
		if err != nil {
			return nil, nil, 0, err
		}
		if err := sameCall(held, entry); err != nil {
			return nil, nil, 0, err
		}
		if held.State == "done" {
			return nil, &held, 0, nil
		}
		// The holder renews its lease every heartbeat while its handler
		// runs; only a lease not renewed for leaseTTL is abandoned, and
		// never one this process holds (its holder is alive: a lease
		// that could not be renewed is a bucket out of reach).
		staleAt := held.ReservedAt.Add(e.leaseTTL())
		if wait := time.Until(staleAt); wait > 0 {
			return nil, nil, wait, nil
		}
		if _, mine := e.claims.Load(k); mine {
			return nil, nil, e.heartbeatInterval(), nil
		}
		e.log.Warn("taking over an abandoned idempotency reservation; the handler runs again with the same key",
			"call_id", req.CallID, "previous_executor", held.Executor)
		uctx, cancel := bus.Bounded(ctx)
		rev, err = e.idem.Update(uctx, k, val, cur.Revision())
		cancel()
		if err == nil {
			return e.claimed(k, rev, entry), nil, 0, nil
		}
	}
	return nil, nil, 0, errors.New("executor: idempotency key contended")
}

// reserveWaiting is reserve that, while another call holds the key (a
// duplicate of this call: the same key), waits for it in the slot —
// telling JetStream the message is in progress — instead of handing the
// message back: a redelivery would spend the delivery budget that
// detects crashing handlers. It gives up, returning the wait, after the
// call's timeout and heldKeyPatience have passed (by then the dispatcher
// has failed the call's run with stage_stalled, unless it was configured
// with a longer action grace).
func (e *Executor) reserveWaiting(ctx context.Context, msg jetstream.Msg, key string, req *events.ActionRequested, inputHash string, timeout time.Duration) (*idemClaim, *idemEntry, time.Duration, error) {
	giveUp := time.Now().Add(timeout + heldKeyPatience)
	for {
		c, stored, wait, err := e.reserve(ctx, key, req, inputHash, timeout)
		if err != nil || wait <= 0 || time.Now().Add(wait).After(giveUp) {
			return c, stored, wait, err
		}
		_ = msg.InProgress()
		t := time.NewTimer(min(wait, e.heartbeatInterval()))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, nil, wait, nil
		case <-t.C:
		}
	}
}

// heldKeyPatience is how long past its own timeout a call waits in its
// slot for another call holding its idempotency key: the dispatcher's
// default action grace.
const heldKeyPatience = 30 * time.Second

// claimed returns a claim on key k at revision rev, its lease running.
func (e *Executor) claimed(k string, rev uint64, entry idemEntry) *idemClaim {
	c := &idemClaim{key: k, revision: rev, entry: entry}
	e.claims.Store(k, struct{}{})
	e.lease(c)
	return c
}

// sameCall refuses a key held for another action, user or input. The
// error names what differs, never the held call's input or output.
func sameCall(held, want idemEntry) error {
	var differs []string
	if held.Action != want.Action {
		differs = append(differs, "action")
	}
	if held.UserID != want.UserID {
		differs = append(differs, "user")
	}
	if held.Tenant != want.Tenant {
		differs = append(differs, "tenant")
	}
	if held.InputHash != want.InputHash {
		differs = append(differs, "input")
	}
	if len(differs) == 0 {
		return nil
	}
	return (&actionbus.Error{Code: actionbus.CodeIdempotencyConflict,
		Message: "the idempotency key was first used by another call (different " + strings.Join(differs, ", ") + "); use a new key"}).
		WithDetail("differs", differs)
}

// complete stores the result under the claimed key. It keeps trying
// while the bucket does not answer (a leaf node's link cut, a stream
// electing a leader), for as long as the executor runs: a result not
// stored leaves a reservation that is taken over, running the handler
// again, once this process no longer holds it. The slot waits meanwhile
// (no new work could be pulled through a cut link anyway), and a
// redelivery of the call waits for it (the claim stays this process's).
// It gives up at once when the reservation was taken over.
func (e *Executor) complete(ctx context.Context, c *idemClaim, res actions.Result) error {
	defer e.claims.Delete(c.key)
	done := c.entry
	done.State, done.Output, done.Summary, done.Complete = "done", res.Output, res.Summary, res.Complete
	val, err := json.Marshal(done)
	if err != nil {
		return err
	}
	rev := c.stop()
	return patiently(ctx, 0, func() error {
		uctx, cancel := bus.Bounded(context.WithoutCancel(ctx))
		defer cancel()
		_, err := e.idem.Update(uctx, c.key, val, rev)
		if bus.IsRevisionConflict(err) {
			return backoff.Permanent(err) // taken over: the revision moved
		}
		return err
	}, func(err error) {
		e.log.Debug("idempotency result not stored yet; retrying", "call_id", c.entry.CallID, "err", err)
	})
}

// release gives the key up so a retry can run.
func (e *Executor) release(c *idemClaim) {
	defer e.claims.Delete(c.key)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rev := c.stop()
	dctx, cancel := bus.Bounded(ctx)
	defer cancel()
	if err := e.idem.Delete(dctx, c.key, jetstream.LastRevision(rev)); err != nil {
		e.log.Warn("idempotency key not released", "err", err)
	}
}
