package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/run"
	"github.com/actionbus/actionbus/internal/tracing"
)

// A run admitted unstored (admitUnstored) that completes with its end as
// its commit is never in the runs bucket: its request and its end are
// all that is stored of it, and what the bucket would hold — the state as
// admitted — is rebuilt from its request, in the world frozen at the
// request's stored time, as a replay admits it (ReplayLog). Readers then
// end it as they end any state stored before its end (endedState).

// firstRequest returns the first message of tenant's run runID in the
// requests stream, in any stored form, that take accepts (nil: none): the
// request the run was admitted from. A client may store its run's request
// again under another id, or junk on its subject; readers rebuild the run
// from the one that admitted it, as a replay does.
func firstRequest(ctx context.Context, js jetstream.JetStream, topo bus.Topology, tenant, runID string, take func(*jetstream.RawStreamMsg) bool) (*jetstream.RawStreamMsg, error) {
	const page, maxRead = 16, 256
	var first *jetstream.RawStreamMsg
	for _, form := range topo.Subjects().StoredForms(events.TenantOr(tenant), runID, "requested") {
		for seq, read := uint64(1), 0; read < maxRead; {
			gctx, cancel := bus.Bounded(ctx)
			it, err := jetstreamext.GetBatch(gctx, js, topo.StreamRequests(), page, jetstreamext.GetBatchSubject(form), jetstreamext.GetBatchSeq(seq))
			if err != nil {
				cancel()
				return nil, fmt.Errorf("dispatch: run %s: reading its request: %w", runID, err)
			}
			n, found := 0, false
			for m, err := range bus.AsStored(it) {
				if err != nil {
					cancel()
					return nil, fmt.Errorf("dispatch: run %s: reading its request: %w", runID, err)
				}
				n++
				seq = m.Sequence + 1
				if take(m) {
					if first == nil || m.Sequence < first.Sequence {
						first = m
					}
					found = true
					break
				}
			}
			cancel()
			read += n
			if found || n < page {
				break
			}
		}
	}
	return first, nil
}

// storedRequest reads the request tenant's run runID was admitted from
// (firstRequest), decoded as the dispatcher consumes it, with where and
// when it was stored; nil when none is stored (or none the dispatcher
// would take).
func (d *Dispatcher) storedRequest(ctx context.Context, tenant, runID string) (*logged, error) {
	decoded := map[uint64]*events.Received{} // by stored sequence
	m, err := firstRequest(ctx, d.js, d.topo, tenant, runID, func(m *jetstream.RawStreamMsg) bool {
		r, err := d.bus.Receive(m.Subject, m.Header, m.Data)
		if err != nil {
			return false
		}
		if _, ok := r.Data.(*events.RunRequested); !ok || r.RunID() != runID {
			return false
		}
		decoded[m.Sequence] = r
		return true
	})
	if err != nil || m == nil {
		return nil, err
	}
	rec := decoded[m.Sequence]
	return &logged{rec: rec, typ: rec.Event.Type(), at: m.Time, pos: position(d.topo.StreamRequests(), m.Sequence)}, nil
}

// admittedFromRequest is the state tenant's run runID was admitted with,
// rebuilt from its stored request (jetstream.ErrKeyNotFound when none is
// stored), at revision 0: what an admission stores, without an outbox.
// The world is frozen at the request's stored time, as far as it can be
// (the clock, limits, artifacts); should today's catalog, policy or keys
// refuse what was admitted then (a run admitted unstored was not refused:
// a refused run is stored at once), the run is told from its request
// alone (requestedState) and ends as its stored end says.
func (d *Dispatcher) admittedFromRequest(ctx context.Context, tenant, runID string) (*run.State, jetstream.KeyValueEntry, error) {
	req, err := d.storedRequest(ctx, tenant, runID)
	if err != nil {
		return nil, nil, err
	}
	if req == nil {
		return nil, nil, jetstream.ErrKeyNotFound
	}
	data := *req.rec.Data.(*events.RunRequested)
	data.Tenant = req.rec.Tenant
	idKey := d.idKey(data.Tenant, runID)
	world := &frozenEnv{env: env{d}, at: req.at}
	m := run.New(world, d.machineConfig())
	st, effects, err := m.Start(ctx, &data, idKey)
	if err == nil {
		effects, err = m.Settle(ctx, world, st, effects)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("dispatch: run %s: admitting it again from its request: %w", runID, err)
	}
	if st.IsTerminal() {
		st = requestedState(&data, events.TenantOr(data.Tenant), runID, idKey, req.at)
		effects = nil
	}
	st.Trace = tracing.RunOfEvent(req.rec.Event)
	run.ArmAdmitted(st, effects, req.at, d.cfg.ActionGrace)
	st.Outbox = nil
	val, err := st.Encode()
	if err != nil {
		return nil, nil, bus.Permanent(err)
	}
	return st, unstoredEntry{key: runID, val: val, at: req.at}, nil
}

// requestStored reports whether a request of tenant's run runID is stored
// in the requests stream.
func (d *Dispatcher) requestStored(ctx context.Context, tenant, runID string) (bool, error) {
	gctx, cancel := bus.Bounded(ctx)
	defer cancel()
	msgs, err := jetstreamext.GetLastMsgsFor(gctx, d.js, d.topo.StreamRequests(), d.bus.Subjects().StoredForms(tenant, runID, "requested"))
	if err != nil {
		return false, err
	}
	for _, err := range bus.AsStored(msgs) {
		if err != nil {
			return false, err
		}
		return true, nil
	}
	return false, nil
}

