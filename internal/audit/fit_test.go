package audit_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/audit"
	"github.com/actionbus/actionbus/internal/bus"
)

const fitLimit = 64 << 10

func record() events.AuditRecorded {
	return events.AuditRecorded{RunID: "01JB0000000000000000000000", EventID: events.NewID(), EventType: events.TypeActionCompleted,
		EventSubject: "ab.run.default.01JB0000000000000000000000.action.completed", EventSource: "/actionbus/executor",
		EventTime: time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC), Kind: audit.KindAction, Status: "succeeded", Action: "page.render",
		PayloadModes: map[string]string{"output": "full"}, PayloadHash: strings.Repeat("a", 64)}
}

func encoded(t *testing.T, rec events.AuditRecorded) int {
	b, err := json.Marshal(rec)
	require.NoError(t, err)
	return len(b)
}

func TestFitBoundsARecordAndKeepsWhatItRecords(t *testing.T) {
	angle := strings.Repeat("<", 20_000) // 120 000 bytes once JSON escapes it
	for _, tc := range []struct {
		name    string
		change  func(*events.AuditRecorded)
		data    int
		check   func(t *testing.T, rec events.AuditRecorded)
		changed bool
	}{
		{name: "a small record is kept whole", change: func(r *events.AuditRecorded) { r.Output = map[string]any{"ok": true} }, data: 100,
			check: func(t *testing.T, rec events.AuditRecorded) {
				assert.Equal(t, map[string]any{"ok": true}, rec.Output)
			}},
		{name: "an output JSON escapes past the bound is hashed", change: func(r *events.AuditRecorded) { r.Output = angle }, data: 20_000, changed: true,
			check: func(t *testing.T, rec events.AuditRecorded) {
				out := rec.Output.(map[string]any)
				assert.Len(t, out["hash"], 64)
				assert.Greater(t, out["bytes"], 100_000, "the size of the payload as encoded")
				assert.Equal(t, audit.ModeOversize, rec.PayloadModes["output"])
				assert.Equal(t, "succeeded", rec.Status, "the record still says what happened")
			}},
		{name: "every payload is hashed", change: func(r *events.AuditRecorded) {
			r.Input, r.Error, r.Policy = angle, map[string]any{"message": angle}, []any{angle}
		}, data: 60_000, changed: true,
			check: func(t *testing.T, rec events.AuditRecorded) {
				for _, f := range []string{"input", "error", "policy"} {
					assert.Equal(t, audit.ModeOversize, rec.PayloadModes[f], f)
				}
			}},
		{name: "long strings keep their head and their hash", change: func(r *events.AuditRecorded) {
			r.Summary, r.UserID = strings.Repeat("é", 50_000), strings.Repeat("u", 70_000)
		}, data: 170_000, changed: true,
			check: func(t *testing.T, rec events.AuditRecorded) {
				assert.True(t, strings.HasPrefix(rec.Summary, "éé"))
				assert.Contains(t, rec.Summary, "[100000 bytes, sha256 ")
				assert.Contains(t, rec.UserID, "[70000 bytes, sha256 ")
				assert.NotEqual(t, rec.Summary, rec.UserID)
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := record()
			tc.change(&rec)
			before := rec
			size := audit.Fit(&rec, tc.data, fitLimit)
			got := encoded(t, rec)
			assert.LessOrEqual(t, got, fitLimit, "the record fits its bound")
			assert.LessOrEqual(t, got, size, "Fit's size bounds the encoding")
			assert.Equal(t, before.EventID, rec.EventID, "the record names its event")
			if !tc.changed {
				assert.Equal(t, before, rec)
			}
			tc.check(t, rec)
		})
	}
}

func TestStrippedKeepsTheEventAndDropsThePayloads(t *testing.T) {
	rec := record()
	rec.Output, rec.Summary = strings.Repeat("x", 1<<20), "fine"
	s := audit.Stripped(rec, bus.Permanent(assert.AnError))
	assert.Nil(t, s.Output)
	assert.Equal(t, rec.EventID, s.EventID)
	assert.Equal(t, rec.Kind, s.Kind)
	assert.Equal(t, "stripped", s.PayloadModes["record"])
	assert.Less(t, encoded(t, s), 4<<10)
}

// FuzzFit: whatever strings and payloads an event brings, its record fits
// the bound, and Fit's answer bounds its encoding.
func FuzzFit(f *testing.F) {
	f.Add("<>&", 1000, 3, "summary")
	f.Add(strings.Repeat("\u2028", 10), 70_000, 1, strings.Repeat("s", 600))
	f.Fuzz(func(t *testing.T, s string, repeat, fields int, summary string) {
		if repeat < 0 || repeat > 200_000 || len(s) > 64 || len(summary) > 200_000 {
			return
		}
		big := strings.Repeat(s, repeat)
		rec := record()
		rec.Summary, rec.Output = summary, big
		if fields%2 == 1 {
			rec.Input = map[string]any{"k": big}
		}
		if fields%3 == 1 {
			rec.UserID, rec.StepID = big, summary
		}
		size := audit.Fit(&rec, 2*len(big)+len(summary), fitLimit)
		got := encoded(t, rec)
		if got > fitLimit || got > size {
			t.Fatalf("record of %d bytes, Fit said %d, limit %d", got, size, fitLimit)
		}
	})
}
