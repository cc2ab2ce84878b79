package audit

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	_ "modernc.org/sqlite" // the pure-Go SQLite driver "sqlite"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// Sink stores audit records durably, outside NATS. Each sink is fed by
// [RunSink] from its own durable consumer on the audit stream, in stream
// order; a sink that was down catches up from where it stopped. Writes
// must be idempotent per stream sequence, so a redelivered message's
// records are stored once.
type Sink interface {
	// Name names the sink's durable consumer ("sink-<name>").
	Name() string
	// Last returns the highest stream sequence stored, 0 when none.
	Last(ctx context.Context) (uint64, error)
	// Write stores the records of the audit message at stream sequence
	// seq (one append: one or more records, in chain order), all or none.
	Write(ctx context.Context, seq uint64, recs []events.AuditRecorded) error
	Close() error
}

// SinkRecord is a record as sinks store it: the audit record, the
// audit-stream sequence of the message that holds it and its index in that
// message's records.
type SinkRecord struct {
	StreamSeq uint64 `json:"streamSeq"`
	// Index is the record's place in its message's records, Of their
	// number (0 when the message held one record).
	Index int `json:"index,omitempty"`
	Of    int `json:"of,omitempty"`
	events.AuditRecorded
}

// RunSink copies the audit stream into sink until ctx ends. It reads with
// the sink's durable consumer, bus.SinkConsumer, which provisioning
// creates (the auditor creates no consumer; a sink whose consumer is
// missing is a missing_topology error naming the command). Records are
// taken one at a time, written, synced and only then acknowledged, so a
// record that fails is redelivered before any later one and "at or below
// the last stored sequence" always means "stored"; a stop between fetches
// leaves nothing pending, so a restarted sink resumes at once.
func RunSink(ctx context.Context, eb *bus.Bus, topo bus.Topology, sink Sink) error {
	js := eb.JetStream()
	name := bus.SinkConsumer(sink.Name())
	cons, err := js.Consumer(ctx, topo.StreamAudit(), name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		// Check's error names what is missing and how to create it.
		err = topo.Check(ctx, js, bus.Requirements{Consumers: []bus.ConsumerSpec{{Stream: topo.StreamAudit(), Config: jetstream.ConsumerConfig{Durable: name}}}})
	}
	if err != nil {
		return fmt.Errorf("audit: sink %s: %w", sink.Name(), err)
	}
	last, err := sink.Last(ctx)
	if err != nil {
		return fmt.Errorf("audit: sink %s: %w", sink.Name(), err)
	}
	// Writes finish even when ctx ends mid-record.
	wctx := context.WithoutCancel(ctx)
	for ctx.Err() == nil {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return fmt.Errorf("audit: sink %s: %w", sink.Name(), err)
		}
		for msg := range batch.Messages() {
			seq, werr := store(wctx, eb, sink, msg, last)
			if werr != nil {
				_ = msg.NakWithDelay(time.Second)
				continue
			}
			last = max(last, seq)
			_ = msg.Ack()
		}
	}
	return nil
}

// store writes one audit message unless it is stored already, returning
// its stream sequence.
func store(ctx context.Context, eb *bus.Bus, sink Sink, msg jetstream.Msg, last uint64) (uint64, error) {
	md, err := msg.Metadata()
	if err != nil {
		return 0, err
	}
	seq := md.Sequence.Stream
	if seq <= last {
		return seq, nil // stored before a restart or a lost ack
	}
	r, err := eb.Receive(msg.Subject(), msg.Headers(), msg.Data())
	if err == nil {
		var recs []events.AuditRecorded
		if recs, err = events.AuditRecordsOf(r); err == nil {
			return seq, sink.Write(ctx, seq, recs)
		}
	}
	// Not a valid record (the auditor never writes one): it goes to the
	// rejected stream with the reason, as every consumer's bad input does.
	return seq, eb.Reject(ctx, msg, "sink-"+sink.Name(), err)
}

// JSONLSink appends records to a JSON-lines file, one SinkRecord per line,
// synced to disk before the record is acknowledged.
type JSONLSink struct {
	mu   sync.Mutex
	f    *os.File
	last uint64
}

// OpenJSONL opens (or creates) a JSON-lines sink. What a crash mid-write
// left (a partial last line, or only some records of the last message) is
// cut off, so that message is written again when it is redelivered; the
// records before it stay.
func OpenJSONL(path string) (*JSONLSink, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	s := &JSONLSink{f: f}
	// good ends the last complete message; the lines after it belong to
	// the message at seq, of which seen records of of were read.
	var good, read int64
	var seq uint64
	seen, of := 0, 0
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadBytes('\n')
		if err == io.EOF {
			break // a line without its newline is incomplete
		}
		if err != nil {
			f.Close()
			return nil, err
		}
		read += int64(len(line))
		var rec SinkRecord
		if json.Unmarshal(line, &rec) != nil {
			continue
		}
		if rec.StreamSeq != seq {
			seq, seen, of = rec.StreamSeq, 0, max(rec.Of, 1)
		}
		if seen++; seen == of {
			good, s.last = read, max(s.last, seq)
		}
	}
	if err := f.Truncate(good); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(good, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	return s, nil
}

// Name implements Sink.
func (s *JSONLSink) Name() string { return "jsonl" }

// Last implements Sink.
func (s *JSONLSink) Last(context.Context) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last, nil
}

