package registrar

import (
	"fmt"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/actions"
)

// Bounds of what one pool records. One pool's catalog reaches every
// tenant's planner prompt and every skills listing, and the registrar's
// work per announcement is linear in its entries: the bounds keep both
// small whatever a pool announces.
const (
	// MaxPoolActions is the most actions one pool has in the catalog.
	MaxPoolActions = 256
	// MaxPoolSkills is the most skills one pool has in the catalog.
	MaxPoolSkills = 64
	// MaxAnnouncementBytes is the most bytes of an announcement's data.
	MaxAnnouncementBytes = 1 << 20
	// MaxEntryBytes is the most bytes of one action definition or skill
	// as announced (its JSON).
	MaxEntryBytes = 64 << 10
)

// limitError is catalog_limit_exceeded naming the limit.
func limitError(pool, limit string, max, got int) error {
	return (&actionbus.Error{Code: actionbus.CodeCatalogLimit,
		Message: fmt.Sprintf("pool %s is over the registrar's limit %s: %d, at most %d", pool, limit, got, max)}).
		WithDetail("limit", limit).WithDetail("max", max).WithDetail("got", got).WithDetail("pool", pool)
}

// CheckSize refuses an announcement of more than MaxAnnouncementBytes,
// before anything of it is decoded.
func CheckSize(pool string, n int) error {
	if n > MaxAnnouncementBytes {
		return limitError(pool, "announcement_bytes", MaxAnnouncementBytes, n)
	}
	return nil
}

// CheckCounts refuses an announcement listing more actions or skills than
// a pool may hold, before any entry is decoded.
func CheckCounts(pool string, nActions, nSkills int) error {
	if nActions > MaxPoolActions {
		return limitError(pool, "pool_actions", MaxPoolActions, nActions)
	}
	if nSkills > MaxPoolSkills {
		return limitError(pool, "pool_skills", MaxPoolSkills, nSkills)
	}
	return nil
}

// CheckPoolTotals refuses an announcement after which pool would hold
// more than MaxPoolActions actions or MaxPoolSkills skills: held are the
// names of the pool's entries in the catalog now, the announcement's
// names are added and its removed actions taken away.
func CheckPoolTotals(pool string, heldActions, heldSkills []string, ann *Announcement) error {
	acts := map[string]bool{}
	for _, n := range heldActions {
		acts[n] = true
	}
	for _, d := range ann.Actions {
		acts[d.Name] = true
	}
	for _, n := range ann.Removed {
		delete(acts, n)
	}
	if len(acts) > MaxPoolActions {
		return limitError(pool, "pool_actions", MaxPoolActions, len(acts))
	}
	sk := map[string]bool{}
	for _, n := range heldSkills {
		sk[n] = true
	}
	for _, s := range ann.Skills {
		sk[s.Name] = true
	}
	if len(sk) > MaxPoolSkills {
		return limitError(pool, "pool_skills", MaxPoolSkills, len(sk))
	}
	return nil
}

// Claims returns the tool names an action is called by, each once: the
// native tool name of its name and of each of its planner aliases
// (actions.ToolName, the form the planner offers and resolves). The
// registrar claims every one of them for the action's pool (kind
// KindTool), so no two pools' entries answer to one name a model can
// write, whether as written, as a tool name or as an alias.
func Claims(def actions.Definition) []string {
	out := []string{actions.ToolName(def.Name)}
	seen := map[string]bool{out[0]: true}
	if def.Planner != nil {
		for _, a := range def.Planner.Aliases {
			n := actions.ToolName(a)
			if n == "" || seen[n] {
				continue
			}
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}
