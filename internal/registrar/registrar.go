// Package registrar records the executors' announcements in the catalog.
// It is the only writer of the catalog bucket and of the owners bucket
// (bus.Topology.BucketCatalogOwners); the dispatcher process hosts it.
//
// Executors announce what they host on their pool's announce subject
// (events.Subjects.Announce: a request, answered with an
// events.AnnounceReply). The pool is the subject's token, which the
// executor's NATS user binds: an executor may publish only its own pool's
// announce subject. The registrar validates every entry as executor.Register
// does (names, modes, tiers, schemas that compile, skills' rules), and
// refuses conflicts by construction: an action or skill name is owned by
// the first pool that records it (a create-if-absent write of its owner
// record), and a pool records, updates and removes only the entries under
// its own pool, of names it owns. Every name a planner can call an action
// by is claimed the same way (Claims: the action name and its aliases in
// native tool-name form, kind KindTool), so no pool's entry answers to a
// name another pool's entry is called by. A pool holds at most
// MaxPoolActions actions and MaxPoolSkills skills; an announcement is at
// most MaxAnnouncementBytes, an entry MaxEntryBytes (over them:
// catalog_limit_exceeded). A name owned by another pool is refused
// with catalog_conflict naming both pools; nothing of a refused
// announcement is written.
package registrar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/actions/actionstore"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/record"
	"github.com/actionbus/actionbus/internal/skills"
	"github.com/actionbus/actionbus/internal/skills/skillstore"
	"github.com/actionbus/actionbus/schemas"
)

// QueueGroup is the queue group of every registrar: one of them answers
// each announcement.
const QueueGroup = "registrar"

// Kinds of catalog names.
const (
	KindAction = "action"
	KindSkill  = "skill"
	// KindTool is the kind of the names a planner calls an action by
	// (Claims): its name and aliases in native tool-name form.
	KindTool = "tool"
)

// OwnerKey is the owners-bucket key of a name of a kind.
func OwnerKey(kind, name string) string { return kind + "." + name }

// Registrar records announcements in the catalog.
type Registrar struct {
	bus    *bus.Bus
	cat    *actionstore.Catalog
	catKV  jetstream.KeyValue
	owners jetstream.KeyValue
	log    *slog.Logger
}

// New returns a registrar writing catKV (the catalog bucket) and owners
// (the owners bucket). bus receives the announcements (it validates their
// envelope, schema and pool binding).
func New(eb *bus.Bus, catKV, owners jetstream.KeyValue, log *slog.Logger) *Registrar {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Registrar{bus: eb, cat: actionstore.NewCatalog(catKV, actionstore.WithLogger(log)), catKV: catKV, owners: owners, log: log.With("component", "registrar")}
}

// MaxPending is the most announcements of one pool waiting for a
// registrar; one more is answered at once with registrar_unavailable (the
// registrar is busy with that pool; an executor retries it with backoff
// until its announce deadline).
const MaxPending = 16

// Serve answers announcements on nc until ctx ends. Each pool's
// announcements are answered in order, one at a time, by a worker of its
// own, so one pool's announcements never wait behind another's: a pool
// that floods the registrar delays only itself, and at most MaxPending of
// its announcements wait (more are answered registrar_unavailable).
func (r *Registrar) Serve(ctx context.Context, nc *nats.Conn) error {
	queues := map[string]chan *nats.Msg{}
	var mu sync.Mutex
	queue := func(pool string) chan *nats.Msg {
		mu.Lock()
		defer mu.Unlock()
		q, ok := queues[pool]
		if !ok {
			q = make(chan *nats.Msg, MaxPending)
			queues[pool] = q
			go func() {
				for {
					select {
					case <-ctx.Done():
						return
					case m := <-q:
						r.respond(m, r.handle(ctx, m))
					}
				}
			}()
		}
		return q
	}
	sub, err := nc.QueueSubscribe(r.bus.Subjects().AllAnnounce(), QueueGroup, func(m *nats.Msg) {
		if !bus.AnswerableReply(m.Reply) {
			// The answer would be published as this service, wherever the
			// announcer pointed it (a bucket, a run subject): neither
			// answered nor recorded.
			r.log.Warn("announcement refused: its reply subject is not an inbox", "subject", m.Subject, "reply", clipReply(m.Reply))
			return
		}
		pool := r.bus.Subjects().PoolFromAnnounce(m.Subject)
		if pool == "" {
			r.respond(m, refused(actionbus.Errorf(actionbus.CodeSubjectMismatch, "not an announce subject")))
			return
		}
		select {
		case queue(pool) <- m:
		default:
			r.respond(m, refused((&actionbus.Error{Code: actionbus.CodeRegistrarUnavailable,
				Message: fmt.Sprintf("the registrar has %d announcements of pool %s waiting; retry later", MaxPending, pool)}).
				WithDetail("pool", pool).WithDetail("limit", "pending_announcements").WithDetail("max", MaxPending)))
		}
	})
	if err != nil {
		return fmt.Errorf("registrar: subscribe: %w", err)
	}
	go func() {
		<-ctx.Done()
		_ = sub.Unsubscribe()
	}()
	return nil
}

