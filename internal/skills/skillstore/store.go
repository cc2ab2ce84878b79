// Package skillstore keeps skills (package skills) in the catalog
// bucket, beside the actions, under keys no action can have
// ([skills.Key]). Package skills defines and validates a skill and links
// no NATS; this package reads and writes the bucket.
package skillstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
	"github.com/actionbus/actionbus/internal/skills"
)

// Publish stores a skill (with its pool) in the catalog bucket; a value
// equal to the stored one is not rewritten.
func Publish(ctx context.Context, kv jetstream.KeyValue, s skills.Skill) error {
	if err := s.Validate(); err != nil {
		return err
	}
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if cur, err := kv.Get(ctx, skills.Key(s.Pool, s.Name)); err == nil && bytes.Equal(cur.Value(), b) {
		return nil // unchanged: not rewritten
	}
	if _, err := kv.Put(ctx, skills.Key(s.Pool, s.Name), b); err != nil {
		return fmt.Errorf("skills: publish %s: %w", s.Name, err)
	}
	return nil
}

// Get returns the named skill from the catalog bucket (the first pool's by
// name, when several pools host it).
func Get(ctx context.Context, kv jetstream.KeyValue, name string) (*skills.Skill, error) {
	if !skills.ValidName(name) {
		return nil, actionbus.Errorf(actionbus.CodeSkillNotFound, "skill %q is not in the catalog", clip(name))
	}
	found, err := list(ctx, kv, "*."+actions.SkillKeyMarker+"."+name)
	if err != nil {
		return nil, err
	}
	if len(found) == 0 {
		return nil, actionbus.Errorf(actionbus.CodeSkillNotFound, "skill %q is not in the catalog", name).WithDetail("skillName", name)
	}
	return &found[0], nil
}

// List returns every skill of the catalog bucket, sorted by name.
func List(ctx context.Context, kv jetstream.KeyValue) ([]skills.Skill, error) {
	return list(ctx, kv, "*."+actions.SkillKeyMarker+".*")
}

func list(ctx context.Context, kv jetstream.KeyValue, filter string) ([]skills.Skill, error) {
	lister, err := kv.ListKeysFiltered(ctx, filter)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("skills: list: %w", err)
	}
	var out []skills.Skill
	for key := range lister.Keys() {
		kve, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("skills: %s: %w", key, err)
		}
		var s skills.Skill
		// A value that does not decode, or names another pool or skill
		// than its key, is not a skill this key may hold.
		if json.Unmarshal(kve.Value(), &s) != nil || skills.Key(s.Pool, s.Name) != key {
			continue
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Pool < out[j].Pool
	})
	return out, nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
