package transfer_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/store/transfer"
)

// TestBackupUnpack: a backup unpacks to a database with the manifest's
// schema, counts and checksum; the manifest says the secret is not in it;
// a file with one byte of its database changed is refused.
func TestBackupUnpack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src := source(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "backup.tar")
	m, err := transfer.Backup(ctx, src, file, "test")
	if err != nil {
		t.Fatal(err)
	}
	if m.Tables["nodes"] != 3 || len(m.Schema) == 0 || !strings.Contains(m.Secret, "useless without it") {
		t.Errorf("manifest: %+v", m)
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("backup file: %v, mode %v; want 0600", err, fi.Mode())
	}
	got, err := transfer.Unpack(ctx, file, filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	if got.SHA256 != m.SHA256 || got.Tables["commands"] != 3 {
		t.Errorf("unpacked manifest %+v, want %+v", got, m)
	}

	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-4096] ^= 0xff // inside the database, before tar's zero blocks
	bad := filepath.Join(dir, "bad.tar")
	if err := os.WriteFile(bad, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = transfer.Unpack(ctx, bad, filepath.Join(dir, "bad.db"))
	if !errors.Is(err, transfer.ErrBadBackup) {
		t.Errorf("unpack of a changed file: %v, want ErrBadBackup", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "bad.db")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused unpack left its database: %v", err)
	}
}
