// Package actionstore reads, writes and watches the catalog bucket: the
// shared catalog of actions (package actions defines an action and links
// no NATS; this package is the JetStream side).
package actionstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/bus"
)

// Catalog reads and writes the catalog bucket. Keys are
// "<pool>.<action name>": an executor's NATS user may write only under its
// own pool's prefix, so no pool can redefine another pool's action (its
// mode, tier or pool). An entry whose Pool differs from its key's pool is
// ignored, and an action name published by two pools is refused with
// catalog_conflict rather than resolved in favour of either.
type Catalog struct {
	kv jetstream.KeyValue
}

// NewCatalog returns a catalog over kv.
func NewCatalog(kv jetstream.KeyValue) *Catalog { return &Catalog{kv: kv} }

// Publish writes def to the catalog under its pool. Publishing the same
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

// decodeEntry decodes the entry stored under key, or reports false when
// the entry is not one its key's pool may hold.
func decodeEntry(key string, val []byte) (actions.Entry, bool) {
	var e actions.Entry
	if json.Unmarshal(val, &e) != nil || e.Pool == "" || actions.CatalogKey(e.Pool, e.Name) != key {
		return actions.Entry{}, false
	}
	return e, true
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
	for key := range lister.Keys() {
		kve, err := c.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("actions: catalog get %s: %w", name, err)
		}
		if e, ok := decodeEntry(key, kve.Value()); ok && e.Name == name {
			found = append(found, e)
		}
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
		if e, ok := decodeEntry(key, kve.Value()); ok {
			byName[e.Name] = append(byName[e.Name], e)
		}
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

// View is a live, in-memory copy of the catalog kept current by a bucket
// watch. It is safe for concurrent use.
type View struct {
	cat     *Catalog
	mu      sync.RWMutex
	entries map[string]actions.Entry            // by bucket key
	byName  map[string]map[string]actions.Entry // action name → bucket key → entry
	skills  map[string]bool                     // skill keys (SkillKeyMarker) present
	seq     uint64                              // the bucket stream sequence applied last
	changed chan struct{}                       // closed (and replaced) when seq moves
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
	v := &View{cat: c, entries: map[string]actions.Entry{}, byName: map[string]map[string]actions.Entry{}, changed: make(chan struct{})}
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
				v.apply(kve)
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

func (v *View) apply(kve jetstream.KeyValueEntry) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if rev := kve.Revision(); rev > v.seq {
		v.seq = rev
		close(v.changed)
		v.changed = make(chan struct{})
	}
	key := kve.Key()
	if old, ok := v.entries[key]; ok {
		delete(v.entries, key)
		delete(v.byName[old.Name], key)
		if len(v.byName[old.Name]) == 0 {
			delete(v.byName, old.Name)
		}
	}
	if strings.Contains(key, "."+actions.SkillKeyMarker+".") {
		if v.skills == nil {
			v.skills = map[string]bool{}
		}
		if kve.Operation() == jetstream.KeyValuePut {
			v.skills[key] = true
		} else {
			delete(v.skills, key)
		}
		return
	}
	if kve.Operation() != jetstream.KeyValuePut {
		return
	}
	if e, ok := decodeEntry(key, kve.Value()); ok {
		v.entries[key] = e
		if v.byName[e.Name] == nil {
			v.byName[e.Name] = map[string]actions.Entry{}
		}
		v.byName[e.Name][key] = e
	}
}

// CatchUp waits until the view holds every write the bucket had stored
// when it was called (read-your-writes: an executor whose announcement the
// registrar acknowledged is listed), or until ctx ends or a second has
// passed — then the view is listed as it is. It creates no consumer: one
// stream info request.
func (v *View) CatchUp(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	st, err := v.cat.kv.Status(ctx)
	if err != nil {
		return
	}
	js, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return
	}
	last := js.StreamInfo().State.LastSeq
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

// Get returns an entry. An action missing from the view is looked up in
// the bucket before it is reported missing, so an action published a moment
// ago is found. The error matches actionbus.ErrActionNotFound when the
// action is in neither, and is catalog_conflict when several pools publish
// the name.
func (v *View) Get(ctx context.Context, name string) (*actions.Entry, error) {
	v.mu.RLock()
	found := make([]actions.Entry, 0, len(v.byName[name]))
	for _, e := range v.byName[name] {
		found = append(found, e)
	}
	v.mu.RUnlock()
	if len(found) > 0 {
		return resolve(name, found)
	}
	return v.cat.Get(ctx, name)
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
