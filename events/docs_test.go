package events_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/schemas"
)

func TestCatalogMatchesDocs(t *testing.T) {
	b, err := os.ReadFile("../docs/events.md")
	require.NoError(t, err)
	doc := string(b)
	rows := 0
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "| `io.actionbus.") {
			rows++
		}
	}
	assert.Equal(t, len(events.Catalog), rows, "docs/events.md lists a different number of event types")
	for _, e := range events.Catalog {
		row := "| `" + e.Type + "` | `" + e.Subject + "` | " + e.Producer + " | " + strings.Join(e.Consumers, ", ") +
			" | [`schemas/" + e.Schema + "`](../schemas/" + e.Schema + ") |"
		assert.True(t, strings.Contains(doc, row), "docs/events.md has no row\n%s", row)
		_, err := schemas.FS.Open(e.Schema)
		assert.NoError(t, err, "schema file of %s", e.Type)
	}
	for _, c := range actionbus.Codes {
		assert.True(t, strings.Contains(doc, "| `"+string(c)+"` |"), "error code %s has no row in docs/events.md", c)
	}
}