func (r *Registrar) respond(m *nats.Msg, reply events.AnnounceReply) {
	b, err := json.Marshal(reply)
	if err != nil {
		return
	}
	if err := m.Respond(b); err != nil && !errors.Is(err, nats.ErrMsgNoReply) {
		r.log.Warn("announcement not answered", "subject", m.Subject, "err", err)
	}
}

func (r *Registrar) handle(ctx context.Context, m *nats.Msg) events.AnnounceReply {
	pool := r.bus.Subjects().PoolFromAnnounce(m.Subject)
	if pool == "" {
		return refused(actionbus.Errorf(actionbus.CodeSubjectMismatch, "not an announce subject"))
	}
	if err := CheckSize(pool, len(m.Data)); err != nil {
		r.log.Warn("announcement refused", "pool", pool, "err", err)
		return refused(err)
	}
	rec, err := r.bus.Receive(m.Subject, m.Header, m.Data)
	if err != nil {
		return refused(err)
	}
	a, ok := rec.Data.(*events.PoolAnnounced)
	if !ok {
		return refused(actionbus.Errorf(actionbus.CodeSubjectMismatch, "event type %s is not carried on an announce subject", rec.Event.Type()))
	}
	cctx, cancel := bus.Bounded(ctx)
	defer cancel()
	reply := r.Register(cctx, pool, a)
	if reply.Error != nil {
		r.log.Warn("announcement refused", "pool", pool, "executor", clip(a.Executor), "code", reply.Error.Code, "err", reply.Error.Message)
	} else {
		r.log.Info("announcement recorded", "pool", pool, "executor", clip(a.Executor), "actions", len(reply.Actions), "skills", len(reply.Skills))
	}
	return reply
}

func refused(err error) events.AnnounceReply {
	var typed *actionbus.Error
	if !errors.As(err, &typed) {
		typed = &actionbus.Error{Code: actionbus.CodeInternal, Message: "the registrar failed: " + err.Error()}
	}
	return events.AnnounceReply{Error: typed}
}

// Announcement is an announcement's entries, decoded and validated.
type Announcement struct {
	Actions []actions.Definition
	Skills  []skills.Skill
	Removed []string
}

