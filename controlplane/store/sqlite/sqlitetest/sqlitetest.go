// Package sqlitetest opens embedded stores for tests, as pgtest finds the
// test PostgreSQL.
package sqlitetest

import (
	"context"
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
