// Package limits holds concurrency keys and rate limits of actions: what
// a limit is (a key expression, a maximum of calls in flight per key, a
// rate with a burst), the pure bookkeeping of one key (holders, a token
// bucket, a fair queue of waiters), and a store that keeps that
// bookkeeping in a JetStream key-value bucket, so that every dispatcher
// process enforces the same limit.
package limits

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"sort"
	"time"

	"github.com/actionbus/actionbus/catalog"
)

// Spec is the limit of one action, and Rate its rate; Call is what a key
// expression reads. They are defined in the public package catalog (as
// catalog.Limits, catalog.Rate and catalog.LimitCall), whose
// documentation shows the fields.
type (
	Spec = catalog.Limits
	Rate = catalog.Rate
	Call = catalog.LimitCall
)

// BucketKey is the key-value key of a rendered key: the bucket's key rules
// allow few characters, so it is a hash.
func BucketKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "k." + hex.EncodeToString(sum[:16])
}

// State is the bookkeeping of one key, stored as one key-value entry.
type State struct {
	// Key is the rendered key (for operators).
	Key string `json:"key"`
	// Holders are the calls holding a slot, with when their lease ends
	// (a call whose dispatcher vanished frees its slot then).
	Holders map[string]time.Time `json:"holders,omitempty"`
	// Tokens and RefilledAt are the token bucket's.
	Tokens     float64   `json:"tokens"`
	RefilledAt time.Time `json:"refilledAt"`
	// Waiting is the queue of calls waiting for capacity, first come
	// first served; an entry lapses unless its call asks again.
	Waiting []Waiter `json:"waiting,omitempty"`
}

// Waiter is a call waiting for capacity.
type Waiter struct {
	CallID string    `json:"callId"`
	RunID  string    `json:"runId"`
	Tenant string    `json:"tenant"`
	Until  time.Time `json:"until"`
}

// Request asks for a slot for one call.
type Request struct {
	CallID, RunID, Tenant string
	// Lease is how long the slot is held unless released: the call's
	// timeout with some grace.
	Lease time.Duration
}

// Grant is the answer to a [Request].
type Grant struct {
	// OK: the call holds a slot and may start.
	OK bool
	// RetryAt is when asking again may succeed (not OK).
	RetryAt time.Time
	// Position is the call's place in the key's queue (0 first).
	Position int
	// Waiting is how many calls wait on the key.
	Waiting int
}

// PollInterval is how often a call waiting for a slot of a concurrency
// limit asks again (a released slot also wakes the first waiters).
const PollInterval = 500 * time.Millisecond

// waiterGrace is how long a waiter's place is kept after it last asked.
const waiterGrace = 5 * time.Second

// Acquire decides a request on s at now, changing s: a call that already
// holds a slot keeps it (asking twice is harmless); otherwise the call
// gets a slot when one is free, a token is available, and no earlier
// waiter is owed it (first come, first served within a key). A call that
// does not get one takes (or keeps) its place in the queue.
func Acquire(s *State, spec Spec, req Request, now time.Time) Grant {
	prune(s, now)
	refill(s, spec, now)
	if _, held := s.Holders[req.CallID]; held {
		s.Holders[req.CallID] = now.Add(req.Lease)
		s.removeWaiter(req.CallID)
		return Grant{OK: true}
	}
	pos := s.waiterIndex(req.CallID)
	if pos < 0 {
		pos = len(s.Waiting)
	}
	free := math.MaxInt
	if spec.MaxInFlight > 0 {
		free = spec.MaxInFlight - len(s.Holders)
	}
	if spec.Rate != nil {
		free = min(free, int(math.Floor(s.Tokens+1e-9)))
	}
	if pos < free {
		if s.Holders == nil {
			s.Holders = map[string]time.Time{}
		}
		s.Holders[req.CallID] = now.Add(req.Lease)
		if spec.Rate != nil {
			s.Tokens--
		}
		s.removeWaiter(req.CallID)
		return Grant{OK: true, Waiting: len(s.Waiting)}
	}
	// The place is kept until a while after the call is told to ask
	// again, however far off that is.
	at := retryAt(s, spec, pos, now)
	w := Waiter{CallID: req.CallID, RunID: req.RunID, Tenant: req.Tenant, Until: at.Add(waiterGrace)}
	if i := s.waiterIndex(req.CallID); i >= 0 {
		s.Waiting[i].Until = w.Until
	} else {
		s.Waiting = append(s.Waiting, w)
	}
	return Grant{RetryAt: at, Position: pos, Waiting: len(s.Waiting)}
}

// Release frees the slot of callID (and its place in the queue). It
// reports whether anything changed.
func Release(s *State, callID string) bool {
	_, held := s.Holders[callID]
	delete(s.Holders, callID)
	return s.removeWaiter(callID) || held
}

// Next returns the first waiters, up to n, that a freed slot should wake.
func Next(s *State, n int) []Waiter {
	if n > len(s.Waiting) {
		n = len(s.Waiting)
	}
	return append([]Waiter(nil), s.Waiting[:n]...)
}

// retryAt is when the waiter at pos may next get a slot: when the tokens
// it waits for have accrued (a rate), or after a poll interval (a
// concurrency bound, whose slots free when calls end).
func retryAt(s *State, spec Spec, pos int, now time.Time) time.Time {
	at := now.Add(PollInterval)
	if r := spec.Rate; r != nil {
		need := float64(pos+1) - s.Tokens
		if need > 0 {
			perToken := time.Duration(float64(r.PerMs) / float64(r.Limit) * float64(time.Millisecond))
			wait := time.Duration(need * float64(perToken))
			if spec.MaxInFlight <= 0 || len(s.Holders) < spec.MaxInFlight {
				at = now.Add(wait)
			} else if t := now.Add(wait); t.After(at) {
				at = t
			}
		}
	}
	return at
}

// refill adds the tokens accrued since the last refill, up to the burst.
func refill(s *State, spec Spec, now time.Time) {
	r := spec.Rate
	if r == nil {
		return
	}
	burst := float64(max(r.Burst, 1))
	if s.RefilledAt.IsZero() {
		s.Tokens, s.RefilledAt = burst, now
		return
	}
	if elapsed := now.Sub(s.RefilledAt); elapsed > 0 {
		s.Tokens = math.Min(burst, s.Tokens+float64(elapsed)/float64(time.Duration(r.PerMs)*time.Millisecond)*float64(r.Limit))
		s.RefilledAt = now
	}
}

// prune drops holders whose lease ended and waiters that stopped asking.
func prune(s *State, now time.Time) {
	for id, until := range s.Holders {
		if !until.After(now) {
			delete(s.Holders, id)
		}
	}
	kept := s.Waiting[:0]
	for _, w := range s.Waiting {
		if w.Until.After(now) {
			kept = append(kept, w)
		}
	}
	s.Waiting = kept
}

func (s *State) waiterIndex(callID string) int {
	for i, w := range s.Waiting {
		if w.CallID == callID {
			return i
		}
	}
	return -1
}

func (s *State) removeWaiter(callID string) bool {
	i := s.waiterIndex(callID)
	if i < 0 {
		return false
	}
	s.Waiting = append(s.Waiting[:i], s.Waiting[i+1:]...)
	return true
}

// Holding returns the calls holding slots, sorted (for tests and
// operators).
func (s *State) Holding() []string {
	out := make([]string, 0, len(s.Holders))
	for id := range s.Holders {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}