// Write implements Sink.
func (s *JSONLSink) Write(_ context.Context, seq uint64, recs []events.AuditRecorded) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if seq <= s.last {
		return nil
	}
	var lines []byte
	for i, rec := range recs {
		sr := SinkRecord{StreamSeq: seq, Index: i, AuditRecorded: rec}
		if len(recs) > 1 {
			sr.Of = len(recs)
		}
		b, err := json.Marshal(sr)
		if err != nil {
			return err
		}
		lines = append(append(lines, b...), '\n')
	}
	// One write: a crash leaves at most a torn last line, which the next
	// open cuts off.
	if _, err := s.f.Write(lines); err != nil {
		return err
	}
	if err := s.f.Sync(); err != nil {
		return err
	}
	s.last = seq
	return nil
}

// Close implements Sink.
func (s *JSONLSink) Close() error { return s.f.Close() }

// ReadJSONL returns the records of a run (every run when runID is "")
// from a JSON-lines sink file, in stream order.
func ReadJSONL(path, runID string) ([]SinkRecord, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []SinkRecord
	for i, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var rec SinkRecord
		if err := json.Unmarshal(line, &rec); err != nil {
			return nil, fmt.Errorf("audit: %s line %d: %w", path, i+1, err)
		}
		if runID == "" || rec.RunID == runID {
			out = append(out, rec)
		}
	}
	return out, nil
}

// SQLiteSink stores records in a SQLite database (pure-Go driver), one row
// per record (keyed by stream sequence and index in its message); the
// record's JSON is kept whole so the chain can be recomputed.
type SQLiteSink struct {
	db *sql.DB
}

const sqliteSchema = `
CREATE TABLE IF NOT EXISTS audit_records (
  stream_seq INTEGER NOT NULL,
  idx        INTEGER NOT NULL,
  run_id     TEXT NOT NULL,
  event_id   TEXT NOT NULL,
  event_type TEXT NOT NULL,
  kind       TEXT NOT NULL,
  status     TEXT,
  action     TEXT,
  user_id    TEXT,
  event_time TEXT NOT NULL,
  hash       TEXT NOT NULL,
  record     TEXT NOT NULL,
  PRIMARY KEY (stream_seq, idx)
);
CREATE INDEX IF NOT EXISTS audit_records_run ON audit_records (run_id, stream_seq, idx);`

// sqliteUpgrade moves a table of one record per stream sequence (before
// audit appends held several) aside; the sink then copies the audit
// stream again from its start, which holds both forms.
const sqliteUpgrade = `ALTER TABLE audit_records RENAME TO audit_records_v1;
DROP INDEX IF EXISTS audit_records_run;`

// OpenSQLite opens (or creates) a SQLite sink.
func OpenSQLite(path string) (*SQLiteSink, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=synchronous(FULL)")
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	var old int
	if err := db.QueryRow(`SELECT COUNT(*) FROM pragma_table_info('audit_records') WHERE name = 'stream_seq' AND pk = 1`).Scan(&old); err == nil && old == 1 {
		var hasIdx int
		_ = db.QueryRow(`SELECT COUNT(*) FROM pragma_table_info('audit_records') WHERE name = 'idx'`).Scan(&hasIdx)
		if hasIdx == 0 {
			if _, err := db.Exec(sqliteUpgrade); err != nil {
				db.Close()
				return nil, fmt.Errorf("audit: sqlite %s: upgrading: %w", path, err)
			}
		}
	}
	if _, err := db.Exec(sqliteSchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("audit: sqlite %s: %w", path, err)
	}
	return &SQLiteSink{db: db}, nil
}

// Name implements Sink.
func (s *SQLiteSink) Name() string { return "sqlite" }

// Last implements Sink.
func (s *SQLiteSink) Last(ctx context.Context) (uint64, error) {
	var last uint64
	err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(stream_seq), 0) FROM audit_records`).Scan(&last)
	return last, err
}

// Write implements Sink, in one transaction; a record already stored is
// ignored.
func (s *SQLiteSink) Write(ctx context.Context, seq uint64, recs []events.AuditRecorded) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	for i, rec := range recs {
		b, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO audit_records
		(stream_seq, idx, run_id, event_id, event_type, kind, status, action, user_id, event_time, hash, record)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			seq, i, rec.RunID, rec.EventID, rec.EventType, rec.Kind, rec.Status, rec.Action, rec.UserID, rec.EventTime.Format("2006-01-02T15:04:05.000000000Z07:00"), rec.Hash, string(b)); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// Close implements Sink.
func (s *SQLiteSink) Close() error { return s.db.Close() }

// ReadSQLite returns the records of a run (every run when runID is "")
// from a SQLite sink, in stream order.
func ReadSQLite(ctx context.Context, path, runID string) ([]SinkRecord, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, err
	}
	s, err := OpenSQLite(path)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	q := `SELECT stream_seq, idx, record FROM audit_records WHERE (? = '' OR run_id = ?) ORDER BY stream_seq, idx`
	rows, err := s.db.QueryContext(ctx, q, runID, runID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []SinkRecord
	for rows.Next() {
		var rec SinkRecord
		var raw string
		if err := rows.Scan(&rec.StreamSeq, &rec.Index, &raw); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(raw), &rec.AuditRecorded); err != nil {
			return nil, fmt.Errorf("audit: sqlite row %d: %w", rec.StreamSeq, err)
		}
		out = append(out, rec)
	}
	return out, errors.Join(rows.Err())
}
