package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strings"

	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
)

// withStore loads the configuration, opens the store and runs fn with both:
// the operator commands that need the database itself, as they hold the CA
// keys (pki init, pki issue-gateway); every other operator command goes
// through the API. Unless create is set (pki init), a data directory that
// holds no embedded deployment is an error, never a new deployment. The
// embedded database is migrated first, as serve would; a PostgreSQL
// database must be migrated already (better-compute migrate).
func (e *env) withStore(ctx context.Context, create bool, fn func(*config.Config, store.Store) error) error {
	cfg, err := e.load(config.Flags{})
	if err != nil {
		return err
	}
	if !create {
		if err := checkDeployment(cfg); err != nil {
			return err
		}
	}
	st, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	if cfg.Embedded {
		if _, err := st.Migrate(ctx); err != nil {
			return err
		}
	} else {
		status, err := st.MigrationStatus(ctx)
		if err != nil {
			return err
		}
		if len(status.Pending) > 0 {
			return fmt.Errorf("the database schema is behind this build (pending %s): run better-compute migrate first", strings.Join(status.Pending, ", "))
		}
	}
	return fn(cfg, st)
}

// noDeploymentError is a data directory without an embedded deployment.
type noDeploymentError struct{ dir string }

func (e noDeploymentError) Error() string {
	return fmt.Sprintf("no deployment in %s (no %s): start one with `better-compute serve` (or dev, migrate, pki init), "+
		"or point at one with --data-dir, --config or %s", e.dir, backend.EmbeddedFile, config.EnvDataDir)
}

// hasDeployment reports whether dir holds an embedded deployment (its
// state.db).
func hasDeployment(dir string) (bool, error) {
	_, err := os.Stat(filepath.Join(dir, backend.EmbeddedFile))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	}
	return false, fmt.Errorf("look for a deployment in %s: %w", dir, err)
}

// checkDeployment fails with noDeploymentError when cfg is the embedded
// default and its data directory holds no deployment. It reads only: a
// command that merely reads a deployment must never create one (DESIGN.md,
// "Operator CLI"). With PostgreSQL it checks nothing; the schema check does.
func checkDeployment(cfg *config.Config) error {
	if !cfg.Embedded {
		return nil
	}
	ok, err := hasDeployment(cfg.DataDir)
	if err != nil {
		return err
	}
	if !ok {
		return noDeploymentError{cfg.DataDir}
	}
	return nil
}

// bundle opens the deployment's PKI bundle. The embedded default makes it
// when missing, as its first serve would; with PostgreSQL a missing bundle
// is an error telling to run pki init.
func bundle(ctx context.Context, cfg *config.Config, st store.Store) (*pki.Bundle, error) {
	if cfg.Embedded {
		b, _, err := bootstrap.EnsureBundle(ctx, st, cfg.Secret,
			pki.InitOptions{TrustDomain: bootstrap.DefaultTrustDomain, NodeValidity: cfg.PKI.NodeCAValidity.Duration})
		return b, err
	}
	b, err := bootstrap.LoadBundle(ctx, st, cfg.Secret)
	if errors.Is(err, bootstrap.ErrNoBundle) {
		return nil, fmt.Errorf("%w: run better-compute pki init --trust-domain <domain> first", err)
	}
	return b, err
}

// auditor is what audit writes.
type auditor interface {
	AuditInsert(ctx context.Context, e *store.AuditEntry) (int64, error)
}

// audit records an operator command in the audit log; the actor is the
// operating-system user running the CLI.
func audit(ctx context.Context, st auditor, action, resource string, details []byte) error {
	actor := "cli"
	if u, err := user.Current(); err == nil {
		actor = "cli:" + u.Username
	}
	_, err := st.AuditInsert(ctx, &store.AuditEntry{Actor: actor, Action: action, Resource: resource, Outcome: "success", Details: details})
	return err
}

// writeSecretFile writes data to path with mode 0600, replacing it
// atomically, so a secret is never readable by others even for a moment.
func writeSecretFile(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
