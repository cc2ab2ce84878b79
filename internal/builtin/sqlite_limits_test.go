package builtin_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/client"
	"github.com/actionbus/actionbus/executor"
	"github.com/actionbus/actionbus/internal/builtin"
)

func shopDB(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "shop.db")
	db, err := sql.Open("sqlite", path)
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT, total REAL);
		INSERT INTO orders (customer, total) VALUES ('ada', 12.5), ('bob', 7);`)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	return path
}

const (
	zeroblobBomb   = "SELECT length(zeroblob(999999999) || x'00')"
	randomblobBomb = "SELECT length(randomblob(999999999))"
)

// A blob bomb is stopped by SQLite's length limit, at once, with a typed
// error naming the limit: the deadline is long, so an answer other than
// sql_limit_exceeded (a timeout, or success) means the allocation ran.
func TestSQLiteBlobBombsHitTheLengthLimit(t *testing.T) {
	q, err := builtin.OpenSQLiteQuery(shopDB(t), 0, 0)
	require.NoError(t, err)
	defer q.Close()
	for _, stmt := range []string{zeroblobBomb, randomblobBomb,
		"SELECT length(group_concat(zeroblob(1000000))) FROM (WITH RECURSIVE r(i) AS (SELECT 0 UNION ALL SELECT i+1 FROM r WHERE i < 100) SELECT i FROM r)"} {
		t.Run(stmt, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err := q.Query(ctx, builtin.SQLiteArgs{SQL: stmt})
			assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeSQLLimit})
			var abErr *actionbus.Error
			require.ErrorAs(t, err, &abErr)
			assert.Equal(t, "SQLITE_LIMIT_LENGTH", abErr.Details["limit"])
		})
	}

	// Four at once (the review's 7.7 GB): each is refused by the limit.
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, errs[i] = q.Query(ctx, builtin.SQLiteArgs{SQL: zeroblobBomb})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeSQLLimit})
	}

	res, err := q.Query(context.Background(), builtin.SQLiteArgs{SQL: "SELECT length(zeroblob(1000))"})
	require.NoError(t, err, "values under the limit are fine")
	assert.Equal(t, [][]any{{int64(1000)}}, res.Rows)
}

// TestASQLiteWideRowIsBoundedBeforeItIsCopied: a row of many values, each
// under 4 MiB, was built, copied twice and JSON-encoded before the
// result's byte limit saw it (60 columns: 5 GB, 17 s against a 1 s
// deadline). No value may now be longer than the result may be, rows have
// at most 128 columns, and a row's text and blobs are counted before they
// are copied.
func TestASQLiteWideRowIsBoundedBeforeItIsCopied(t *testing.T) {
	q, err := builtin.OpenSQLiteQuery(shopDB(t), 0, 0)
	require.NoError(t, err)
	defer q.Close()
	columns := func(n int, value string) string {
		cols := make([]string, n)
		for i := range cols {
			cols[i] = fmt.Sprintf("%s AS c%d", value, i)
		}
		return "SELECT " + strings.Join(cols, ", ")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	_, err = q.Query(ctx, builtin.SQLiteArgs{SQL: columns(16, "zeroblob(4000000)")})
	assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeSQLLimit}, "values of 4 MB each were built for a 200 kB result")

	res, err := q.Query(ctx, builtin.SQLiteArgs{SQL: columns(16, "zeroblob(150000)")})
	require.NoError(t, err)
	assert.True(t, res.Truncated, "a row over the result's byte limit ends the result")
	assert.Zero(t, res.RowCount)

	_, err = q.Query(ctx, builtin.SQLiteArgs{SQL: columns(200, "1")})
	assert.Error(t, err, "a result of 200 columns")
}

// A query that runs long is interrupted at its deadline.
func TestSQLiteQueryStopsAtItsDeadline(t *testing.T) {
	q, err := builtin.OpenSQLiteQuery(shopDB(t), 0, 0)
	require.NoError(t, err)
	defer q.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err = q.Query(ctx, builtin.SQLiteArgs{SQL: "WITH RECURSIVE r(i) AS (SELECT 0 UNION ALL SELECT i+1 FROM r) SELECT count(*) FROM r"})
	assert.ErrorIs(t, err, actionbus.ErrTimeout)
}

// Pragmas are refused by SQLite's authorizer however they are spelled,
// including the table-valued pragma functions the keyword check let by.
func TestSQLitePragmaFunctionsAreRefused(t *testing.T) {
	q, err := builtin.OpenSQLiteQuery(shopDB(t), 0, 0)
	require.NoError(t, err)
	defer q.Close()
	for _, stmt := range []string{
		"SELECT * FROM pragma_database_list",
		"SELECT file FROM main.pragma_database_list",
		"select name from PRAGMA_TABLE_INFO('orders')",
		"SELECT * FROM pragma_function_list",
		"WITH p AS (SELECT * FROM pragma_compile_options) SELECT * FROM p",
	} {
		t.Run(stmt, func(t *testing.T) {
			res, err := q.Query(context.Background(), builtin.SQLiteArgs{SQL: stmt})
			assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeSQLRefused}, "%+v", res)
		})
	}
}

// Through the real services: a model's plan of four blob bombs and a
// pragma function, run by the builtin on an executor, each answered with
// its typed error while the run goes on.
func TestSQLiteAttacksThroughAnExecutor(t *testing.T) {
	path := shopDB(t)
	srv := actionbustest.NewServer(t, actionbustest.Options{})
	st := srv.StartStack(t, actionbustest.StackOptions{Scenarios: `
scenarios:
  bombs:
    decisions:
      - type: plan
        partial_ok: true
        actions:
          - {type: action, name: sqlite_query, args: {sql: "` + zeroblobBomb + `"}}
          - {type: action, name: sqlite_query, args: {sql: "` + zeroblobBomb + `"}}
          - {type: action, name: sqlite_query, args: {sql: "` + zeroblobBomb + `"}}
          - {type: action, name: sqlite_query, args: {sql: "` + zeroblobBomb + `"}}
          - {type: action, name: sqlite_query, args: {sql: "SELECT * FROM pragma_database_list"}}
      - {type: final, answer: '{{ range .Last }}{{ .Error.Code }} {{ end }}'}
`, Register: func(ex *executor.Executor) error {
		m, err := builtin.Register(ex, builtin.Config{SQLitePath: path})
		if err == nil {
			t.Cleanup(func() { m.Close() })
		}
		return err
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := st.Client.Run(ctx, client.RunRequest{Scenario: "bombs", Prompt: "p"}, nil)
	require.NoError(t, err)
	require.Equal(t, client.StatusCompleted, res.Status, "%+v", res.Error)
	assert.Equal(t, "sql_limit_exceeded sql_limit_exceeded sql_limit_exceeded sql_limit_exceeded sql_refused ", res.Answer)
}
