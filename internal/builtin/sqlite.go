package builtin

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/actionbus/actionbus"
)

// SQLiteArgs is the input of sqlite_query.
type SQLiteArgs struct {
	SQL     string `json:"sql" jsonschema:"description=One read-only SELECT (or WITH ... SELECT) statement."`
	Params  []any  `json:"params,omitempty" jsonschema:"description=Values for ? placeholders."`
	MaxRows int    `json:"maxRows,omitempty" jsonschema:"minimum=1,maximum=10000"`
}

// SQLiteResult is the output of sqlite_query.
type SQLiteResult struct {
	Columns   []string `json:"columns"`
	Rows      [][]any  `json:"rows"`
	RowCount  int      `json:"rowCount"`
	Truncated bool     `json:"truncated"`
}

// SQLiteQuery runs read-only queries on one database. It is read-only
// by construction: the connection is opened read-only with query_only on,
// and SQLite's authorizer admits only what a SELECT needs (reading
// tables, calling functions, recursive CTEs), so a pragma, or a pragma
// function such as pragma_database_list, is denied (sql_refused) however
// it is spelled; the statement is also checked to be one SELECT before it
// runs, for a clear message. Every query runs under SQLite's own bounds:
// no value longer than SQLiteMaxValueBytes (SQLITE_LIMIT_LENGTH), SQLite's
// heap under SQLiteHeapLimit, and the call's deadline, which interrupts the
// statement (sql_limit_exceeded, timeout).
type SQLiteQuery struct {
	db       *sql.DB
	maxRows  int
	maxBytes int
}

const (
	// SQLiteMaxValueBytes is the longest string or blob a sqlite_query may
	// build or read (SQLITE_LIMIT_LENGTH on its connections): 4 MiB. A
	// zeroblob(999999999) fails at once instead of allocating a gigabyte.
	SQLiteMaxValueBytes = 4 << 20
	// SQLiteHeapLimit is the hard heap limit sqlite_query sets for SQLite
	// (PRAGMA hard_heap_limit): 256 MiB. It is process-wide, shared with
	// any other SQLite database of the process (an audit SQLite sink), and
	// only ever lowers a limit already set.
	SQLiteHeapLimit = 256 << 20
	// SQLiteMaxColumns is the most columns a sqlite_query's result may
	// have (SQLITE_LIMIT_COLUMN): 128. With the length limit it bounds
	// what one row can hold before the result's byte limit is checked.
	SQLiteMaxColumns = 128
)

// sqliteQueryDriver is the SQLite driver of sqlite_query's connections,
// registered under a name of its own so that its connection hook (the
// heap limit and the authorizer) applies to them alone.
const sqliteQueryDriver = "actionbus-sqlite-query"

var registerQueryDriver = sync.OnceFunc(func() {
	drv := &sqlite.Driver{}
	drv.RegisterConnectionHook(func(c sqlite.ExecQuerierContext, _ string) error {
		if _, err := c.ExecContext(context.Background(), fmt.Sprintf("PRAGMA hard_heap_limit=%d", SQLiteHeapLimit), nil); err != nil {
			return err
		}
		reg, ok := c.(sqlite.AuthorizerRegisterer)
		if !ok {
			return errors.New("the SQLite driver has no authorizer")
		}
		return reg.RegisterAuthorizer(authorizeRead)
	})
	sql.Register(sqliteQueryDriver, drv)
})

// authorizeRead is the authorizer of sqlite_query's connections: what a
// read-only SELECT needs, and nothing else.
func authorizeRead(action sqlite.AuthorizerActionCode, _, _, _, _ string) sqlite.AuthorizerReturnCode {
	switch action {
	case sqlite.AuthSelect, sqlite.AuthRead, sqlite.AuthFunction, sqlite.AuthRecursive:
		return sqlite.AuthorizerOK
	}
	return sqlite.AuthorizerDeny
}

