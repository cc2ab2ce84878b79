package run

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/internal/policy"
)

func hashOf(t *testing.T, v map[string]any) string {
	t.Helper()
	h, err := policy.InputHash(v)
	require.NoError(t, err)
	return h
}

func TestAnApprovalNamesOnlyTheDryRunOfItsOwnInput(t *testing.T) {
	a := map[string]any{"jobIds": []any{"A"}}
	abc := map[string]any{"jobIds": []any{"A", "B", "C"}}
	hA, hABC := hashOf(t, a), hashOf(t, abc)
	runs := []DryRun{{Action: "delivery.dryRunRetry", InputHash: hA}}
	for _, tc := range []struct {
		name  string
		runs  []DryRun
		args  map[string]any
		match bool
	}{
		{"no dry run", nil, map[string]any{"jobIds": []any{"A"}, "dryRunHash": hA}, false},
		{"the dry-run input, naming its hash", runs, map[string]any{"jobIds": []any{"A"}, "dryRunHash": hA}, true},
		{"the dry-run input, naming no hash", runs, map[string]any{"jobIds": []any{"A"}}, true},
		{"more jobs than were dry-run, naming the dry run's hash", runs, map[string]any{"jobIds": []any{"A", "B", "C"}, "dryRunHash": hA}, false},
		{"the dry-run input, naming another hash", append(runs, DryRun{Action: "delivery.dryRunRetry", InputHash: hABC}),
			map[string]any{"jobIds": []any{"A"}, "dryRunHash": hABC}, false},
		{"another key changed", runs, map[string]any{"jobIds": []any{"A"}, "force": true, "dryRunHash": hA}, false},
		{"a null kept in the input is not the dry run's", runs, map[string]any{"jobIds": []any{"A"}, "note": nil, "dryRunHash": hA}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, ok := matchDryRun(tc.runs, tc.args)
			assert.Equal(t, tc.match, ok)
			if tc.match {
				assert.Equal(t, hA, d.InputHash)
				assert.Equal(t, "delivery.dryRunRetry", d.Action)
			}
		})
	}
}

func TestDryRunsAreKeptPerActionAndInputNewestLast(t *testing.T) {
	var runs []DryRun
	for i := range MaxDryRuns + 5 {
		runs = recordDryRun(runs, DryRun{Action: "a", InputHash: fmt.Sprint(i)})
	}
	require.Len(t, runs, MaxDryRuns)
	assert.Equal(t, "5", runs[0].InputHash, "the oldest went first")
	runs = recordDryRun(runs, DryRun{Action: "a", InputHash: "10"})
	require.Len(t, runs, MaxDryRuns, "recorded once")
	assert.Equal(t, DryRun{Action: "a", InputHash: "10"}, runs[len(runs)-1], "moved to the newest")
	runs = recordDryRun(runs, DryRun{Action: "b", InputHash: "10"})
	assert.Equal(t, DryRun{Action: "a", InputHash: "10"}, runs[len(runs)-2], "another action's dry run of the same input is its own")
}
