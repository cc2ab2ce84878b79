package client

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/readapi"
)

// Everything a client reads goes through the read service
// (internal/readapi, served by the dispatchers on
// <prefix>.api.<tenant>.<op>): a tenant holds no JetStream of its own.
// Live events arrive on core subscriptions; stored events are paged from
// the service and deduplicated by event id against the live ones.

// received decodes a stored message of the read service.
func (c *Client) received(m readapi.Msg) (*events.Received, error) {
	return c.bus.Receive(m.Subject, nats.Header(m.Header), m.Data)
}

// refused reports a read the service refused for good (a malformed run
// id, a bad request), as opposed to one that may succeed later.
func refused(err error) bool {
	switch actionbus.CodeOf(err) {
	case actionbus.CodeInvalidRunID, actionbus.CodeInvalidTenant, actionbus.CodeBadRequest:
		return true
	}
	return false
}

// notFound reports a read of a run that has no stored event (yet).
func notFound(err error) bool { return actionbus.CodeOf(err) == actionbus.CodeRunNotFound }

// liveOnly reports an event type published on core NATS only.
func liveOnly(eventType string) bool {
	e, ok := events.Lookup(eventType)
	return ok && e.Live
}

// followed reports whether a live message is one a follower delivers:
// an event of the runs stream (what services publish, the timers'
// excepted) or a live-only one, not a request, cancel, input or approval
// answer of the requests stream, nor a fired timer.
func followed(subject string) bool {
	verb := subject[strings.LastIndexByte(subject, '.')+1:]
	if events.IsServiceVerb(verb) {
		return true
	}
	for _, e := range events.Catalog {
		if e.Live && strings.HasSuffix(e.Subject, "."+verb) {
			return true
		}
	}
	return false
}

// dedup remembers the ids of the events delivered (paged or live), so
// that an event whose live copy and stored copy both arrive is delivered
// once. It forgets the oldest beyond its capacity (default 8192 ids):
// both copies of an event arrive within moments of each other.
type dedup struct {
	capacity int
	ids      map[string]bool
	order    []string
}

// first records id and reports whether it was not delivered before.
func (d *dedup) first(id string) bool {
	if d.ids[id] {
		return false
	}
	if d.ids == nil {
		d.ids = map[string]bool{}
	}
	if len(d.order) >= max(d.capacity, 8192) {
		delete(d.ids, d.order[0])
		d.order = d.order[1:]
	}
	d.ids[id] = true
	d.order = append(d.order, id)
	return true
}

