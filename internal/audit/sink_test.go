package audit_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/audit"
)

// A crash while a multi-record message was written leaves some of its
// lines: they are cut off on open, so the redelivered message is written
// whole, and the messages before it stay.
func TestAJSONLSinkCutsOffAMessageWrittenInPart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	sink, err := audit.OpenJSONL(path)
	require.NoError(t, err)
	ctx := context.Background()
	recs := func(ids ...string) []events.AuditRecorded {
		var out []events.AuditRecorded
		for _, id := range ids {
			out = append(out, events.AuditRecorded{RunID: "R", EventID: id, Kind: "run"})
		}
		return out
	}
	require.NoError(t, sink.Write(ctx, 1, recs("a")))
	require.NoError(t, sink.Write(ctx, 2, recs("b", "c", "d")))
	require.NoError(t, sink.Write(ctx, 3, recs("e", "f")))
	require.NoError(t, sink.Close())

	whole, err := os.ReadFile(path)
	require.NoError(t, err)
	lines := strings.SplitAfter(string(whole), "\n")
	require.Len(t, lines, 7) // six records and the empty rest
	// The crash: message 3's first line and half of its second are on disk.
	torn := strings.Join(lines[:5], "") + lines[5][:10]
	require.NoError(t, os.WriteFile(path, []byte(torn), 0o600))

	sink, err = audit.OpenJSONL(path)
	require.NoError(t, err)
	last, err := sink.Last(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(2), last, "message 3 is not stored")
	require.NoError(t, sink.Write(ctx, 3, recs("e", "f")))
	require.NoError(t, sink.Write(ctx, 2, recs("b", "c", "d")), "a message stored before is ignored")
	require.NoError(t, sink.Close())

	got, err := audit.ReadJSONL(path, "R")
	require.NoError(t, err)
	var ids []string
	for _, r := range got {
		ids = append(ids, r.EventID)
	}
	assert.Equal(t, []string{"a", "b", "c", "d", "e", "f"}, ids)
	assert.Equal(t, 1, got[2].Index)
	assert.Equal(t, 3, got[2].Of)
}

// A SQLite sink of one record per stream sequence (before appends held
// several) is moved aside; the sink copies the stream again from its start.
func TestASQLiteSinkFromBeforeBatchesStartsOver(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.db")
	old, err := audit.OpenSQLite(path)
	require.NoError(t, err)
	require.NoError(t, old.Close())
	// Replace the table by the old shape, with one record stored.
	db := openDB(t, path)
	_, err = db.Exec(`DROP TABLE audit_records; CREATE TABLE audit_records (stream_seq INTEGER PRIMARY KEY, run_id TEXT NOT NULL, event_id TEXT NOT NULL,
		event_type TEXT NOT NULL, kind TEXT NOT NULL, status TEXT, action TEXT, user_id TEXT, event_time TEXT NOT NULL, hash TEXT NOT NULL, record TEXT NOT NULL);
		INSERT INTO audit_records VALUES (7, 'R', 'a', 't', 'run', '', '', '', '2026-12-01T00:00:00Z', 'h', '{}');`)
	require.NoError(t, err)
	require.NoError(t, db.Close())

	sink, err := audit.OpenSQLite(path)
	require.NoError(t, err)
	defer sink.Close()
	last, err := sink.Last(context.Background())
	require.NoError(t, err)
	assert.Zero(t, last, "the new table starts empty")
	require.NoError(t, sink.Write(context.Background(), 1, []events.AuditRecorded{{RunID: "R", EventID: "a", Kind: "run"}, {RunID: "R", EventID: "b", Kind: "run"}}))
	got, err := audit.ReadSQLite(context.Background(), path, "R")
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Equal(t, "b", got[1].EventID)
	assert.Equal(t, 1, got[1].Index)
}

func openDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	require.NoError(t, err)
	return db
}
