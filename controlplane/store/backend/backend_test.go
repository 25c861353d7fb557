package backend_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
)

// TestEmbeddedFileModes: a data directory that existed with mode 0755 and
// database files left 0644 (by hand, or an earlier build) are 0700 and 0600
// once the store opens, and the -wal and -shm files SQLite makes are 0600.
func TestEmbeddedFileModes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil { // past the umask
		t.Fatal(err)
	}
	db := filepath.Join(dir, backend.EmbeddedFile)
	for _, f := range []string{db, db + "-wal"} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(f, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	st, err := backend.Open(ctx, "", dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// A write, so that the -wal and -shm files exist while it is open.
	if _, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"}); err != nil {
		t.Fatal(err)
	}
	want := map[string]os.FileMode{dir: 0o700, db: 0o600, db + "-wal": 0o600, db + "-shm": 0o600}
	for path, mode := range want {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if fi.Mode().Perm() != mode {
			t.Errorf("%s has mode %o, want %o", filepath.Base(path), fi.Mode().Perm(), mode)
		}
	}
}