// Parse decodes and validates the entries of an announcement of pool
// (the subject's): every action definition against
// schemas/action-definition.json, then as executor.Register checks it
// (normalized, so the permission recorded is the one derived from the
// declared one), every skill as skills.Validate does, every entry of this
// very pool, no name twice. The error is an *actionbus.Error
// (invalid_definition, invalid_skill).
func Parse(pool string, a *events.PoolAnnounced) (*Announcement, error) {
	if !events.ValidPool(pool) {
		return nil, actionbus.Errorf(actionbus.CodeInvalidDefinition, "invalid pool %q", clip(pool))
	}
	if a.Pool != pool {
		return nil, actionbus.Errorf(actionbus.CodeSubjectMismatch, "the announcement names pool %q on pool %s's subject", clip(a.Pool), pool)
	}
	if err := CheckCounts(pool, len(a.Actions), len(a.Skills)); err != nil {
		return nil, err
	}
	out := &Announcement{}
	seen := map[string]bool{}
	claimed := map[string]string{} // tool name → the action claiming it
	for i, raw := range a.Actions {
		var def actions.Definition
		if err := strictDecode(pool, raw, &def); err != nil {
			if errors.Is(err, actionbus.ErrCatalogLimit) {
				return nil, err
			}
			return nil, actionbus.Errorf(actionbus.CodeInvalidDefinition, "action %d does not decode: %v", i, err)
		}
		if def.Pool != "" && def.Pool != pool {
			return nil, (&actionbus.Error{Code: actionbus.CodeInvalidDefinition,
				Message: fmt.Sprintf("action %q names pool %q, announced by pool %s", clip(def.Name), clip(def.Pool), pool)}).WithDetail("action", clip(def.Name))
		}
		def.Pool = pool
		if err := def.Normalize(); err != nil {
			return nil, err
		}
		if _, err := actions.NewArgsChecker(def); err != nil {
			return nil, actionbus.Errorf(actionbus.CodeInvalidDefinition, "action %s: %v", def.Name, err).WithDetail("action", def.Name)
		}
		for _, t := range def.Tenants {
			if err := events.CheckTenant(t); err != nil {
				return nil, err
			}
		}
		if seen[def.Name] {
			return nil, actionbus.Errorf(actionbus.CodeInvalidDefinition, "action %q announced twice", def.Name).WithDetail("action", def.Name)
		}
		// Last, the schema other languages read: whatever the checks
		// above let through (they answer with their own codes first).
		if err := checkDefinition(pool, i, raw); err != nil {
			return nil, err
		}
		seen[def.Name] = true
		for _, c := range Claims(def) {
			if other, ok := claimed[c]; ok {
				return nil, actionbus.Errorf(actionbus.CodeInvalidDefinition, "actions %q and %q are both called %q by the planner (a name or an alias)", other, def.Name, c).WithDetail("action", def.Name)
			}
			claimed[c] = def.Name
		}
		out.Actions = append(out.Actions, def)
	}
	seenSkill := map[string]bool{}
	for i, raw := range a.Skills {
		var s skills.Skill
		if err := strictDecode(pool, raw, &s); err != nil {
			if errors.Is(err, actionbus.ErrCatalogLimit) {
				return nil, err
			}
			return nil, actionbus.Errorf(actionbus.CodeInvalidSkill, "skill %d does not decode: %v", i, err)
		}
		if s.Pool != "" && s.Pool != pool {
			return nil, actionbus.Errorf(actionbus.CodeInvalidSkill, "skill %q names pool %q, announced by pool %s", clip(s.Name), clip(s.Pool), pool)
		}
		s.Pool = pool
		if err := s.Validate(); err != nil {
			return nil, err
		}
		if seenSkill[s.Name] {
			return nil, actionbus.Errorf(actionbus.CodeInvalidSkill, "skill %q announced twice", s.Name)
		}
		seenSkill[s.Name] = true
		out.Skills = append(out.Skills, s)
	}
	if len(a.Removed) > MaxPoolActions {
		return nil, limitError(pool, "pool_removed", MaxPoolActions, len(a.Removed))
	}
	for _, name := range a.Removed {
		if !actions.ValidName(name) {
			return nil, actionbus.Errorf(actionbus.CodeInvalidDefinition, "removed action %q is not an action name", clip(name))
		}
		if seen[name] {
			return nil, actionbus.Errorf(actionbus.CodeInvalidDefinition, "action %q both announced and removed", name).WithDetail("action", name)
		}
		out.Removed = append(out.Removed, name)
	}
	return out, nil
}

// checkDefinition refuses an announced action that fails
// schemas/action-definition.json (invalid_definition, with the schema's
// issues), so what executors in any language send is checked against the
// schema docs/protocol.md names.
func checkDefinition(pool string, i int, obj map[string]any) error {
	raw, err := json.Marshal(obj)
	if err != nil {
		return actionbus.Errorf(actionbus.CodeInvalidDefinition, "action %d does not encode: %v", i, err)
	}
	if len(raw) > MaxEntryBytes {
		return limitError(pool, "entry_bytes", MaxEntryBytes, len(raw))
	}
	if err := record.Validate(record.ActionDefinition, fmt.Sprintf("%s[%d]", pool, i), raw); err != nil {
		var typed *actionbus.Error
		out := actionbus.Errorf(actionbus.CodeInvalidDefinition, "action %d fails %s: %v", i, schemas.ActionDefinition, err)
		if errors.As(err, &typed) && typed.Details["issues"] != nil {
			out = out.WithDetail("issues", typed.Details["issues"])
		}
		if name, ok := obj["name"].(string); ok {
			out = out.WithDetail("action", clip(name))
		}
		return out
	}
	return nil
}

// strictDecode decodes obj into v, refusing unknown fields and an entry
// of more than MaxEntryBytes (catalog_limit_exceeded).
func strictDecode(pool string, obj map[string]any, v any) error {
	raw, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	if len(raw) > MaxEntryBytes {
		return limitError(pool, "entry_bytes", MaxEntryBytes, len(raw))
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data")
	}
	return nil
}

