// Package sqlitetest opens embedded stores for tests, as pgtest finds the
// test PostgreSQL.
package sqlitetest

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
)

// Open returns a fresh SQLite store in t's temporary directory, migrated,
// and closed when t ends. It fails t when the store cannot be opened.
func Open(t testing.TB) store.Store {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return st
}

// Exec returns a function that runs raw SQL (one or more statements) on
// the database file at path over a connection of its own, for tests that
// must set up a state the Store API cannot reach. The production store has
// no such hatch.
func Exec(path string) func(ctx context.Context, sql string) error {
	return func(ctx context.Context, query string) error {
		db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)&_pragma=foreign_keys(1)")
		if err != nil {
			return fmt.Errorf("open sqlite %s: %w", path, err)
		}
		defer db.Close()
		if _, err := db.ExecContext(ctx, query); err != nil {
			return fmt.Errorf("exec on %s: %w", path, err)
		}
		return nil
	}
}
