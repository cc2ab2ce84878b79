package process

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/client"
)

// TestLimitsHoldAcrossProcesses runs two dispatcher processes and two
// executor processes as the deployed users. test.limited allows 2 calls in
// flight per key: over 12 runs of key "a" and 4 of key "b", no key ever
// has more than 2 handlers running at once (the handlers record their
// intervals), and key b's runs finish while key a's queue is still long
// (not starved). test.rated allows 5 starts per second: 51 runs start at
// 5 per second within 10 % over 10 s.
func TestLimitsHoldAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts service processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	url, _ := deployedServer(t, ctx)
	bin := buildServices(t)
	dir := t.TempDir()
	startService(t, filepath.Join(bin, "dispatcher"), url("dispatcher"))
	startService(t, filepath.Join(bin, "dispatcher"), url("dispatcher"))
	exBin := buildTestExecutor(t)
	startTestExecutor(t, exBin, url("executor"), dir, "ex-1", "SLOTS=16")
	startTestExecutor(t, exBin, url("executor"), dir, "ex-2", "SLOTS=16")
	nc, _ := connectAs(t, url("client"), client.InboxPrefix("default"))
	c, err := client.New(nc, client.Options{})
	require.NoError(t, err)
	waitCatalog(t, ctx, c, "test.rated")

	runAll := func(n int, action string, args func(i int) map[string]any) []*client.Result {
		ids := make([]string, n)
		for i := range n {
			ids[i], err = c.Start(ctx, client.RunRequest{Action: &client.ActionCall{Name: action, Args: args(i)}})
			require.NoError(t, err)
		}
		results := make([]*client.Result, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				res, err := c.Wait(ctx, ids[i])
				if assert.NoError(t, err) {
					results[i] = res
				}
			})
		}
		wg.Wait()
		for i, r := range results {
			require.NotNil(t, r)
			require.Equal(t, client.StatusCompleted, r.Status, "run %d: %+v", i, r.Error)
		}
		return results
	}

	t.Run("maxInFlight per key", func(t *testing.T) {
		runAll(16, "test.limited", func(i int) map[string]any {
			if i%4 == 3 {
				return map[string]any{"key": "b"}
			}
			return map[string]any{"key": "a"}
		})
		type span struct{ start, end int64 }
		byKey := map[string][]span{}
		for _, line := range fileLines(t, filepath.Join(dir, "limited")) {
			f := strings.Fields(line)
			require.Len(t, f, 3)
			s, _ := strconv.ParseInt(f[1], 10, 64)
			e, _ := strconv.ParseInt(f[2], 10, 64)
			byKey[f[0]] = append(byKey[f[0]], span{s, e})
		}
		require.Len(t, byKey["a"], 12)
		require.Len(t, byKey["b"], 4)
		for key, spans := range byKey {
			most := 0
			for _, s := range spans {
				n := 0
				for _, o := range spans {
					if o.start <= s.start && s.start < o.end {
						n++
					}
				}
				most = max(most, n)
			}
			assert.LessOrEqual(t, most, 2, "key %s had %d handlers running at once", key, most)
			assert.Equal(t, 2, most, "key %s used both its slots", key)
		}
		lastEnd := func(spans []span) int64 {
			m := int64(0)
			for _, s := range spans {
				m = max(m, s.end)
			}
			return m
		}
		// Key a's 12 calls take at least 6 rounds of 300 ms; key b's 4
		// take 2 rounds, started as soon as they came.
		assert.Less(t, lastEnd(byKey["b"]), lastEnd(byKey["a"])-int64(time.Second), "key b waited behind key a")
	})

	t.Run("rate", func(t *testing.T) {
		runAll(51, "test.rated", func(int) map[string]any { return map[string]any{} })
		var starts []int64
		for _, line := range fileLines(t, filepath.Join(dir, "rated")) {
			n, err := strconv.ParseInt(line, 10, 64)
			require.NoError(t, err)
			starts = append(starts, n)
		}
		require.Len(t, starts, 51)
		sort.Slice(starts, func(i, j int) bool { return starts[i] < starts[j] })
		span := time.Duration(starts[50] - starts[0])
		rate := 50 / span.Seconds()
		t.Logf("51 starts over %s: %.2f per second (limit 5)", span.Round(time.Millisecond), rate)
		assert.InDelta(t, 5, rate, 0.5, "the rate holds within 10 %%")
		// No second holds more than the rate (and the burst of 1) allows.
		for i := range starts {
			n := 0
			for j := i; j < len(starts) && starts[j]-starts[i] < int64(time.Second); j++ {
				n++
			}
			assert.LessOrEqual(t, n, 6, "%d starts within one second", n)
		}
	})
}

// fileLines returns the non-empty lines of a file.
func fileLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}
