package queries

import (
	"context"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/better-compute/better-compute/controlplane/store"
)

const createMigrationsTable = `CREATE TABLE IF NOT EXISTS schema_migrations (
	name text PRIMARY KEY,
	applied_at text NOT NULL
)`

// migration is one embedded migration file.
type migration struct {
	name string // file name without .sql, e.g. 0001_init
	sql  string
}

func (s *Store) migrations() ([]migration, error) {
	entries, err := fs.ReadDir(s.d.Migrations, ".")
	if err != nil {
		return nil, fmt.Errorf("read embedded migrations: %w", err)
	}
	var out []migration
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		b, err := fs.ReadFile(s.d.Migrations, e.Name())
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		out = append(out, migration{name: strings.TrimSuffix(e.Name(), ".sql"), sql: string(b)})
	}
	slices.SortFunc(out, func(a, b migration) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

// Migrate applies pending migrations in one transaction under the dialect's
// migration lock.
func (s *Store) Migrate(ctx context.Context) ([]string, error) {
	known, err := s.migrations()
	if err != nil {
		return nil, err
	}
	var applied []string
	err = s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		if s.d.MigrationLock != "" {
			if _, err := q.db.Exec(ctx, s.d.MigrationLock); err != nil {
				return fmt.Errorf("take migration lock: %w", err)
			}
		}
		if _, err := q.db.Exec(ctx, createMigrationsTable); err != nil {
			return fmt.Errorf("create schema_migrations: %w", err)
		}
		st, err := q.status(ctx, known)
		if err != nil {
			return err
		}
		for _, m := range known {
			if !slices.Contains(st.Pending, m.name) {
				continue
			}
			if _, err := q.db.Exec(ctx, m.sql); err != nil {
				return fmt.Errorf("apply migration %s: %w", m.name, err)
			}
			if _, err := q.db.Exec(ctx, `INSERT INTO schema_migrations (name, applied_at) VALUES ($1, CAST(now() AS text))`, m.name); err != nil {
				return fmt.Errorf("record migration %s: %w", m.name, err)
			}
			applied = append(applied, m.name)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return applied, nil
}

// MigrationStatus reports applied and pending migrations.
func (s *Store) MigrationStatus(ctx context.Context) (*store.MigrationStatus, error) {
	known, err := s.migrations()
	if err != nil {
		return nil, err
	}
	var exists bool
	if err := s.db.QueryRow(ctx, s.tableExistsSQL(), "schema_migrations").Scan(&exists); err != nil {
		return nil, s.wrap("look for schema_migrations", err)
	}
	if !exists {
		st := &store.MigrationStatus{}
		for _, m := range known {
			st.Pending = append(st.Pending, m.name)
		}
		return st, nil
	}
	return s.status(ctx, known)
}

func (s *Store) tableExistsSQL() string {
	if s.d.Name == store.DialectSQLite {
		return `SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = $1`
	}
	return `SELECT to_regclass($1) IS NOT NULL`
}

// status compares applied migrations with known ones; unknown applied ones
// are a *store.MigrationError (returned with the status).
func (s *Store) status(ctx context.Context, known []migration) (*store.MigrationStatus, error) {
	rows, err := s.db.Query(ctx, `SELECT name FROM schema_migrations ORDER BY name`)
	if err != nil {
		return nil, s.wrap("read schema_migrations", err)
	}
	defer rows.Close()
	st := &store.MigrationStatus{}
	applied := map[string]bool{}
	var unknown []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, s.wrap("read schema_migrations", err)
		}
		applied[name] = true
		st.Applied = append(st.Applied, name)
		if !slices.ContainsFunc(known, func(m migration) bool { return m.name == name }) {
			unknown = append(unknown, name)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, s.wrap("read schema_migrations", err)
	}
	for _, m := range known {
		if !applied[m.name] {
			st.Pending = append(st.Pending, m.name)
		}
	}
	if len(unknown) > 0 {
		return st, &store.MigrationError{Unknown: unknown}
	}
	return st, nil
}