// Decide is the verdict on pool recording a name of kind: owner is the
// pool its owner record names ("" when it has none), holders the pools
// whose catalog entries hold the name (entries recorded before owner
// records existed count as owned by their pool). Pool may record the name
// when it owns it, or when nobody does and no other pool holds it; any
// other case is catalog_conflict naming the pools.
func Decide(kind, name, pool, owner string, holders []string) error {
	others := map[string]bool{}
	if owner != "" && owner != pool {
		others[owner] = true
	}
	if owner == "" {
		for _, h := range holders {
			if h != pool {
				others[h] = true
			}
		}
	}
	if len(others) == 0 {
		return nil
	}
	pools := []string{pool}
	for p := range others {
		pools = append(pools, p)
	}
	sort.Strings(pools)
	owners := make([]string, 0, len(others))
	for p := range others {
		owners = append(owners, p)
	}
	sort.Strings(owners)
	return (&actionbus.Error{Code: actionbus.CodeCatalogConflict,
		Message: fmt.Sprintf("%s %q belongs to pool %s; pool %s cannot record it (a pool never replaces or shadows another pool's entry)",
			kind, name, strings.Join(owners, ", "), pool)}).
		WithDetail(kind+"Name", name).WithDetail("pools", pools).WithDetail("pool", pool).WithDetail("owner", strings.Join(owners, ","))
}

// Register records a's entries for pool (the subject's token) and
// returns the reply for the executor. Every name is checked before
// anything is written: the action's name, each name the planner calls it
// by (Claims, kind KindTool) and each skill's name must be the pool's own
// or nobody's, and the pool's totals must stay within MaxPoolActions and
// MaxPoolSkills. Names the pool already owns are not claimed again.
func (r *Registrar) Register(ctx context.Context, pool string, a *events.PoolAnnounced) events.AnnounceReply {
	ann, err := Parse(pool, a)
	if err != nil {
		return refused(err)
	}
	cat, err := r.catalogNames(ctx)
	if err != nil {
		return refused(err)
	}
	if err := CheckPoolTotals(pool, cat.actions[pool], cat.skills[pool], ann); err != nil {
		return refused(err)
	}
	var todo []ownerName
	for _, d := range ann.Actions {
		names := []ownerName{{KindAction, d.Name}}
		for _, c := range Claims(d) {
			names = append(names, ownerName{KindTool, c})
		}
		for _, n := range names {
			owner, err := r.check(ctx, n.kind, n.name, pool, cat.holders[OwnerKey(n.kind, n.name)])
			if err != nil {
				return refused(err)
			}
			if owner != pool {
				todo = append(todo, n)
			}
		}
	}
	for _, s := range ann.Skills {
		owner, err := r.check(ctx, KindSkill, s.Name, pool, cat.holders[OwnerKey(KindSkill, s.Name)])
		if err != nil {
			return refused(err)
		}
		if owner != pool {
			todo = append(todo, ownerName{KindSkill, s.Name})
		}
	}
	for _, n := range todo {
		if err := r.claim(ctx, n.kind, n.name, pool); err != nil {
			return refused(err)
		}
	}
	var reply events.AnnounceReply
	for _, d := range ann.Actions {
		if err := r.cat.Publish(ctx, d, a.Executor); err != nil {
			return refused(err)
		}
		reply.Actions = append(reply.Actions, d.Name)
	}
	for _, s := range ann.Skills {
		if err := skillstore.Publish(ctx, r.catKV, s); err != nil {
			return refused(err)
		}
		reply.Skills = append(reply.Skills, s.Name)
	}
	for _, name := range ann.Removed {
		if err := r.remove(ctx, pool, name); err != nil {
			return refused(err)
		}
	}
	return reply
}

// ownerName is a name of a kind, as the owners bucket keys it.
type ownerName struct{ kind, name string }

// names is what the catalog's keys say: the pools whose entries hold
// each owner key (holders), and each pool's action and skill names.
type names struct {
	holders         map[string][]string
	actions, skills map[string][]string
}

// catalogNames reads the catalog's keys. An action's entry holds its
// name and its tool name (the aliases are in its value, not its key:
// entries recorded before tool claims existed have their aliases
// unclaimed, and the planner's index never lets an alias override a name).
func (r *Registrar) catalogNames(ctx context.Context) (names, error) {
	out := names{holders: map[string][]string{}, actions: map[string][]string{}, skills: map[string][]string{}}
	lister, err := r.catKV.ListKeys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("registrar: list the catalog: %w", err)
	}
	defer lister.Stop() //nolint:errcheck // best effort
	for key := range lister.Keys() {
		pool, rest, ok := strings.Cut(key, ".")
		if !ok {
			continue
		}
		if name, isSkill := strings.CutPrefix(rest, actions.SkillKeyMarker+"."); isSkill {
			out.holders[OwnerKey(KindSkill, name)] = append(out.holders[OwnerKey(KindSkill, name)], pool)
			out.skills[pool] = append(out.skills[pool], name)
			continue
		}
		out.holders[OwnerKey(KindAction, rest)] = append(out.holders[OwnerKey(KindAction, rest)], pool)
		tool := OwnerKey(KindTool, actions.ToolName(rest))
		out.holders[tool] = append(out.holders[tool], pool)
		out.actions[pool] = append(out.actions[pool], rest)
	}
	return out, nil
}

