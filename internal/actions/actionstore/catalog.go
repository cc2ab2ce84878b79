// Package actionstore reads, writes and follows the catalog bucket: the
// shared catalog of actions (package actions defines an action and links
// no NATS; this package is the JetStream side).
package actionstore

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
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/bus"
	"github.com/actionbus/actionbus/internal/record"
)

// Catalog reads and writes the catalog bucket. Keys are
// "<pool>.<action name>": an executor's NATS user may write only under its
// own pool's prefix, so no pool can redefine another pool's action (its
// mode, tier or pool). An entry whose Pool differs from its key's pool is
// ignored, and an action name published by two pools is refused with
// catalog_conflict rather than resolved in favour of either.
//
// Every entry read is checked by [DecodeEntry] (its schema, its key, its
// hash, its permission): an entry that fails is refused — not listed, not
// resolved — and logged once per stored revision.
type Catalog struct {
	kv  jetstream.KeyValue
	log *slog.Logger

	refusedMu sync.Mutex
	refused   map[string]uint64 // key → the revision last logged refused
}

// Option configures a [Catalog].
type Option func(*Catalog)

// WithLogger sets where refused entries are logged; default: nowhere.
func WithLogger(log *slog.Logger) Option {
	return func(c *Catalog) {
		if log != nil {
			c.log = log.With("component", "catalog")
		}
	}
}

// NewCatalog returns a catalog over kv.
func NewCatalog(kv jetstream.KeyValue, opts ...Option) *Catalog {
	c := &Catalog{kv: kv, log: slog.New(slog.DiscardHandler), refused: map[string]uint64{}}
	for _, o := range opts {
		o(c)
	}
	return c
}

// refuse logs err, the refusal of the entry stored under key at rev,
// unless that revision was logged already.
func (c *Catalog) refuse(key string, rev uint64, err error) {
	c.refusedMu.Lock()
	last, seen := c.refused[key]
	if seen && last == rev {
		c.refusedMu.Unlock()
		return
	}
	if len(c.refused) >= maxRefusedKeys {
		clear(c.refused)
	}
	c.refused[key] = rev
	c.refusedMu.Unlock()
	c.log.Warn("catalog entry refused: not listed, not dispatchable", "key", key, "revision", rev,
		"code", actionbus.CodeOf(err), "err", err)
}

// maxRefusedKeys bounds the memory of refused entries already logged.
const maxRefusedKeys = 4096

// Publish writes def (normalized, as [actions.Definition.Normalize]
// leaves it) to the catalog under its pool; an entry that [DecodeEntry]
// would refuse is not written (invalid_definition). Publishing the same
// name and version with the same hash refreshes the entry; with another
// hash it fails with catalog_conflict (two executors disagree on what the
// action is); a new version replaces the old one. An entry the same
// executor published with the same hash is left as it is (not rewritten,
// so its PublishedAt is its first publication). Concurrent publishers are
// serialized by the bucket's revisions.
func (c *Catalog) Publish(ctx context.Context, def actions.Definition, executorID string) error {
	entry := actions.Entry{Definition: def, Hash: def.Hash(), PublishedAt: time.Now().UTC(), PublishedBy: executorID}
	val, err := json.Marshal(entry)
	if err != nil {
		return err
	}
	key := actions.CatalogKey(def.Pool, def.Name)
	// What is written is what every reader accepts: never an entry that
	// DecodeEntry refuses.
	if _, err := DecodeEntry(key, val); err != nil {
		return actionbus.Errorf(actionbus.CodeInvalidDefinition, "action %s: the catalog would refuse its entry: %w", def.Name, err).
			WithDetail("action", def.Name)
	}
	for attempt := 0; attempt < 10; attempt++ {
		cur, err := c.kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			if _, err := c.kv.Create(ctx, key, val); err == nil {
				return nil
			} else if !errors.Is(err, jetstream.ErrKeyExists) {
				return fmt.Errorf("actions: publish %s: %w", def.Name, err)
			}
			continue
		case err != nil:
			return fmt.Errorf("actions: publish %s: %w", def.Name, err)
		}
		var old actions.Entry
		err = json.Unmarshal(cur.Value(), &old)
		if err == nil && old.Hash == entry.Hash && old.PublishedBy == executorID && old.Pool == def.Pool {
			return nil // unchanged: not rewritten
		}
		if err == nil && old.Version == def.Version && old.Hash != entry.Hash {
			return actionbus.Errorf(actionbus.CodeCatalogConflict,
				"action %q version %s is already in the catalog with another definition (hash %s, published by %s, pool %s); bump the version to replace it",
				def.Name, def.Version, old.Hash[:12], old.PublishedBy, old.Pool)
		}
		if _, err := c.kv.Update(ctx, key, val, cur.Revision()); err == nil {
			return nil
		} else if !bus.IsRevisionConflict(err) {
			return fmt.Errorf("actions: publish %s: %w", def.Name, err)
		}
	}
	return fmt.Errorf("actions: publish %s: too many concurrent updates", def.Name)
}

