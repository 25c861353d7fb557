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

// DataDirMode is the mode of the embedded default's data directory: it
// holds the database, the deployment secret and the first admin token.
const DataDirMode = 0o700

// Open opens PostgreSQL at databaseURL, or with an empty URL the SQLite
// database dataDir/state.db (mode sqlite.FileMode), creating dataDir, and
// setting DataDirMode on it also when it existed with another mode.
func Open(ctx context.Context, databaseURL, dataDir string) (store.Store, error) {
	if databaseURL != "" {
		return postgres.Open(ctx, databaseURL)
	}
	if err := os.MkdirAll(dataDir, DataDirMode); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	// MkdirAll leaves a directory that exists as it is: one made 0755 by
	// hand, a package or an earlier build would let everyone list it.
	if err := os.Chmod(dataDir, DataDirMode); err != nil {
		return nil, fmt.Errorf("restrict data dir %s to mode %o: %w", dataDir, DataDirMode, err)
	}
	return sqlite.Open(ctx, filepath.Join(dataDir, EmbeddedFile))
}
