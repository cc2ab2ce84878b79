package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/artifacts"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/policy"
	"github.com/actionbus/actionbus/internal/run"
	"github.com/actionbus/actionbus/internal/skills"
	"github.com/actionbus/actionbus/internal/skills/skillstore"
)

// env is the world as the run state machine sees it from the dispatcher:
// the catalog view, the policy in force, the approval keys, the artifact
// store and the clock.
type env struct{ d *Dispatcher }

func (e env) Action(ctx context.Context, name string) (*actions.Entry, error) {
	return e.d.cat.Get(ctx, name)
}

func (e env) Skill(ctx context.Context, name string) (*skills.Skill, error) {
	return skillstore.Get(ctx, e.d.catKV, name)
}

func (e env) Skills(ctx context.Context) ([]skills.Skill, error) {
	return skillstore.List(ctx, e.d.catKV)
}

func (e env) Checker(entry *actions.Entry) (*actions.ArgsChecker, error) {
	return e.d.checkers.get(entry.Definition, entry.Hash)
}

func (e env) Evaluate(ctx context.Context, r policy.Request) policy.Snapshot {
	return e.d.policy.Load().Evaluate(ctx, r)
}

func (e env) VerifyApproval(token string, c policy.ApprovalContext, claimed string, now time.Time) (string, error) {
	return e.d.cfg.ApprovalKeys.Verify(token, c, claimed, now)
}

func (e env) VerifyDenial(token, approvalID, reason, claimed string) (string, error) {
	return e.d.cfg.ApprovalKeys.VerifyDenial(token, approvalID, reason, claimed)
}

func (e env) VerifyPrincipal(token string, c policy.PrincipalClaim, now time.Time) (policy.Principal, error) {
	return e.d.cfg.ApprovalKeys.VerifyPrincipal(token, c, now)
}

// PutArtifact stores an artifact a transition asks for (a large step
// output, a workspace document) in the services' store, recorded as its
// run's (frozenEnv stores nothing: its writer did).
func (e env) PutArtifact(ctx context.Context, a *run.ArtifactWrite) error {
	cctx, cancel := bus.Bounded(ctx)
	defer cancel()
	_, err := artifacts.Put(cctx, e.d.artifacts, artifacts.Owner{Tenant: a.Tenant, RunID: a.RunID}, a.Ref.ID, a.Ref.Role, a.Ref.MediaType, a.Data, 0)
	return err
}

func (e env) GetArtifact(ctx context.Context, tenant string, ref events.ArtifactRef) ([]byte, error) {
	cctx, cancel := bus.Bounded(ctx)
	defer cancel()
	a, err := artifacts.Read(cctx, e.d.js, e.d.topo, tenant, ref)
	if err != nil {
		return nil, err
	}
	return a.Data, nil
}

func (e env) PriorRun(ctx context.Context, tenant, runID string) (*run.State, error) {
	return e.d.priorRun(ctx, tenant, runID, true)
}

// priorRun is run.Env.PriorRun; with release, the releases of slots a
// rebuild of the run's end implies are carried out (see endedState).
func (d *Dispatcher) priorRun(ctx context.Context, tenant, runID string, release bool) (*run.State, error) {
	// Another tenant's run is none, told at once (loadTenantRun):
	// waiting for its end first would tell it from a missing one by the
	// time taken.
	st, _, err := d.loadTenantRun(ctx, tenant, runID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil || st.IsTerminal() {
		return st, err
	}
	// A run's end is usually its last write (endFirst): the ended state
	// is rebuilt from the state as stored and what the end names.
	ended, err := d.endedState(ctx, tenant, runID, release)
	if errors.Is(err, errNotEnded) {
		return st, nil
	}
	return ended, err
}

// ClaimRetry sets RetriedBy on the stored state of priorID with a
// revision-checked update, read again after a lost race; a state that
// already names a retry is left as it is. A state stored before the run's
// end (the end was the commit) is written ended, as rebuilt from its
// stored end, with nothing left to publish: later readers of the run find
// it ended without rebuilding it. Nothing else of the state changes (its
// UpdatedAt neither, so an outbox it holds is not taken for a fresh one).
func (e env) ClaimRetry(ctx context.Context, priorID, retryID string) (string, error) {
	for attempt := 0; attempt < 20; attempt++ {
		st, entry, err := e.d.loadStored(ctx, priorID)
		if err != nil {
			return "", err
		}
		if st.RetriedBy != "" {
			return st.RetriedBy, nil
		}
		if !st.IsTerminal() {
			if st, err = e.d.rebuildEnded(ctx, st); err != nil {
				return "", err
			}
			st.Outbox = nil
		}
		st.RetriedBy = retryID
		val, err := st.Encode()
		if err != nil {
			return "", bus.Permanent(err)
		}
		uctx, cancel := bus.Bounded(ctx)
		_, err = e.d.runs.Update(uctx, priorID, val, entry.Revision())
		cancel()
		e.d.cache.drop(priorID)
		if bus.IsRevisionConflict(err) {
			continue
		}
		if err != nil {
			return "", err
		}
		return retryID, nil
	}
	return "", fmt.Errorf("dispatch: claim the retry of run %s: too many concurrent updates", priorID)
}

func (env) Now() time.Time { return time.Now() }

// frozenEnv is the dispatcher's world for a reader that applies again
// what a writer applied already (the events a stored end names, a stored
// log): it writes nothing and takes nothing. Its clock stands at a
// stored time (at); a call under a limit is granted its slot's key
// without taking a slot or a rate token (the writer took it); an output
// put to the artifact store is referenced without being stored again
// (the writer stored it under the same derived id before its end was
// published). So a rebuild decides what its writer decided, whenever it
// runs, and costs the limits and the store nothing.
type frozenEnv struct {
	env
	at time.Time
}

func (e *frozenEnv) Now() time.Time { return e.at }

// Acquire grants call c, with the key of its limit when it has one.
func (e *frozenEnv) Acquire(ctx context.Context, st *run.State, c run.CallState) (run.Capacity, error) {
	_, key, err := e.limitKey(ctx, st, c)
	if err != nil {
		return run.Capacity{}, err
	}
	return run.Capacity{Key: key, OK: true}, nil
}

// PutArtifact stores nothing: the transition being applied again stored
// its artifacts when it happened (their ids are derived, so the reference
// the machine computes is the one stored).
func (e *frozenEnv) PutArtifact(context.Context, *run.ArtifactWrite) error { return nil }

// PriorRun is env.PriorRun leaving the releases a rebuild of the prior
// run implies to its owner.
func (e *frozenEnv) PriorRun(ctx context.Context, tenant, runID string) (*run.State, error) {
	return e.d.priorRun(ctx, tenant, runID, false)
}

// ClaimRetry reads the claim a retry's admission wrote.
func (e *frozenEnv) ClaimRetry(ctx context.Context, priorID, retryID string) (string, error) {
	prior, _, err := e.d.loadStored(ctx, priorID)
	if err != nil {
		return "", err
	}
	if prior.RetriedBy == "" {
		return retryID, nil
	}
	return prior.RetriedBy, nil
}
