package actions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus"
)

// Entry is one action of the shared catalog.
type Entry struct {
	Definition
	// Hash is Definition.Hash().
	Hash string `json:"hash"`
	// PublishedAt is when an executor last published the entry.
	PublishedAt time.Time `json:"publishedAt"`
	// PublishedBy is the id of that executor.
	PublishedBy string `json:"publishedBy"`
}

// Catalog reads and writes the catalog bucket. Keys are action names.
type Catalog struct {
	kv jetstream.KeyValue
}

// NewCatalog returns a catalog over kv.
func NewCatalog(kv jetstream.KeyValue) *Catalog { return &Catalog{kv: kv} }

// Publish writes def to the catalog. Publishing the same name and version
// with the same hash refreshes the entry; with another hash it fails with
// catalog_conflict (two executors disagree on what the action is); a new
// version replaces the old one. Concurrent publishers are serialized by the
// bucket's revisions.
func (c *Catalog) Publish(ctx context.Context, def Definition, executorID string) error {
	entry := Entry{Definition: def, Hash: def.Hash(), PublishedAt: time.Now().UTC(), PublishedBy: executorID}
	val, err := json.Marshal(entry)
	if err != nil {
		return err
	}
	for attempt := 0; attempt < 10; attempt++ {
		cur, err := c.kv.Get(ctx, def.Name)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			if _, err := c.kv.Create(ctx, def.Name, val); err == nil {
				return nil
			} else if !errors.Is(err, jetstream.ErrKeyExists) {
				return fmt.Errorf("actions: publish %s: %w", def.Name, err)
			}
			continue
		case err != nil:
			return fmt.Errorf("actions: publish %s: %w", def.Name, err)
		}
		var old Entry
		if err := json.Unmarshal(cur.Value(), &old); err == nil && old.Version == def.Version && old.Hash != entry.Hash {
			return actionbus.Errorf(actionbus.CodeCatalogConflict,
				"action %q version %s is already in the catalog with another definition (hash %s, published by %s, pool %s); bump the version to replace it",
				def.Name, def.Version, old.Hash[:12], old.PublishedBy, old.Pool)
		}
		if _, err := c.kv.Update(ctx, def.Name, val, cur.Revision()); err == nil {
			return nil
		} else if !isRevisionConflict(err) {
			return fmt.Errorf("actions: publish %s: %w", def.Name, err)
		}
	}
	return fmt.Errorf("actions: publish %s: too many concurrent updates", def.Name)
}

// Get returns the catalog entry of an action, or an error matching
// actionbus.ErrActionNotFound.
func (c *Catalog) Get(ctx context.Context, name string) (*Entry, error) {
	kve, err := c.kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
		return nil, actionbus.Errorf(actionbus.CodeActionNotFound, "action %q is not in the catalog", name)
	}
	if err != nil {
		return nil, fmt.Errorf("actions: catalog get %s: %w", name, err)
	}
	var e Entry
	if err := json.Unmarshal(kve.Value(), &e); err != nil {
		return nil, fmt.Errorf("actions: catalog entry %s: %w", name, err)
	}
	return &e, nil
}

// List returns every entry, sorted by name.
func (c *Catalog) List(ctx context.Context) ([]Entry, error) {
	lister, err := c.kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	defer lister.Stop()
	var out []Entry
	for k := range lister.Keys() {
		e, err := c.Get(ctx, k)
		if err != nil {
			if errors.Is(err, actionbus.ErrActionNotFound) {
				continue
			}
			return nil, err
		}
		out = append(out, *e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func isRevisionConflict(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) ||
		(errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence)
}

// View is a live, in-memory copy of the catalog kept current by a bucket
// watch. It is safe for concurrent use.
type View struct {
	cat     *Catalog
	mu      sync.RWMutex
	entries map[string]Entry
}

// Watch starts a View that follows the catalog until ctx ends. It returns
// once the current content is loaded.
func (c *Catalog) Watch(ctx context.Context) (*View, error) {
	w, err := c.kv.WatchAll(ctx)
	if err != nil {
		return nil, fmt.Errorf("actions: watch catalog: %w", err)
	}
	v := &View{cat: c, entries: map[string]Entry{}}
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
	if kve.Operation() != jetstream.KeyValuePut {
		delete(v.entries, kve.Key())
		return
	}
	var e Entry
	if json.Unmarshal(kve.Value(), &e) == nil {
		v.entries[kve.Key()] = e
	}
}

// Get returns an entry. An action missing from the view is looked up in
// the bucket before it is reported missing, so an action published a moment
// ago is found. The error matches actionbus.ErrActionNotFound when the
// action is in neither.
func (v *View) Get(ctx context.Context, name string) (*Entry, error) {
	v.mu.RLock()
	e, ok := v.entries[name]
	v.mu.RUnlock()
	if ok {
		return &e, nil
	}
	return v.cat.Get(ctx, name)
}

// List returns the entries of the view, sorted by name.
func (v *View) List() []Entry {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make([]Entry, 0, len(v.entries))
	for _, e := range v.entries {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ListForPlanner returns the planner-visible entries of the view (hidden
// actions left out), sorted by name. It is the source of truth for what a
// planner may choose.
func (v *View) ListForPlanner() []Entry {
	all := v.List()
	out := all[:0]
	for _, e := range all {
		if e.PlannerVisible() {
			out = append(out, e)
		}
	}
	return out
}