// Remove takes an action of a pool out of the catalog.
func (c *Catalog) Remove(ctx context.Context, pool, name string) error {
	if err := c.kv.Delete(ctx, actions.CatalogKey(pool, name)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("actions: remove %s: %w", name, err)
	}
	return nil
}

// isSkillKey reports whether key is a skill's (package skillstore's).
func isSkillKey(key string) bool { return strings.Contains(key, "."+actions.SkillKeyMarker+".") }

// DecodeEntry decodes and checks the catalog entry stored under key: the
// one read path of every catalog reader. An entry is refused with
// invalid_record (record catalog_entry) when its value fails
// schemas/catalog-entry.json, when its key is not <pool>.<name> of its
// own pool and name, when its hash is not [actions.EntryHash] of the
// value, or when its definition does not normalize to itself (schemas
// that do not compile, a permission safer than its mode and declared
// permission give). It never panics on input.
func DecodeEntry(key string, val []byte) (actions.Entry, error) {
	if err := record.Validate(record.CatalogEntry, key, val); err != nil {
		return actions.Entry{}, err
	}
	var e actions.Entry
	dec := json.NewDecoder(bytes.NewReader(val))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil {
		return actions.Entry{}, record.Invalid(record.CatalogEntry, key, "does not decode: %v", err)
	}
	if actions.CatalogKey(e.Pool, e.Name) != key {
		return actions.Entry{}, record.Invalid(record.CatalogEntry, key, "its key is not %s.%s, its pool and name", e.Pool, e.Name)
	}
	h, err := actions.EntryHash(val)
	if err != nil {
		return actions.Entry{}, record.Invalid(record.CatalogEntry, key, "%v", err)
	}
	if h != e.Hash {
		return actions.Entry{}, record.Invalid(record.CatalogEntry, key, "hash %s is not the hash of its definition", clipHash(e.Hash)).
			WithDetail("action", e.Name)
	}
	norm := e.Definition
	if err := norm.Normalize(); err != nil {
		return actions.Entry{}, record.Invalid(record.CatalogEntry, key, "%v", err).WithDetail("action", e.Name)
	}
	if norm.Permission != e.Permission {
		return actions.Entry{}, record.Invalid(record.CatalogEntry, key,
			"its permission is not the one its mode and declared permission give").WithDetail("action", e.Name)
	}
	return e, nil
}

func clipHash(h string) string {
	if len(h) > 16 {
		return h[:16] + "…"
	}
	return h
}

// resolve picks the one entry of an action name among those of every
// pool, or refuses: none is action_not_found, several is catalog_conflict.
func resolve(name string, found []actions.Entry) (*actions.Entry, error) {
	switch len(found) {
	case 0:
		return nil, actionbus.Errorf(actionbus.CodeActionNotFound, "action %q is not in the catalog", name)
	case 1:
		return &found[0], nil
	}
	pools := make([]string, len(found))
	for i, e := range found {
		pools[i] = e.Pool
	}
	sort.Strings(pools)
	return nil, (&actionbus.Error{Code: actionbus.CodeCatalogConflict,
		Message: fmt.Sprintf("action %q is published by several pools (%v); it is refused until only one publishes it", name, pools)}).
		WithDetail("actionName", name).WithDetail("pools", pools)
}

