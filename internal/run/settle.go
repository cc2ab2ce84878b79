package run

import (
	"context"
	"fmt"
	"slices"
)

// Shell is what a transition asks the shell to do before anything of the
// transition is stored or published: store an artifact the new state
// references ([EffectArtifact]) and ask a limit for a call's slot
// ([EffectAcquire]). The dispatcher implements it over JetStream; a
// rebuild of a transition that happened already implements it storing
// nothing and granting without a slot.
type Shell interface {
	// PutArtifact stores a's bytes under its reference's id, recorded as
	// its run's; storing again is harmless (ids are derived).
	PutArtifact(ctx context.Context, a *ArtifactWrite) error
	// Acquire asks the limit of call c's action (its concurrency key and
	// rate) for a slot; an action without a limit is always granted, with
	// no key. Asking again for a call that holds its slot is harmless.
	Acquire(ctx context.Context, st *State, c CallState) (Capacity, error)
}

// Settle carries out, through sh and in order, what out (the effects of
// one transition of st) asks of the shell, and returns the effects left
// to store and publish, in order. Each capacity answer is applied to st
// at once ([CapacityAnswer]) and what it implies takes the place of the
// request. The machine decides; Settle is the one loop every shell runs
// (the dispatcher, its rebuilds and replays, the tests), kept here so
// that none of them answers differently. An error (an artifact not
// stored) means the transition is to be applied again from the state as
// it was.
func (m *Machine) Settle(ctx context.Context, sh Shell, st *State, out []Effect) ([]Effect, error) {
	out = slices.Clone(out) // answers are inserted: the caller's slice stays as it is
	rest := out[:0:0]
	for i := 0; i < len(out); i++ {
		e := out[i]
		switch e.Kind {
		case EffectArtifact:
			if err := sh.PutArtifact(ctx, e.Artifact); err != nil {
				return nil, fmt.Errorf("run: store artifact %s of %d bytes: %w", e.Artifact.Ref.ID, len(e.Artifact.Data), err)
			}
		case EffectAcquire:
			ask := *e.Ask
			var capacity Capacity
			// A call the rest of the transition moved on (the run ended)
			// takes no slot: only a call that still waits is asked for.
			if c := st.asked(ask); c != nil {
				var err error
				if capacity, err = sh.Acquire(ctx, st, *c); err != nil {
					capacity = Capacity{Err: err.Error()}
				}
			}
			more := m.onCapacityAnswer(st, &CapacityAnswer{Ask: ask, Capacity: capacity})
			out = slices.Insert(out, i+1, more...)
		default:
			rest = append(rest, e)
		}
	}
	return rest, nil
}