// OpenSQLiteQuery opens path read-only. maxRows and maxBytes bound every
// result (defaults 500 rows, 200 000 bytes).
func OpenSQLiteQuery(path string, maxRows, maxBytes int) (*SQLiteQuery, error) {
	if maxRows <= 0 {
		maxRows = 500
	}
	if maxBytes <= 0 {
		maxBytes = 200000
	}
	registerQueryDriver()
	dsn := "file:" + url.PathEscape(path) + "?mode=ro&_pragma=query_only(1)&_pragma=busy_timeout(5000)"
	db, err := sql.Open(sqliteQueryDriver, dsn)
	if err != nil {
		return nil, err
	}
	if err := db.Ping(); err != nil {
		db.Close()
		return nil, fmt.Errorf("builtin: sqlite %s: %w", path, err)
	}
	return &SQLiteQuery{db: db, maxRows: maxRows, maxBytes: maxBytes}, nil
}

// Close closes the database.
func (q *SQLiteQuery) Close() error { return q.db.Close() }

var (
	sqlReadOnly = regexp.MustCompile(`(?i)^\s*(select|with|values)\b`)
	sqlWrites   = regexp.MustCompile(`(?i)\b(insert|update|delete|replace|create|drop|alter|attach|detach|pragma|vacuum|reindex|analyze|begin|commit|rollback|savepoint|release)\b`)
)

// stripSQL blanks out string literals, quoted identifiers and comments,
// so that the checks below see only keywords and punctuation.
func stripSQL(stmt string) string {
	var b strings.Builder
	for i := 0; i < len(stmt); i++ {
		c := stmt[i]
		switch {
		case c == '\'' || c == '"' || c == '`' || c == '[':
			end := c
			if c == '[' {
				end = ']'
			}
			j := i + 1
			for ; j < len(stmt); j++ {
				if stmt[j] == end {
					if end != ']' && j+1 < len(stmt) && stmt[j+1] == end { // doubled quote
						j++
						continue
					}
					break
				}
			}
			b.WriteString("''")
			i = j
		case c == '-' && i+1 < len(stmt) && stmt[i+1] == '-':
			for i < len(stmt) && stmt[i] != '\n' {
				i++
			}
			b.WriteByte(' ')
		case c == '/' && i+1 < len(stmt) && stmt[i+1] == '*':
			end := strings.Index(stmt[i+2:], "*/")
			if end < 0 {
				i = len(stmt)
			} else {
				i += end + 3
			}
			b.WriteByte(' ')
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// checkSQL accepts one read-only statement.
func checkSQL(stmt string) error {
	bare := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(stripSQL(stmt)), ";"))
	switch {
	case bare == "":
		return actionbus.Errorf(actionbus.CodeSQLRefused, "the statement is empty")
	case strings.Contains(bare, ";"):
		return actionbus.Errorf(actionbus.CodeSQLRefused, "one statement at a time")
	case !sqlReadOnly.MatchString(bare):
		return actionbus.Errorf(actionbus.CodeSQLRefused, "only SELECT queries are allowed")
	}
	if m := sqlWrites.FindString(bare); m != "" {
		return actionbus.Errorf(actionbus.CodeSQLRefused, "%s is not allowed in a read-only query", strings.ToUpper(m))
	}
	return nil
}

// Query runs one checked statement.
func (q *SQLiteQuery) Query(ctx context.Context, in SQLiteArgs) (SQLiteResult, error) {
	if err := checkSQL(in.SQL); err != nil {
		return SQLiteResult{}, err
	}
	limit := q.maxRows
	if in.MaxRows > 0 && in.MaxRows < limit {
		limit = in.MaxRows
	}
	// No value may be longer than the result may be (a wide row of values
	// each under 4 MiB would otherwise be built, copied and encoded before
	// the result's byte limit saw it: gigabytes, past the deadline).
	valueLimit := min(SQLiteMaxValueBytes, q.maxBytes)
	conn, err := q.db.Conn(ctx)
	if err != nil {
		return SQLiteResult{}, queryError(ctx, err, valueLimit)
	}
	defer conn.Close()
	// The limits are the connection's: set on the one this query runs on.
	if _, err := sqlite.Limit(conn, sqlite3.SQLITE_LIMIT_LENGTH, valueLimit); err != nil {
		return SQLiteResult{}, err
	}
	if _, err := sqlite.Limit(conn, sqlite3.SQLITE_LIMIT_COLUMN, SQLiteMaxColumns); err != nil {
		return SQLiteResult{}, err
	}
	rows, err := conn.QueryContext(ctx, in.SQL, in.Params...)
	if err != nil {
		return SQLiteResult{}, queryError(ctx, err, valueLimit)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return SQLiteResult{}, err
	}
	out := SQLiteResult{Columns: cols, Rows: [][]any{}}
	size := 0
	for rows.Next() {
		if len(out.Rows) == limit {
			out.Truncated = true
			break
		}
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return SQLiteResult{}, err
		}
		// The row's text and blobs, counted before they are copied or
		// encoded: a row over the result's budget ends it here.
		raw := 0
		for _, v := range vals {
			switch v := v.(type) {
			case []byte:
				raw += len(v)
			case string:
				raw += len(v)
			}
		}
		if size+raw > q.maxBytes {
			out.Truncated = true
			break
		}
		for i, v := range vals {
			if b, ok := v.([]byte); ok {
				vals[i] = string(b)
			}
		}
		b, _ := json.Marshal(vals)
		if size += len(b); size > q.maxBytes {
			out.Truncated = true
			break
		}
		out.Rows = append(out.Rows, vals)
	}
	if err := rows.Err(); err != nil {
		return SQLiteResult{}, queryError(ctx, err, valueLimit)
	}
	out.RowCount = len(out.Rows)
	return out, nil
}