// Get returns the catalog entry of an action, or an error matching
// actionbus.ErrActionNotFound (or catalog_conflict when several pools
// publish the name).
func (c *Catalog) Get(ctx context.Context, name string) (*actions.Entry, error) {
	if !actions.ValidName(name) {
		return nil, actionbus.Errorf(actionbus.CodeActionNotFound, "action %q is not in the catalog", name)
	}
	lister, err := c.kv.ListKeysFiltered(ctx, "*."+name)
	if err != nil {
		return nil, fmt.Errorf("actions: catalog get %s: %w", name, err)
	}
	defer lister.Stop()
	var found []actions.Entry
	var refused error
	for key := range lister.Keys() {
		kve, err := c.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("actions: catalog get %s: %w", name, err)
		}
		e, err := DecodeEntry(key, kve.Value())
		if err != nil {
			c.refuse(key, kve.Revision(), err)
			refused = err
			continue
		}
		if e.Name == name {
			found = append(found, e)
		}
	}
	if len(found) == 0 && refused != nil {
		return nil, refused
	}
	return resolve(name, found)
}

// List returns every entry that resolves ([Catalog.Get]), sorted by name.
func (c *Catalog) List(ctx context.Context) ([]actions.Entry, error) {
	lister, err := c.kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	defer lister.Stop()
	byName := map[string][]actions.Entry{}
	for key := range lister.Keys() {
		kve, err := c.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if isSkillKey(key) {
			continue
		}
		e, err := DecodeEntry(key, kve.Value())
		if err != nil {
			c.refuse(key, kve.Revision(), err)
			continue
		}
		byName[e.Name] = append(byName[e.Name], e)
	}
	return resolvedList(byName), nil
}