// UnstoredRuns returns the runs of topo that have a request stored and no
// state in the runs bucket kv — admitted unstored, completed or still held
// by their dispatcher (admitUnstored) — for readers that list runs (the
// run-state bucket alone misses them). listed reports the run ids listed
// from the bucket already. Each is told from its request (kind, user,
// tenant, when it was stored) and its stored end, which it adopts;
// running otherwise. They are summaries for a listing: no machine admits
// them again.
func UnstoredRuns(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, topo bus.Topology, listed func(runID string) bool) ([]run.State, error) {
	secret, err := readIDSecret(ctx, kv)
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, err
	}
	// No secret: no dispatcher ever ran, so no run has ended (an end
	// cannot have the id of a run that has no key: none is adopted).
	requests, err := js.Stream(ctx, topo.StreamRequests())
	if err != nil {
		return nil, fmt.Errorf("dispatch: the requests stream: %w", err)
	}
	subjects := topo.Subjects()
	info, err := requests.Info(ctx, jetstream.WithSubjectFilter(subjects.StoredAnyRun("requested")))
	if err != nil {
		return nil, fmt.Errorf("dispatch: the requests stream: %w", err)
	}
	var single []string // subjects of one message: their last is their first
	var out []run.State
	for subject, n := range info.State.Subjects {
		tenant, runID := subjects.RunFromSubject(subject)
		if runID == "" || listed(runID) {
			continue
		}
		if n == 1 {
			single = append(single, subject)
			continue
		}
		// Stored again, or junk beside it: the run is told from the first
		// request that admits it.
		var st *run.State
		if _, err := firstRequest(ctx, js, topo, tenant, runID, func(m *jetstream.RawStreamMsg) bool {
			st = requestOf(subjects, secret, m)
			return st != nil
		}); err != nil {
			return nil, err
		}
		if st != nil {
			out = append(out, *st)
		}
	}
	const perRead = 256 // subjects per batch direct get
	for len(single) > 0 {
		n := min(perRead, len(single))
		batch := single[:n]
		single = single[n:]
		gctx, cancel := bus.Bounded(ctx)
		msgs, err := jetstreamext.GetLastMsgsFor(gctx, js, topo.StreamRequests(), batch)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("dispatch: reading requests: %w", err)
		}
		for m, err := range bus.AsStored(msgs) {
			if err != nil {
				cancel()
				return nil, fmt.Errorf("dispatch: reading requests: %w", err)
			}
			if st := requestOf(subjects, secret, m); st != nil {
				out = append(out, *st)
			}
		}
		cancel()
	}
	for i := range out {
		if out[i].IDKey == "" {
			continue
		}
		end, usage, err := ReadEnd(ctx, js, topo, &out[i])
		if err != nil {
			return nil, err
		}
		if end != nil {
			run.Adopt(&out[i], end)
			if usage != nil {
				out[i].Usage = usage
			}
		}
	}
	return out, nil
}

// requestOf is the summary state of the run whose stored request is m
// (requestedState), nil when m is no request a dispatcher would take.
func requestOf(subjects events.Subjects, secret *idSecret, m *jetstream.RawStreamMsg) *run.State {
	subject := subjects.Canonical(m.Subject)
	e, err := bus.Decode(subject, m.Header, m.Data)
	if err != nil || e.Type() != events.TypeRunRequested {
		return nil
	}
	var req events.RunRequested
	if err := events.DataAs(e, &req); err != nil {
		return nil
	}
	tenant, runID := subjects.RunFromSubject(subject)
	if runID == "" || req.RunID != runID {
		return nil
	}
	idKey := ""
	if secret != nil {
		idKey = secret.key(tenant, runID)
	}
	return requestedState(&req, events.TenantOr(tenant), runID, idKey, m.Time)
}

// requestedState is the state of run runID told from its request req
// alone, stored at: running, of the kind, user and tenant it names,
// created then. For listings, and for a run a rebuild cannot admit again
// in today's world: its stored end says how it ended.
func requestedState(req *events.RunRequested, tenant, runID, idKey string, at time.Time) *run.State {
	st := &run.State{RunID: runID, Tenant: tenant, IDKey: idKey, Status: run.StatusRunning,
		Kind: run.KindAgent, UserID: req.UserID, CreatedAt: at.UTC(), UpdatedAt: at.UTC()}
	if req.Principal != nil {
		// Verified at admission, or the run failed and was stored.
		st.UserID = req.Principal.User
	}
	switch {
	case req.Action != nil:
		st.Kind = run.KindExec
	case req.Workflow != nil:
		st.Kind = run.KindWorkflow
	}
	return st
}

// readIDSecret reads the dispatchers' id secret from the runs bucket kv,
// for a reader: it draws none (jetstream.ErrKeyNotFound when there is
// none yet).
func readIDSecret(ctx context.Context, kv jetstream.KeyValue) (*idSecret, error) {
	gctx, cancel := bus.Bounded(ctx)
	entry, err := kv.Get(gctx, IDSecretKey)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("dispatch: read the id secret: %w", err)
	}
	return parseIDSecret(kv, entry.Value())
}
