package transfer

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/better-compute/better-compute/controlplane/store/sqlite"
)

// BackupFormat names the layout of a backup file: a tar archive of
// ManifestName, then DatabaseName.
const BackupFormat = "better-compute-backup/1"

// Names of a backup file's entries.
const (
	ManifestName = "manifest.json"
	DatabaseName = "state.db"
)

// SecretNote is what every manifest says of the deployment secret.
const SecretNote = "This backup does not contain the deployment secret and is useless without it: " +
	"the PKI bundle (the CA keys) and the BMC passwords in it are sealed under that secret. " +
	"Keep the secret (DATA_DIR/secret, or BETTER_COMPUTE_SECRET) apart from this file."

// Manifest describes a backup file.
type Manifest struct {
	Format string `json:"format"`
	// Version is the better-compute build that took the backup.
	Version string `json:"version"`
	// CreatedAt is when the backup was taken.
	CreatedAt time.Time `json:"createdAt"`
	// Schema are the migrations the database had applied.
	Schema []string `json:"schema"`
	// Bytes and SHA256 are the database file's size and checksum.
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
	// Tables are the row counts of the database's tables.
	Tables map[string]int64 `json:"tables"`
	// Secret is SecretNote.
	Secret string `json:"secret"`
}

// ErrBadBackup reports a backup file that is not one, is damaged, or does
// not match its manifest.
var ErrBadBackup = errors.New("bad backup file")

// Backup writes the embedded database at source, which may be in use,
// into the backup file out (mode 0600, replaced atomically): SQLite's
// VACUUM INTO takes a consistent copy inside one read transaction, while
// the deployment goes on writing. version is the build's.
func Backup(ctx context.Context, source, out, version string) (*Manifest, error) {
	tmpDir, err := os.MkdirTemp(filepath.Dir(out), ".backup-*")
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	defer os.RemoveAll(tmpDir)
	snap := filepath.Join(tmpDir, DatabaseName)
	db, err := sqlite.OpenDB(ctx, source)
	if err != nil {
		return nil, err
	}
	_, err = db.ExecContext(ctx, `VACUUM INTO $1`, snap)
	db.Close()
	if err != nil {
		return nil, fmt.Errorf("backup: copy the database (VACUUM INTO): %w", err)
	}
	m, err := describe(ctx, snap)
	if err != nil {
		return nil, err
	}
	m.Version = version
	m.CreatedAt = time.Now().UTC()
	archive := filepath.Join(tmpDir, "backup.tar")
	if err := writeArchive(archive, m, snap); err != nil {
		return nil, err
	}
	if err := os.Rename(archive, out); err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	return m, nil
}

// describe reads the snapshot's schema and row counts and checksums it.
func describe(ctx context.Context, path string) (*Manifest, error) {
	m := &Manifest{Format: BackupFormat, Tables: map[string]int64{}, Secret: SecretNote}
	db, err := sqlite.OpenDB(ctx, path)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	tables, err := sqliteTables(ctx, db)
	if err != nil {
		return nil, err
	}
	for n := range tables {
		var c int64
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM "`+n+`"`).Scan(&c); err != nil {
			return nil, fmt.Errorf("count %s: %w", n, err)
		}
		m.Tables[n] = c
	}
	rows, err := db.QueryContext(ctx, `SELECT name FROM schema_migrations ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("read the schema: %w", err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read the schema: %w", err)
		}
		m.Schema = append(m.Schema, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the schema: %w", err)
	}
	db.Close()
	if m.Bytes, m.SHA256, err = fileSum(path); err != nil {
		return nil, err
	}
	return m, nil
}

func fileSum(path string) (int64, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return 0, "", fmt.Errorf("checksum %s: %w", path, err)
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

// writeArchive writes the manifest and the database file db into a tar
// file at path, mode 0600.
func writeArchive(path string, m *Manifest, db string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	defer f.Close()
	mb, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	mb = append(mb, '\n')
	tw := tar.NewWriter(f)
	if err := tw.WriteHeader(&tar.Header{Name: ManifestName, Mode: 0o600, Size: int64(len(mb)), ModTime: m.CreatedAt}); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if _, err := tw.Write(mb); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	src, err := os.Open(db)
	if err != nil {
		return err
	}
	defer src.Close()
	if err := tw.WriteHeader(&tar.Header{Name: DatabaseName, Mode: 0o600, Size: m.Bytes, ModTime: m.CreatedAt}); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if _, err := io.Copy(tw, src); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	return f.Close()
}

// Unpack reads the backup file from, writes its database to the file db
// (mode 0600; it must not exist) and checks it against the manifest: the
// database's checksum and size, its schema and its row counts. It returns
// the manifest; a file that does not match fails wrapping ErrBadBackup,
// and db is removed.
func Unpack(ctx context.Context, from, db string) (m *Manifest, err error) {
	f, err := os.Open(from)
	if err != nil {
		return nil, fmt.Errorf("open the backup: %w", err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	hdr, err := tr.Next()
	if err != nil || hdr.Name != ManifestName || hdr.Size > 1<<20 {
		return nil, fmt.Errorf("%w: %s does not start with %s (not a better-compute backup)", ErrBadBackup, from, ManifestName)
	}
	m = &Manifest{}
	if err := json.NewDecoder(tr).Decode(m); err != nil {
		return nil, fmt.Errorf("%w: read its manifest: %v", ErrBadBackup, err)
	}
	if m.Format != BackupFormat {
		return nil, fmt.Errorf("%w: format %q, want %q", ErrBadBackup, m.Format, BackupFormat)
	}
	hdr, err = tr.Next()
	if err != nil || hdr.Name != DatabaseName {
		return nil, fmt.Errorf("%w: no %s after the manifest", ErrBadBackup, DatabaseName)
	}
	out, err := os.OpenFile(db, os.O_WRONLY|os.O_CREATE|os.O_EXCL, sqlite.FileMode)
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	defer func() {
		if err != nil {
			os.Remove(db)
		}
	}()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(out, h), tr)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("%w: read the database: %v", ErrBadBackup, err)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); n != m.Bytes || sum != m.SHA256 {
		return nil, fmt.Errorf("%w: the database is %d bytes with SHA-256 %s; the manifest says %d bytes, %s", ErrBadBackup, n, sum, m.Bytes, m.SHA256)
	}
	got, err := describe(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadBackup, err)
	}
	if !slices.Equal(got.Schema, m.Schema) {
		return nil, fmt.Errorf("%w: the database's schema %v is not the manifest's %v", ErrBadBackup, got.Schema, m.Schema)
	}
	for name, rows := range m.Tables {
		if got.Tables[name] != rows {
			return nil, fmt.Errorf("%w: table %s has %d rows, the manifest says %d", ErrBadBackup, name, got.Tables[name], rows)
		}
	}
	return m, nil
}
