package serve

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
)

// AdminTokenFile is where the embedded default keeps its first admin token,
// inside the data directory (mode 0600); the CLI reads it when no token is
// given.
const AdminTokenFile = "admin-token"

// ensureAdminToken gives a fresh embedded deployment its first admin token:
// written once, when the database has no API token at all.
func ensureAdminToken(ctx context.Context, dataDir string, st store.Store, log *slog.Logger) error {
	path := filepath.Join(dataDir, AdminTokenFile)
	if _, err := os.Stat(path); err == nil {
		// A file from an earlier build may be more open.
		return os.Chmod(path, 0o600)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	existing, err := st.APITokenList(ctx, &store.ListParams{Limit: 1})
	if err != nil {
		return err
	}
	if len(existing) > 0 {
		return nil
	}
	secret, t, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleAdmin, Description: "first admin token of the embedded default"})
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, []byte(secret+"\n"), 0o600); err != nil {
		return fmt.Errorf("write admin token: %w", err)
	}
	log.InfoContext(ctx, "Wrote the first admin token", "path", path, "token_id", t.ID)
	return nil
}
