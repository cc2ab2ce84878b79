package builtin_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/internal/builtin"
)

func TestSQLiteQueryReadsAndRefusesWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "shop.db")
	db, err := sql.Open("sqlite", path)
	require.NoError(t, err)
	_, err = db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT, total REAL);
		INSERT INTO orders (customer, total) VALUES ('ada', 12.5), ('bob', 7), ('ada', 3.25), ('cy', 99);`)
	require.NoError(t, err)
	require.NoError(t, db.Close())

	q, err := builtin.OpenSQLiteQuery(path, 3, 0)
	require.NoError(t, err)
	defer q.Close()
	ctx := context.Background()
	res, err := q.Query(ctx, builtin.SQLiteArgs{SQL: "SELECT customer, SUM(total) AS spent FROM orders WHERE customer = ? GROUP BY customer", Params: []any{"ada"}})
	require.NoError(t, err)
	assert.Equal(t, []string{"customer", "spent"}, res.Columns)
	assert.Equal(t, [][]any{{"ada", 15.75}}, res.Rows)
	res, err = q.Query(ctx, builtin.SQLiteArgs{SQL: "-- all of them\nWITH o AS (SELECT * FROM orders) SELECT id FROM o ORDER BY id;"})
	require.NoError(t, err)
	assert.Equal(t, 3, res.RowCount, "the row limit")
	assert.True(t, res.Truncated)

	for _, stmt := range []string{
		"INSERT INTO orders (customer, total) VALUES ('eve', 1)",
		"UPDATE orders SET total = 0",
		"DELETE FROM orders",
		"ATTACH DATABASE '/tmp/x.db' AS x",
		"PRAGMA journal_mode = DELETE",
		"PRAGMA query_only = 0",
		"SELECT 1; DROP TABLE orders",
		"WITH x AS (SELECT 1) INSERT INTO orders (customer) SELECT 'z' FROM x",
		"DROP TABLE orders",
		"",
	} {
		t.Run(stmt, func(t *testing.T) {
			_, err := q.Query(ctx, builtin.SQLiteArgs{SQL: stmt})
			assert.ErrorIs(t, err, &actionbus.Error{Code: actionbus.CodeSQLRefused})
		})
	}
	res, err = q.Query(ctx, builtin.SQLiteArgs{SQL: "SELECT 'a;b -- not a comment', 'DROP' AS word"})
	require.NoError(t, err, "keywords inside strings are data")
	assert.Equal(t, [][]any{{"a;b -- not a comment", "DROP"}}, res.Rows)
	res, err = q.Query(ctx, builtin.SQLiteArgs{SQL: "SELECT COUNT(*) FROM orders"})
	require.NoError(t, err)
	assert.Equal(t, [][]any{{int64(4)}}, res.Rows, "nothing was written")
}
