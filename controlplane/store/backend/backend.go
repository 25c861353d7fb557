// Package backend opens the store a configuration names: PostgreSQL when a
// database URL is set, the embedded SQLite file otherwise.
package backend

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
)

// EmbeddedFile is the embedded database's file name in the data directory.
const EmbeddedFile = "state.db"

// Open opens PostgreSQL at databaseURL, or with an empty URL the SQLite
// database dataDir/state.db (creating dataDir, mode 0700).
func Open(ctx context.Context, databaseURL, dataDir string) (store.Store, error) {
	if databaseURL != "" {
		return postgres.Open(ctx, databaseURL)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	return sqlite.Open(ctx, filepath.Join(dataDir, EmbeddedFile))
}