// queryError is the typed error of a query SQLite refused or stopped: a
// limit it hit (sql_limit_exceeded, naming the limit), a statement its
// authorizer denied (sql_refused), the call's deadline or cancellation
// (timeout, canceled), any other failure (sql_refused).
func queryError(ctx context.Context, err error, valueLimit int) *actionbus.Error {
	var sqlErr *sqlite.Error
	code := 0
	if errors.As(err, &sqlErr) {
		code = sqlErr.Code() & 0xff // the primary result code
	}
	switch {
	case code == sqlite3.SQLITE_TOOBIG:
		return actionbus.Errorf(actionbus.CodeSQLLimit, "a value would be longer than the %d-byte length limit (SQLITE_LIMIT_LENGTH)", valueLimit).
			WithDetail("limit", "SQLITE_LIMIT_LENGTH").WithDetail("bytes", valueLimit)
	case code == sqlite3.SQLITE_NOMEM:
		return actionbus.Errorf(actionbus.CodeSQLLimit, "the query needs more than SQLite's %d-byte heap limit", SQLiteHeapLimit).
			WithDetail("limit", "hard_heap_limit").WithDetail("bytes", SQLiteHeapLimit)
	case code == sqlite3.SQLITE_AUTH:
		return actionbus.Errorf(actionbus.CodeSQLRefused, "the query uses what a read-only query may not (a pragma or pragma function, a write): %v", err)
	case errors.Is(err, context.DeadlineExceeded), code == sqlite3.SQLITE_INTERRUPT && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return actionbus.Errorf(actionbus.CodeTimeout, "the query ran past its deadline and was interrupted")
	case errors.Is(err, context.Canceled), code == sqlite3.SQLITE_INTERRUPT:
		return actionbus.Errorf(actionbus.CodeCanceled, "the query was canceled and interrupted")
	}
	return actionbus.Errorf(actionbus.CodeSQLRefused, "the query failed: %v", err)
}
