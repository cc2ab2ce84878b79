package planner

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus/internal/actions"
)

// TestAliasesComeFromTheCatalog: a name is repaired only through the
// aliases an action declares in its planner metadata, never through names
// the planner knows by itself.
func TestAliasesComeFromTheCatalog(t *testing.T) {
	declared := newCatalogIndex([]actions.Entry{{Definition: actions.Definition{Name: "web_search", Planner: &actions.PlannerMeta{Aliases: []string{"search"}}}}})
	assert.Equal(t, "web_search", declared.aliases["search"])
	undeclared := newCatalogIndex([]actions.Entry{{Definition: actions.Definition{Name: "web_search"}}})
	assert.Empty(t, undeclared.aliases, "no built-in alias table")
}
