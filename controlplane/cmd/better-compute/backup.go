package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
	"github.com/better-compute/better-compute/controlplane/store/transfer"
)

func backupCmd(e *env) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "backup --out FILE",
		Short: "Back up the embedded database of a running or stopped deployment into FILE (never the secret)",
		Long: `Back up the embedded SQLite database into FILE (mode 0600): a consistent copy
taken while the deployment runs (SQLite's VACUUM INTO), with a manifest of the
build's version, the schema, the time and checksums. The file does not hold the
deployment secret and is useless without it: keep DATA_DIR/secret apart.
On PostgreSQL it refuses and prints the pg_dump command to use instead.
Restore with better-compute restore --from FILE --data-dir DIR.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return usageError{errors.New("--out FILE is required")}
			}
			return e.backup(cmd.Context(), out)
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "file to write the backup to (required)")
	return cmd
}

func (e *env) backup(ctx context.Context, out string) error {
	cfg, err := e.load(config.Flags{})
	if err != nil {
		return err
	}
	if !cfg.Embedded {
		shown := cfg.Database.URL
		return fmt.Errorf("backup takes the embedded database; this deployment is on PostgreSQL, whose own tools back it up:\n"+
			"  pg_dump --format=custom --file=%s %s\n"+
			"and keep the deployment secret (%s) apart: the dump is useless without it",
			shellQuote(out), shellQuote(redactURL(shown)), config.EnvSecret)
	}
	if err := checkDeployment(cfg); err != nil {
		return err
	}
	m, err := transfer.Backup(ctx, filepath.Join(cfg.DataDir, backend.EmbeddedFile), out, version)
	if err != nil {
		return err
	}
	var rows int64
	for _, n := range m.Tables {
		rows += n
	}
	fmt.Fprintf(e.stdout, "backed up %s to %s: %d bytes, %d rows in %d tables, schema %s, sha256 %s\n",
		filepath.Join(cfg.DataDir, backend.EmbeddedFile), out, m.Bytes, rows, len(m.Tables), m.Schema[len(m.Schema)-1], m.SHA256)
	fmt.Fprintf(e.stdout, "the backup does not hold the deployment secret and is useless without it: keep %s apart from it\n",
		filepath.Join(cfg.DataDir, config.SecretFile))
	return nil
}

func restoreCmd(e *env) *cobra.Command {
	var from string
	cmd := &cobra.Command{
		Use:   "restore --from FILE --data-dir DIR",
		Short: "Restore a backup into an empty data directory, checking its checksums, schema and secret first",
		Long: `Restore a backup taken with better-compute backup into DIR, which must be empty
(or hold only the deployment's secret file). The file's checksums and schema are
checked, and the PKI bundle in it must open with the deployment secret
(BETTER_COMPUTE_SECRET, or DIR/secret) before anything is written to DIR. Then
serve on DIR, on the same gateway address: nodes reconnect with their identities.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if from == "" {
				return usageError{errors.New("--from FILE is required")}
			}
			return e.restore(cmd.Context(), from)
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "backup file to restore (required)")
	return cmd
}

func (e *env) restore(ctx context.Context, from string) error {
	if e.dataDir == "" && e.getenv(config.EnvDataDir) == "" {
		return usageError{errors.New("--data-dir DIR is required: the empty data directory to restore into")}
	}
	cfg, err := e.load(config.Flags{})
	if err != nil {
		return err
	}
	if !cfg.Embedded {
		return usageError{fmt.Errorf("restore writes an embedded data directory: unset the database URL (%s or database.url); on PostgreSQL use pg_restore", config.EnvDatabaseURL)}
	}
	if _, err := os.Stat(from); err != nil {
		return fmt.Errorf("open the backup: %w", err)
	}
	dir := cfg.DataDir
	secretFile := filepath.Join(dir, config.SecretFile)
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	for _, en := range entries {
		if en.Name() != config.SecretFile {
			return fmt.Errorf("restore needs an empty data directory, and %s holds %s: give a new one", dir, en.Name())
		}
	}
	writeSecret := false
	if cfg.Secret == "" {
		b, err := os.ReadFile(secretFile)
		if err != nil {
			return fmt.Errorf("restore needs the deployment secret the backup was taken with: set %s or put it in %s (%w)", config.EnvSecret, secretFile, err)
		}
		cfg.Secret = strings.TrimSpace(string(b))
	} else if _, err := os.Stat(secretFile); errors.Is(err, fs.ErrNotExist) {
		writeSecret = true // serve on DIR reads it there
	}
	// Unpacked and checked beside DIR, on its filesystem, then moved in.
	parent := filepath.Dir(filepath.Clean(dir))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, ".restore-*")
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	defer os.RemoveAll(tmp)
	db := filepath.Join(tmp, backend.EmbeddedFile)
	m, err := transfer.Unpack(ctx, from, db)
	if err != nil {
		return err
	}
	if err := checkSchema(ctx, db); err != nil {
		return err
	}
	if err := checkSecret(ctx, db, cfg.Secret); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, backend.DataDirMode); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if err := os.Chmod(dir, backend.DataDirMode); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if writeSecret {
		if err := writeSecretFile(secretFile, []byte(cfg.Secret+"\n")); err != nil {
			return fmt.Errorf("restore: write the secret: %w", err)
		}
	}
	if err := os.Rename(db, filepath.Join(dir, backend.EmbeddedFile)); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	fmt.Fprintf(e.stdout, "restored the backup of %s (build %s, schema %s) into %s; its checksums, schema and PKI bundle were checked\n",
		m.CreatedAt.Format("2006-01-02 15:04:05Z07:00"), m.Version, m.Schema[len(m.Schema)-1], dir)
	fmt.Fprintln(e.stdout, "next: better-compute serve --data-dir "+dir+" on the same gateway address (host.gateway.listen, publicURL): nodes reconnect with their identities")
	return nil
}

// checkSchema refuses a database a newer build migrated; an older one is
// migrated by serve.
func checkSchema(ctx context.Context, path string) error {
	st, err := sqlite.Open(ctx, path)
	if err != nil {
		return err
	}
	defer st.Close()
	_, err = st.MigrationStatus(ctx)
	var me *store.MigrationError
	if errors.As(err, &me) {
		return fmt.Errorf("the backup's schema is newer than this build (%w): restore it with the build that took it", err)
	}
	return err
}

// redactURL leaves a URL's password out.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			return u.Redacted()
		}
	}
	return s
}
