package dispatch

import (
	"context"
	"errors"
	"fmt"

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

// storedRequest reads the request of tenant's run runID from the requests
// stream, decoded as the dispatcher consumes it, with where and when it
// was stored; nil when none is stored (or none the dispatcher would take).
func (d *Dispatcher) storedRequest(ctx context.Context, tenant, runID string) (*logged, error) {
	gctx, cancel := bus.Bounded(ctx)
	defer cancel()
	msgs, err := jetstreamext.GetLastMsgsFor(gctx, d.js, d.topo.StreamRequests(), d.bus.Subjects().StoredForms(events.TenantOr(tenant), runID, "requested"))
	if err != nil {
		return nil, fmt.Errorf("dispatch: run %s: reading its request: %w", runID, err)
	}
	for m, err := range msgs {
		if errors.Is(err, jetstreamext.ErrNoMessages) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("dispatch: run %s: reading its request: %w", runID, err)
		}
		rec, err := d.bus.Receive(m.Subject, m.Header, m.Data)
		if err != nil {
			continue
		}
		if _, ok := rec.Data.(*events.RunRequested); ok && rec.RunID() == runID {
			return &logged{rec: rec, typ: rec.Event.Type(), at: m.Time, pos: d.topo.StreamRequests() + ":" + fmt.Sprint(m.Sequence)}, nil
		}
	}
	return nil, nil
}

// admittedFromRequest is the state tenant's run runID was admitted with,
// rebuilt from its stored request (jetstream.ErrKeyNotFound when none is
// stored), at revision 0: what an admission stores, without an outbox.
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
	world := &frozenEnv{env: env{d}, at: req.at}
	m := run.New(world, d.machineConfig())
	st, effects, err := m.Start(ctx, &data, d.idKey(data.Tenant, runID))
	if err == nil {
		effects, err = m.Settle(ctx, world, st, effects)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("dispatch: run %s: admitting it again from its request: %w", runID, err)
	}
	if st.Trace = tracing.RunOfEvent(req.rec.Event); st.Trace == nil {
		st.Trace = tracing.RunOf(ctx)
	}
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
	for _, err := range msgs {
		if errors.Is(err, jetstreamext.ErrNoMessages) {
			return false, nil
		}
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
	var pending []string
	for subject := range info.State.Subjects {
		if _, runID := subjects.RunFromSubject(subject); runID != "" && !listed(runID) {
			pending = append(pending, subject)
		}
	}
	var out []run.State
	const perRead = 256 // subjects per batch direct get
	for len(pending) > 0 {
		n := min(perRead, len(pending))
		batch := pending[:n]
		pending = pending[n:]
		gctx, cancel := bus.Bounded(ctx)
		msgs, err := jetstreamext.GetLastMsgsFor(gctx, js, topo.StreamRequests(), batch)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("dispatch: reading requests: %w", err)
		}
		for m, err := range msgs {
			if errors.Is(err, jetstreamext.ErrNoMessages) {
				break
			}
			if err != nil {
				cancel()
				return nil, fmt.Errorf("dispatch: reading requests: %w", err)
			}
			if st, ok := requestedState(subjects, secret, m); ok {
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

// requestedState is the summary state of the run whose stored request is
// m: running, of the kind, user and tenant it names, created when it was
// stored. false when m is no request a dispatcher would take.
func requestedState(subjects events.Subjects, secret *idSecret, m *jetstream.RawStreamMsg) (*run.State, bool) {
	subject := subjects.Canonical(m.Subject)
	e, err := bus.Decode(subject, m.Header, m.Data)
	if err != nil || e.Type() != events.TypeRunRequested {
		return nil, false
	}
	var req events.RunRequested
	if err := events.DataAs(e, &req); err != nil {
		return nil, false
	}
	tenant, runID := subjects.RunFromSubject(subject)
	if runID == "" || req.RunID != runID {
		return nil, false
	}
	idKey := ""
	if secret != nil {
		idKey = secret.key(tenant, runID)
	}
	st := &run.State{RunID: runID, Tenant: events.TenantOr(tenant), IDKey: idKey, Status: run.StatusRunning,
		Kind: run.KindAgent, UserID: req.UserID, CreatedAt: m.Time.UTC(), UpdatedAt: m.Time.UTC()}
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
	return st, true
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
