// Package limitstore keeps the state of [limits] in a JetStream key-value
// bucket shared by every dispatcher process. Package limits decides (it
// links no NATS); this package stores what it decided.
package limitstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/limits"
)

// Store keeps the state of every key in a JetStream key-value bucket, one
// entry per key, changed only by revision-checked writes: any number of
// dispatcher processes share one limit.
type Store struct {
	kv  jetstream.KeyValue
	now func() time.Time
}

// New returns a store over kv (the topology's limits bucket).
func New(kv jetstream.KeyValue) *Store {
	return &Store{kv: kv, now: time.Now}
}

// maxAttempts bounds the revision-conflict retries of one change.
const maxAttempts = 50

// Acquire asks for a slot of key under spec for req (see [limits.Acquire]).
func (s *Store) Acquire(ctx context.Context, key string, spec limits.Spec, req limits.Request) (limits.Grant, error) {
	var g limits.Grant
	err := s.update(ctx, key, func(st *limits.State) bool {
		g = limits.Acquire(st, spec, req, s.now())
		return true
	})
	return g, err
}

// Release frees callID's slot of key and returns the first waiters a free
// slot may now serve (up to n), to wake.
func (s *Store) Release(ctx context.Context, key, callID string, n int) ([]limits.Waiter, error) {
	var next []limits.Waiter
	err := s.update(ctx, key, func(st *limits.State) bool {
		changed := limits.Release(st, callID)
		next = limits.Next(st, n)
		return changed
	})
	return next, err
}

// Get returns the state of key (zero when none).
func (s *Store) Get(ctx context.Context, key string) (limits.State, error) {
	st, _, err := s.load(ctx, limits.BucketKey(key))
	return st, err
}

func (s *Store) load(ctx context.Context, k string) (limits.State, uint64, error) {
	var st limits.State
	e, err := s.kv.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return st, 0, nil
	}
	if err != nil {
		return st, 0, err
	}
	if err := json.Unmarshal(e.Value(), &st); err != nil {
		// A corrupt entry must not hold a key for ever: start afresh.
		return limits.State{}, e.Revision(), nil
	}
	return st, e.Revision(), nil
}

// update applies fn to the stored state of key under a revision check,
// retrying on conflicts; fn reports whether it changed anything.
func (s *Store) update(ctx context.Context, key string, fn func(*limits.State) bool) error {
	k := limits.BucketKey(key)
	for attempt := 0; attempt < maxAttempts; attempt++ {
		st, rev, err := s.load(ctx, k)
		if err != nil {
			return fmt.Errorf("limits: read %s: %w", key, err)
		}
		st.Key = key
		if !fn(&st) {
			return nil
		}
		val, err := json.Marshal(&st)
		if err != nil {
			return err
		}
		err = bus.PutRevision(ctx, s.kv, k, val, rev)
		if err == nil {
			return nil
		}
		if !bus.IsRevisionConflict(err) {
			return fmt.Errorf("limits: write %s: %w", key, err)
		}
	}
	return fmt.Errorf("limits: %s: too many concurrent changes", key)
}