// follow is Follow; with start, the run is started once the live
// subscription is in place, so no live event is missed.
//
// It subscribes to the run's events live first, then pages the run's
// stored events from the read service, in stored order, then delivers the
// live ones as they come (the order the stream stores them), each event
// once (by id). It pages again from time to time, and before it delivers
// the terminal event, in case a live message was lost (the connection
// moving to another server).
func (c *Client) follow(ctx context.Context, runID string, fn func(Event), start func() error) (*Result, error) {
	if fn == nil {
		return c.wait(ctx, runID, start)
	}
	if err := events.CheckRunID(runID); err != nil {
		return nil, fmt.Errorf("client: follow %s: %w", runID, err)
	}
	live := make(chan *nats.Msg, 1024)
	sub, err := c.nc.ChanSubscribe(c.topo.Subjects().Run(c.tenant, runID, "*"), live)
	if err != nil {
		return nil, fmt.Errorf("client: follow %s: %w", runID, err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // best effort
	if start != nil {
		if err := start(); err != nil {
			return nil, err
		}
	}
	var seen dedup
	var after uint64
	// drainLive delivers the live-only events already received (progress
	// published before a terminal event arrives before it).
	drainLive := func() {
		for {
			select {
			case m := <-live:
				if r, err := c.bus.Receive(m.Subject, m.Header, m.Data); err == nil && liveOnly(r.Event.Type()) && followed(m.Subject) {
					for _, e := range eventsOf(r, runID) {
						fn(e)
					}
				}
			default:
				return
			}
		}
	}
	// history pages the stored events after the cursor; within bound,
	// when set (a read service restarting must not hold up what arrives
	// live).
	history := func(bound time.Duration) (*Result, error) {
		hctx := ctx
		if bound > 0 {
			var cancel context.CancelFunc
			hctx, cancel = context.WithTimeout(ctx, bound)
			defer cancel()
		}
		var res *Result
		next, err := c.reads.Scan(hctx, readapi.OpEvents, readapi.Request{Run: runID, After: after}, func(m readapi.Msg) bool {
			r, err := c.received(m)
			if err != nil {
				return true // the dispatcher rejects and reports bad events; followers skip them
			}
			if !seen.first(r.Event.ID()) {
				return true
			}
			res = terminal(r)
			if res != nil {
				drainLive()
			}
			for _, e := range eventsOf(r, runID) {
				fn(e)
			}
			return res == nil
		})
		after = next
		if notFound(err) {
			err = nil
		}
		return res, err
	}
	res, err := history(0)
	switch {
	case res != nil:
		return res, nil
	case err != nil && (refused(err) || ctx.Err() != nil):
		return nil, fmt.Errorf("client: follow %s: %w", runID, err)
	}
	every := time.Second
	recheck := time.NewTimer(every)
	defer recheck.Stop()
	for {
		select {
		case m := <-live:
			if !followed(m.Subject) || (c.dropLive != nil && c.dropLive(m.Subject)) {
				continue
			}
			r, err := c.bus.Receive(m.Subject, m.Header, m.Data)
			if err != nil {
				continue
			}
			if liveOnly(r.Event.Type()) {
				for _, e := range eventsOf(r, runID) {
					fn(e)
				}
				continue
			}
			res := terminal(r)
			if res == nil {
				if seen.first(r.Event.ID()) {
					for _, e := range eventsOf(r, runID) {
						fn(e)
					}
				}
				continue
			}
			// The end: whatever stored event a lost live message missed
			// comes first, from the stream.
			if stored, _ := history(recheckBound); stored != nil {
				return stored, nil
			}
			drainLive()
			if seen.first(r.Event.ID()) {
				for _, e := range eventsOf(r, runID) {
					fn(e)
				}
			}
			return res, nil
		case <-recheck.C:
			// A failed read (a service restarting) is retried next time.
			if res, _ := history(recheckBound); res != nil {
				return res, nil
			}
			every = min(2*every, 10*time.Second)
			recheck.Reset(every)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// recheckBound bounds a follower's reads of the stream after its start.
const recheckBound = 3 * time.Second

// storedResult reads a run's stored terminal event, if any.
func (c *Client) storedResult(ctx context.Context, runID string) (*Result, error) {
	var p readapi.Page
	err := c.reads.Call(ctx, readapi.OpEvents, readapi.Request{Run: runID, Verbs: terminalVerbs, Last: true}, &p)
	if err != nil {
		return nil, err
	}
	for _, m := range p.Msgs {
		if m.Cut() {
			continue // a terminal event over a page: learn it live
		}
		if r, err := c.received(m); err == nil {
			if res := terminal(r); res != nil {
				return res, nil
			}
		}
	}
	return nil, nil
}

// request reads a run's stored run.requested from the requests stream, and
// when it was stored.
func (c *Client) request(ctx context.Context, runID string) (*events.RunRequested, time.Time, error) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var found *readapi.Msg
	_, err := c.reads.Scan(rctx, readapi.OpEvents, readapi.Request{Run: runID, Stream: readapi.StreamRequests, Verbs: []string{"requested"}},
		func(m readapi.Msg) bool { found = &m; return false })
	if err != nil {
		return nil, time.Time{}, err
	}
	if found == nil {
		// No request: a run the tenant never had (another tenant's
		// included), or one whose request aged out of the stream.
		if err := c.CheckRun(ctx, runID); actionbus.CodeOf(err) == actionbus.CodeRunNotFound {
			return nil, time.Time{}, err
		}
		return nil, time.Time{}, errors.New("the run's request is no longer stored")
	}
	r, err := c.received(*found)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("the run's stored request is invalid: %w", err)
	}
	req, ok := r.Data.(*events.RunRequested)
	if !ok {
		return nil, time.Time{}, errors.New("the run's stored request is not a run.requested")
	}
	return req, found.Time, nil
}

// scanApprovals reads the stored events of a run's approval subject, in
// order, until fn returns true or none is left; it reports whether fn did.
func (c *Client) scanApprovals(ctx context.Context, runID string, fn func(*events.Received) bool) (bool, error) {
	done := false
	// The approvals operation: all a tenant's approver user may read.
	_, err := c.reads.Scan(ctx, readapi.OpApprovals, readapi.Request{Run: runID}, func(m readapi.Msg) bool {
		if r, err := c.received(m); err == nil && fn(r) {
			done = true
		}
		return !done
	})
	return done, err
}

// Watch delivers the client's tenant's run events to fn, one at a time:
// every stored event from since (from the first when since is zero), then
// each new one as it is stored, and the live events (run.started,
// run.progress) published while it watches. It returns when ctx ends
// (with nil) or when the runs cannot be read (a refused read). Events that
// do not decode are skipped (the dispatcher rejects and reports them).
// Consoles and dashboards build their view of all runs from it; to follow
// one run, use [Client.Follow]. It holds one subscription and no
// consumer; it reads the stored events again every two seconds in case a
// live message was lost.
func (c *Client) Watch(ctx context.Context, since time.Time, fn func(Event)) error {
	subjects := c.topo.Subjects()
	live := make(chan *nats.Msg, 4096)
	sub, err := c.nc.ChanSubscribe(subjects.Run(c.tenant, "*", "*"), live)
	if err != nil {
		return fmt.Errorf("client: watch: %w", err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // best effort
	// Every event of the last pages' interval is remembered: at most
	// 65 536 (the stream's order is re-read every two seconds).
	seen := dedup{capacity: 1 << 16}
	var after uint64
	first := true
	page := func(bound time.Duration) error {
		pctx := ctx
		if bound > 0 {
			var cancel context.CancelFunc
			pctx, cancel = context.WithTimeout(ctx, bound)
			defer cancel()
		}
		req := readapi.Request{After: after}
		if first && !since.IsZero() {
			req = readapi.Request{Since: &since}
		}
		next, err := c.reads.Scan(pctx, readapi.OpRuns, req, func(m readapi.Msg) bool {
			r, err := c.received(m)
			if err != nil {
				return true // schedules and bad events: nothing to show
			}
			if seen.first(r.Event.ID()) {
				for _, e := range eventsOf(r, subjects.RunIDFromSubject(m.Subject)) {
					fn(e)
				}
			}
			return true
		})
		if next > after {
			first, after = false, next
		}
		return err
	}
	if err := page(0); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		if refused(err) {
			return fmt.Errorf("client: watch: %w", err)
		}
	}
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case m := <-live:
			if !followed(m.Subject) {
				continue
			}
			r, err := c.bus.Receive(m.Subject, m.Header, m.Data)
			if err != nil {
				continue
			}
			if seen.first(r.Event.ID()) {
				for _, e := range eventsOf(r, subjects.RunIDFromSubject(m.Subject)) {
					fn(e)
				}
			}
		case <-tick.C:
			_ = page(recheckBound) // a failed read is retried next time
		case <-ctx.Done():
			return nil
		}
	}
}

// AuditRecords reads the audit records of a run, in stream order. The
// auditor writes them moments after the events: for a run that has
// ended, it reads again (for up to two seconds) until the record of the
// run's terminal event is there, so an ended run's trail is complete.
func (c *Client) AuditRecords(ctx context.Context, runID string) ([]AuditRecord, error) {
	var out []AuditRecord
	var bad error
	var after uint64
	read := func() error {
		next, err := c.reads.Scan(ctx, readapi.OpAudit, readapi.Request{Run: runID, After: after}, func(m readapi.Msg) bool {
			r, err := c.received(m)
			if err != nil {
				bad = fmt.Errorf("client: audit record %s: %w", m.Subject, err)
				return false
			}
			recs, err := events.AuditRecordsOf(r)
			if err != nil {
				bad = fmt.Errorf("client: audit of %s: %w", runID, err)
				return false
			}
			out = append(out, recs...)
			return true
		})
		after = max(after, next)
		if err != nil {
			return fmt.Errorf("client: audit of %s: %w", runID, err)
		}
		return bad
	}
	if err := read(); err != nil {
		return nil, err
	}
	res, err := c.Ended(ctx, runID)
	if err != nil || res == nil {
		return out, nil //nolint:nilerr // a run not ended (or not readable now): what is recorded so far
	}
	recorded := func() bool {
		for i := len(out) - 1; i >= 0; i-- {
			if out[i].EventID == res.EventID {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(auditCatchUp)
	for wait := 20 * time.Millisecond; !recorded() && time.Now().Before(deadline); wait = min(2*wait, 250*time.Millisecond) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		if err := read(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// auditCatchUp bounds how long [Client.AuditRecords] waits for the record
// of an ended run's terminal event.
const auditCatchUp = 2 * time.Second

// auditStream is AuditStream of the client's own tenant, through the read
// service: the records stored when it starts, then (Live) each new one,
// paged when a live record arrives and every two seconds.
func (c *Client) auditStream(ctx context.Context, q AuditQuery, fn func(seq uint64, rec AuditRecord) error) error {
	subjects := c.topo.Subjects()
	var live chan *nats.Msg
	if q.Live {
		live = make(chan *nats.Msg, 256)
		filter := subjects.TenantAudit(c.tenant)
		if q.RunID != "" {
			filter = subjects.RunAudit(c.tenant, q.RunID)
		}
		sub, err := c.nc.ChanSubscribe(filter, live)
		if err != nil {
			return fmt.Errorf("client: audit stream: %w", err)
		}
		defer sub.Unsubscribe() //nolint:errcheck // best effort
	}
	req := readapi.Request{Run: q.RunID}
	switch {
	case !q.Since.IsZero():
		since := q.Since
		req.Since = &since
	case q.Live:
		now := time.Now()
		req.Since = &now
	}
	var failed error
	page := func() error {
		next, err := c.reads.Scan(ctx, readapi.OpAudit, req, func(m readapi.Msg) bool {
			r, err := c.received(m)
			if err != nil {
				failed = fmt.Errorf("client: audit record %d: %w", m.Seq, err)
				return false
			}
			recs, err := events.AuditRecordsOf(r)
			if err != nil {
				failed = fmt.Errorf("client: audit record %d: %w", m.Seq, err)
				return false
			}
			for _, rec := range recs {
				if err := fn(m.Seq, rec); err != nil {
					failed = err
					return false
				}
			}
			return true
		})
		if next > req.After {
			req.Since, req.After = nil, next
		}
		if failed != nil {
			return failed
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("client: audit stream: %w", err)
		}
		return nil
	}
	if err := page(); err != nil || !q.Live {
		return err
	}
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-live:
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		if err := page(); err != nil && (failed != nil || ctx.Err() != nil || refused(err)) {
			return err
		}
	}
}

// StoredEvents lists where the events of a run that the auditor records
// are stored (the runs and requests streams, each in stream order), as far
// as the streams still hold them; `audit verify` checks that every one
// has its record.
func (c *Client) StoredEvents(ctx context.Context, runID string) ([]StoredEvent, error) {
	var out []StoredEvent
	for _, s := range []struct{ kind, name string }{{readapi.StreamRuns, c.topo.StreamRuns()}, {readapi.StreamRequests, c.topo.StreamRequests()}} {
		_, err := c.reads.Scan(ctx, readapi.OpEvents, readapi.Request{Run: runID, Stream: s.kind, HeadersOnly: true}, func(m readapi.Msg) bool {
			out = append(out, StoredEvent{Stream: s.name, Seq: m.Seq, Type: nats.Header(m.Header).Get("ce-type")})
			return true
		})
		if err != nil && !notFound(err) {
			return nil, fmt.Errorf("client: events of %s: %w", runID, err)
		}
	}
	return out, nil
}

// Artifact reads back a stored artifact (a large action output) of the
// client's tenant exactly as it was stored, with its SHA-256 as hex. It
// is read in chunks under the connection's max payload and checked
// against the store's digest; another tenant's artifact is
// artifact_not_found.
func (c *Client) Artifact(ctx context.Context, id string) ([]byte, string, error) {
	var data []byte
	var after uint64
	for {
		var ch readapi.Chunk
		if err := c.reads.Call(ctx, readapi.OpArtifact, readapi.Request{ID: id, After: after}, &ch); err != nil {
			return nil, "", fmt.Errorf("client: artifact %s: %w", id, err)
		}
		data = append(data, ch.Data...)
		if int64(len(data)) > ch.Size {
			return nil, "", actionbus.Errorf(actionbus.CodeArtifactMismatch, "client: artifact %s is longer than its size", id)
		}
		if ch.Done {
			sum := sha256.Sum256(data)
			if ch.Digest != "" && ch.Digest != "SHA-256="+base64.URLEncoding.EncodeToString(sum[:]) || int64(len(data)) != ch.Size {
				return nil, "", actionbus.Errorf(actionbus.CodeArtifactMismatch, "client: artifact %s does not match its digest", id).
					WithDetail("artifact", id)
			}
			return data, hex.EncodeToString(sum[:]), nil
		}
		if ch.Next <= after {
			return nil, "", actionbus.Errorf(actionbus.CodeInternal, "client: artifact %s: the read service made no progress", id)
		}
		after = ch.Next
	}
}

// catalog reads every page of a catalog kind (name: one skill).
func (c *Client) catalog(ctx context.Context, kind, name string, fn func(json.RawMessage) error) error {
	from := ""
	for {
		var p readapi.CatalogPage
		if err := c.reads.Call(ctx, readapi.OpCatalog, readapi.Request{Kind: kind, Name: name, From: from}, &p); err != nil {
			return err
		}
		docs := p.Actions
		if kind == readapi.KindSkills {
			docs = p.Skills
		}
		for _, d := range docs {
			if err := fn(d); err != nil {
				return err
			}
		}
		if !p.More || len(docs) == 0 {
			return nil
		}
		var last struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(docs[len(docs)-1], &last); err != nil {
			return err
		}
		from = last.Name
	}
}

// Skills lists the catalog's skills (SKILL.md front matter, instructions
// and the pool hosting their tools), sorted by name.
func (c *Client) Skills(ctx context.Context) ([]Skill, error) {
	var out []Skill
	err := c.catalog(ctx, readapi.KindSkills, "", func(d json.RawMessage) error {
		var s Skill
		if err := json.Unmarshal(d, &s); err != nil {
			return err
		}
		out = append(out, s)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("client: catalog: %w", err)
	}
	return out, nil
}

// Skill returns one skill of the catalog, or an error matching
// actionbus.ErrSkillNotFound.
func (c *Client) Skill(ctx context.Context, name string) (*Skill, error) {
	var out *Skill
	err := c.catalog(ctx, readapi.KindSkills, name, func(d json.RawMessage) error {
		if out != nil {
			return nil // the first pool's, by name
		}
		var s Skill
		if err := json.Unmarshal(d, &s); err != nil {
			return err
		}
		out = &s
		return nil
	})
	if err != nil {
		return nil, err
	}
	if out == nil {
		return nil, actionbus.Errorf(actionbus.CodeSkillNotFound, "skill %q is not in the catalog", name)
	}
	return out, nil
}

// Actions lists the catalog's actions the client's tenant may call,
// sorted by name.
func (c *Client) Actions(ctx context.Context) ([]ActionInfo, error) {
	out := []ActionInfo{}
	err := c.catalog(ctx, readapi.KindActions, "", func(d json.RawMessage) error {
		var e actions.Entry
		if err := json.Unmarshal(d, &e); err != nil {
			return err
		}
		out = append(out, ActionInfo{Name: e.Name, Description: e.Description, Mode: string(e.Mode), Tier: e.Tier,
			Pool: e.Pool, Version: e.Version, Hash: e.Hash, InputSchema: e.InputSchema, OutputSchema: e.OutputSchema,
			PlannerVisible: e.PlannerVisible(), Permission: e.Permission, Tags: e.Tags, ResourceType: e.ResourceType,
			RiskLevel: e.RiskLevel})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("client: catalog: %w", err)
	}
	return out, nil
}
