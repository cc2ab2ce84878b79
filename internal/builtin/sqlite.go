package builtin

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	_ "modernc.org/sqlite" // the pure-Go SQLite driver "sqlite"

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
// twice over: the connection is opened read-only with query_only on, and
// the statement is checked to be one SELECT before it runs.
type SQLiteQuery struct {
	db       *sql.DB
	maxRows  int
	maxBytes int
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
	dsn := "file:" + url.PathEscape(path) + "?mode=ro&_pragma=query_only(1)&_pragma=busy_timeout(5000)"
	db, err := sql.Open("sqlite", dsn)
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
	rows, err := q.db.QueryContext(ctx, in.SQL, in.Params...)
	if err != nil {
		return SQLiteResult{}, actionbus.Errorf(actionbus.CodeSQLRefused, "the query failed: %v", err)
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
		return SQLiteResult{}, actionbus.Errorf(actionbus.CodeSQLRefused, "the query failed: %v", err)
	}
	out.RowCount = len(out.Rows)
	return out, nil
}
