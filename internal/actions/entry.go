package actions

import "time"

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
