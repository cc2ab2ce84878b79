package run

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestEveryStepIsDocumented: docs/events.md lists every progress step.
func TestEveryStepIsDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/events.md")
	require.NoError(t, err)
	doc := string(b)
	for _, n := range StepNames {
		assert.True(t, strings.Contains(doc, "| `"+string(n)+"` |"), "step %s has no row in docs/events.md", n)
	}
}