// owner returns the pool the owner record of a name names ("" when none)
// and the record's revision.
func (r *Registrar) owner(ctx context.Context, kind, name string) (string, uint64, error) {
	e, err := r.owners.Get(ctx, OwnerKey(kind, name))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, fmt.Errorf("registrar: owner of %s %s: %w", kind, name, err)
	}
	return string(e.Value()), e.Revision(), nil
}

// check returns the name's owner when pool may record it (Decide).
func (r *Registrar) check(ctx context.Context, kind, name, pool string, holders []string) (string, error) {
	owner, _, err := r.owner(ctx, kind, name)
	if err != nil {
		return "", err
	}
	return owner, Decide(kind, name, pool, owner, holders)
}

// claim makes pool the owner of a name, or refuses: the owner record is
// created only if absent, so of two pools claiming a name at once through
// two registrars, exactly one wins.
func (r *Registrar) claim(ctx context.Context, kind, name, pool string) error {
	if _, err := r.owners.Create(ctx, OwnerKey(kind, name), []byte(pool)); err == nil || !errors.Is(err, jetstream.ErrKeyExists) {
		if err != nil {
			return fmt.Errorf("registrar: claim %s %s: %w", kind, name, err)
		}
		return nil
	}
	owner, _, err := r.owner(ctx, kind, name)
	if err != nil {
		return err
	}
	return Decide(kind, name, pool, owner, nil)
}

// remove takes pool's entry of an action out of the catalog and gives up
// its names (the action name and the tool names of Claims), when pool
// owns them; another pool's entry or claim is never touched.
func (r *Registrar) remove(ctx context.Context, pool, name string) error {
	owner, _, err := r.owner(ctx, KindAction, name)
	if err != nil {
		return err
	}
	if owner != pool && owner != "" {
		return nil
	}
	held := []ownerName{{KindAction, name}}
	def := actions.Definition{Name: name}
	e, err := r.catKV.Get(ctx, actions.CatalogKey(pool, name))
	switch {
	case err == nil:
		// The aliases to release are those of an entry the catalog
		// accepts; of a refused one, only the name's own claims.
		if entry, err := actionstore.DecodeEntry(e.Key(), e.Value()); err == nil {
			def = entry.Definition
		}
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return fmt.Errorf("registrar: read %s: %w", name, err)
	}
	for _, c := range Claims(def) {
		held = append(held, ownerName{KindTool, c})
	}
	// Only an entry there is deleted: a delete stores a marker, which
	// every reader of the catalog reads, and names the pool never
	// published would otherwise grow the catalog without bound.
	if err == nil {
		if err := r.cat.Remove(ctx, pool, name); err != nil {
			return err
		}
	}
	for _, n := range held {
		o, rev, err := r.owner(ctx, n.kind, n.name)
		if err != nil {
			return err
		}
		if o != pool {
			continue
		}
		if err := r.owners.Delete(ctx, OwnerKey(n.kind, n.name), jetstream.LastRevision(rev)); err != nil && !bus.IsRevisionConflict(err) {
			return fmt.Errorf("registrar: release %s %s: %w", n.kind, n.name, err)
		}
	}
	return nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// Run serves a registrar on nc until ctx ends, for a process that hosts
// executors but no dispatcher (tests, benchmarks; a deployment's
// dispatchers host theirs). prefix is the subject prefix ("" is "ab").
func Run(ctx context.Context, nc *nats.Conn, prefix string, log *slog.Logger) error {
	eb, err := bus.Open(nc, bus.BusConfig{Prefix: prefix, Source: "/actionbus/registrar", Logger: log, ReceiverValidates: true})
	if err != nil {
		return err
	}
	topo := bus.Topology{Prefix: prefix}
	js := eb.JetStream()
	catKV, err := js.KeyValue(ctx, topo.BucketCatalog())
	if err != nil {
		return fmt.Errorf("registrar: %w", err)
	}
	owners, err := js.KeyValue(ctx, topo.BucketCatalogOwners())
	if err != nil {
		return fmt.Errorf("registrar: %w", err)
	}
	if err := New(eb, catKV, owners, log).Serve(ctx, nc); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// clipReply bounds a caller's reply subject in a log line.
func clipReply(s string) string {
	if len(s) > 128 {
		return s[:128] + "…"
	}
	return s
}
