package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/bootstrap"
	"github.com/better-compute/better-compute/controlplane/config"
	"github.com/better-compute/better-compute/controlplane/pki"
	"github.com/better-compute/better-compute/controlplane/store"
)

// withStore loads the configuration, opens the store and runs fn with both:
// the operator commands that talk to the database directly (pki, sites,
// pools, join-tokens). The embedded database is migrated first, as serve
// would; a PostgreSQL database must be migrated already (better-compute
// migrate).
func (e *env) withStore(ctx context.Context, fn func(*config.Config, store.Store) error) error {
	cfg, err := e.load(config.Flags{})
	if err != nil {
		return err
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

// bundle opens the deployment's PKI bundle. The embedded default makes it
// when missing, as its first serve would; with PostgreSQL a missing bundle
// is an error telling to run pki init.
func bundle(ctx context.Context, cfg *config.Config, st store.Store) (*pki.Bundle, error) {
	if cfg.Embedded {
		b, _, err := bootstrap.EnsureBundle(ctx, st, cfg.Secret, bootstrap.DefaultTrustDomain)
		return b, err
	}
	b, err := bootstrap.LoadBundle(ctx, st, cfg.Secret)
	if errors.Is(err, bootstrap.ErrNoBundle) {
		return nil, fmt.Errorf("%w: run better-compute pki init --trust-domain <domain> first", err)
	}
	return b, err
}

// audit records an operator command in the audit log; the actor is the
// operating-system user running the CLI.
func audit(ctx context.Context, st store.Store, action, resource string, details []byte) error {
	actor := "cli"
	if u, err := user.Current(); err == nil {
		actor = "cli:" + u.Username
	}
	_, err := st.AuditInsert(ctx, &store.AuditEntry{Actor: actor, Action: action, Resource: resource, Outcome: "success", Details: details})
	return err
}

// listAll pages through a store list.
func listAll[T any](ctx context.Context, list func(context.Context, *store.ListParams) ([]*T, error), id func(*T) string) ([]*T, error) {
	var all []*T
	p := &store.ListParams{Limit: store.MaxListLimit}
	for {
		page, err := list(ctx, p)
		if err != nil {
			return nil, err
		}
		all = append(all, page...)
		if len(page) < p.Limit {
			return all, nil
		}
		p.Cursor = id(page[len(page)-1])
	}
}

// timeCell formats a time for a table, "-" when unset.
func timeCell(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
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
