package actions

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/actionbus/actionbus/internal/canonical"
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

// CatalogKey returns the bucket key of an action of a pool.
func CatalogKey(pool, name string) string { return pool + "." + name }

// SkillKeyMarker is the token that marks a skill's key in the catalog
// bucket (<pool>.=skill.<name>): '=' is allowed in bucket keys and never
// in action names, so a skill's key never collides with an action's.
const SkillKeyMarker = "=skill"

// The members of an entry that its hash is not over.
var unhashed = []string{"hash", "publishedAt", "publishedBy"}

// EntryHash is the hash a catalog entry must carry, computed from its
// stored JSON as any language can: the lower-case hex SHA-256 over the
// RFC 8785 canonical JSON of the entry object without its hash,
// publishedAt and publishedBy members. For an entry the registrar wrote
// it equals Definition.Hash() (the entry's other members are exactly the
// definition's). The error is for a value that is not a JSON object.
func EntryHash(raw []byte) (string, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", fmt.Errorf("actions: entry hash: %w", err)
	}
	if obj == nil {
		return "", errors.New("actions: entry hash: not an object")
	}
	for _, k := range unhashed {
		delete(obj, k)
	}
	h, err := canonical.Hash(obj)
	if err != nil {
		return "", fmt.Errorf("actions: entry hash: %w", err)
	}
	return h, nil
}