// resolvedList returns the entries whose names resolve, sorted by name.
func resolvedList(byName map[string][]actions.Entry) []actions.Entry {
	out := make([]actions.Entry, 0, len(byName))
	for name, found := range byName {
		if e, err := resolve(name, found); err == nil {
			out = append(out, *e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// View is a live, in-memory copy of the catalog, kept current by a bucket
// watch ([Catalog.Watch]) or by reading the bucket's stream with direct
// gets ([Catalog.Follow]). It is safe for concurrent use.
type View struct {
	cat     *Catalog
	mu      sync.RWMutex
	entries map[string]actions.Entry            // by bucket key
	byName  map[string]map[string]actions.Entry // action name → bucket key → entry
	skills  map[string]bool                     // skill keys (SkillKeyMarker) present
	seq     uint64                              // the bucket stream sequence applied last
	changed chan struct{}                       // closed (and replaced) when seq moves

	// follow reads what the bucket stored after seq (a followed view;
	// nil for a watched one); followMu keeps one read at a time.
	follow   func(ctx context.Context) error
	followMu sync.Mutex
}

func newView(c *Catalog) *View {
	return &View{cat: c, entries: map[string]actions.Entry{}, byName: map[string]map[string]actions.Entry{}, changed: make(chan struct{})}
}

// HasSkills reports whether the catalog holds any skill.
func (v *View) HasSkills() bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return len(v.skills) > 0
}

// Watch starts a View that follows the catalog until ctx ends. It returns
// once the current content is loaded.
func (c *Catalog) Watch(ctx context.Context) (*View, error) {
	w, err := c.kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("actions: watch catalog: %w", err)
	}
	v := newView(c)
	loaded := make(chan struct{})
	go func() {
		defer w.Stop()
		initial := true
		for {
			select {
			case <-ctx.Done():
				return
			case kve, ok := <-w.Updates():
				if !ok {
					return
				}
				if kve == nil {
					if initial {
						initial = false
						close(loaded)
					}
					continue
				}
				v.apply(kve.Key(), kve.Revision(), kve.Operation() == jetstream.KeyValuePut, kve.Value())
			}
		}
	}()
	select {
	case <-loaded:
		return v, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// apply records the bucket's write of key at stream sequence rev: a put
// of val, or a delete or purge.
func (v *View) apply(key string, rev uint64, put bool, val []byte) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if rev > v.seq {
		v.seq = rev
		close(v.changed)
		v.changed = make(chan struct{})
	}
	if old, ok := v.entries[key]; ok {
		delete(v.entries, key)
		delete(v.byName[old.Name], key)
		if len(v.byName[old.Name]) == 0 {
			delete(v.byName, old.Name)
		}
	}
	if isSkillKey(key) {
		if v.skills == nil {
			v.skills = map[string]bool{}
		}
		if put {
			v.skills[key] = true
		} else {
			delete(v.skills, key)
		}
		return
	}
	if !put {
		return
	}
	e, err := DecodeEntry(key, val)
	if err != nil {
		v.cat.refuse(key, rev, err)
		return
	}
	v.entries[key] = e
	if v.byName[e.Name] == nil {
		v.byName[e.Name] = map[string]actions.Entry{}
	}
	v.byName[e.Name][key] = e
}

// DefaultFollowEvery is how often a followed view ([Catalog.Follow]) reads
// what the bucket stored since its last read.
const DefaultFollowEvery = time.Second

// kvOperation is the header a key-value bucket marks a delete ("DEL") or
// a purge ("PURGE") with; a put carries none.
const kvOperation = "KV-Operation"

// Follow starts a View that follows the catalog with batch direct gets of
// the bucket's stream — the messages after the last one applied, a page
// at a time, until none is left — every `every` (DefaultFollowEvery when
// 0), on [View.CatchUp], and before a [View.Get] reports an action
// missing. It returns once the current content is loaded. A read that
// finds nothing new is one request.
//
// It creates no consumer. A consumer is created in the stream's account
// and a push consumer delivers to the subject its create request names,
// so a user of an account of its own (the planner, the auditor) that may
// create one may have the services' account deliver anywhere in it;
// direct gets answer its own reply subject, through its import, and
// nothing else (docs/security.md).
func (c *Catalog) Follow(ctx context.Context, js jetstream.JetStream, every time.Duration) (*View, error) {
	if every <= 0 {
		every = DefaultFollowEvery
	}
	bucket := c.kv.Bucket()
	stream := "KV_" + bucket
	prefix := "$KV." + bucket + "."
	v := newView(c)
	v.follow = func(ctx context.Context) error {
		for {
			v.mu.RLock()
			next := v.seq + 1
			v.mu.RUnlock()
			if next == 0 {
				return nil // the last sequence there is was read
			}
			n, err := v.readPage(ctx, js, stream, prefix, next)
			if err != nil {
				return fmt.Errorf("actions: follow catalog: %w", err)
			}
			if n < followPage {
				return nil
			}
		}
	}
	if err := v.read(ctx); err != nil {
		return nil, err
	}
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		failing := false
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rctx, cancel := context.WithTimeout(ctx, every+5*time.Second)
			err := v.read(rctx)
			cancel()
			switch {
			case err != nil && !failing && ctx.Err() == nil:
				c.log.Warn("catalog reads fail; the view keeps what it has", "err", err)
				failing = true
			case err == nil && failing:
				c.log.Info("catalog reads recovered")
				failing = false
			}
		}
	}()
	return v, nil
}

// applied returns the last bucket stream sequence the view applied.
func (v *View) applied() uint64 {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.seq
}

// read applies what the bucket stored after the view's last sequence
// (a followed view).
func (v *View) read(ctx context.Context) error {
	v.followMu.Lock()
	defer v.followMu.Unlock()
	return v.follow(ctx)
}

// followPage is the most messages one direct get of a followed view asks
// for.
const followPage = 256

// readPage applies the bucket's messages from sequence next on, one batch
// direct get of at most followPage, and returns how many it applied. Each
// is taken at the subject and sequence the server stored it under
// ([bus.ReadAsStored]: a stored header of the same name is not), and a
// sequence that does not move forward ends the read as an error rather
// than reading the same message again.
func (v *View) readPage(ctx context.Context, js jetstream.JetStream, stream, prefix string, next uint64) (int, error) {
	ctx, cancel := bus.Bounded(ctx)
	defer cancel()
	msgs, err := jetstreamext.GetBatch(ctx, js, stream, followPage, jetstreamext.GetBatchSubject(prefix+">"), jetstreamext.GetBatchSeq(next))
	if err != nil {
		return 0, err
	}
	n := 0
	for m, err := range bus.AsStored(msgs) {
		if err != nil {
			return n, err
		}
		key, ok := strings.CutPrefix(m.Subject, prefix)
		if !ok || m.Sequence < next {
			return n, fmt.Errorf("a direct get answered %s at sequence %d, asked for %s from %d", m.Subject, m.Sequence, prefix+">", next)
		}
		v.apply(key, m.Sequence, m.Header.Get(kvOperation) == "", m.Data)
		next = m.Sequence + 1
		n++
	}
	return n, nil
}

// CatchUp waits until the view holds every write the bucket had stored
// when it was called (read-your-writes: an executor whose announcement the
// registrar acknowledged is listed), or until ctx ends or a second has
// passed — then the view is listed as it is. It creates no consumer: it
// asks for the stream's information (its leader's last sequence), and a
// followed view reads the bucket's stream until it holds that sequence.
func (v *View) CatchUp(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	// The last sequence the stream's leader has stored: a direct get may
	// be answered by a replica that has not stored it yet.
	st, err := v.cat.kv.Status(ctx)
	if err != nil {
		return
	}
	js, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return
	}
	last := js.StreamInfo().State.LastSeq
	if v.follow != nil {
		for {
			// On failure the view is listed as it is.
			if err := v.read(ctx); err != nil || v.applied() >= last {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond): // a replica catching up
			}
		}
	}
	for {
		v.mu.RLock()
		seq, changed := v.seq, v.changed
		v.mu.RUnlock()
		if seq >= last {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

// Get returns an entry. An action missing from the view is looked up
// again before it is reported missing, so an action published a moment ago
// is found: a followed view reads what the bucket stored since its last
// read, a watched one reads the bucket. The error matches
// actionbus.ErrActionNotFound when the action is in neither, and is
// catalog_conflict when several pools publish the name.
func (v *View) Get(ctx context.Context, name string) (*actions.Entry, error) {
	if e, ok, err := v.lookup(name); ok {
		return e, err
	}
	if v.follow == nil {
		return v.cat.Get(ctx, name)
	}
	if err := v.read(ctx); err != nil {
		return nil, err
	}
	if e, ok, err := v.lookup(name); ok {
		return e, err
	}
	return nil, actionbus.Errorf(actionbus.CodeActionNotFound, "action %q is not in the catalog", name)
}

// lookup resolves name among the view's entries; ok is false when the
// view holds none of that name.
func (v *View) lookup(name string) (e *actions.Entry, ok bool, err error) {
	v.mu.RLock()
	found := make([]actions.Entry, 0, len(v.byName[name]))
	for _, e := range v.byName[name] {
		found = append(found, e)
	}
	v.mu.RUnlock()
	if len(found) == 0 {
		return nil, false, nil
	}
	e, err = resolve(name, found)
	return e, true, err
}

// List returns the entries of the view whose names resolve, sorted by
// name.
func (v *View) List() []actions.Entry {
	v.mu.RLock()
	defer v.mu.RUnlock()
	byName := make(map[string][]actions.Entry, len(v.byName))
	for name, perKey := range v.byName {
		for _, e := range perKey {
			byName[name] = append(byName[name], e)
		}
	}
	return resolvedList(byName)
}

// ListForPlanner returns the entries of the view a planner may choose for
// a run of tenant: planner-visible and hosted for the tenant, sorted by
// name. It is the source of truth for what a planner may choose.
func (v *View) ListForPlanner(tenant string) []actions.Entry {
	all := v.List()
	out := all[:0]
	for _, e := range all {
		if e.PlannerVisible() && e.ServesTenant(tenant) {
			out = append(out, e)
		}
	}
	return out
}
