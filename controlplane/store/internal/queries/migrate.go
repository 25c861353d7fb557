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
	name     string // file name without .sql, e.g. 0001_init
	sql      string
	contract bool // its first line is "-- contract" (else "-- expand")
}

// Kind marks: the first line of every migration file is one of these
// (issue 40, docs/upgrade-control-plane.md).
const (
	markExpand   = "-- expand"
	markContract = "-- contract"
)

// migrationKind reads a migration's first line: contract, or an error when
// it is neither mark.
func migrationKind(name, sql string) (contract bool, err error) {
	first, _, _ := strings.Cut(sql, "\n")
	switch strings.TrimSpace(first) {
	case markExpand:
		return false, nil
	case markContract:
		return true, nil
	}
	return false, fmt.Errorf("migration %s: first line is %q, want %q or %q", name, first, markExpand, markContract)
}

// WithMigrations returns a handle on the same database that migrates with
// fsys (a directory of NNNN_name.sql files) instead of the build's own
// set: for tests of the migration rules with a test-only set.
func (s *Store) WithMigrations(fsys fs.FS) store.Store {
	d := *s.d
	d.Migrations = fsys
	c := *s
	c.d = &d
	return &c
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
		name := strings.TrimSuffix(e.Name(), ".sql")
		contract, err := migrationKind(name, string(b))
		if err != nil {
			return nil, err
		}
		out = append(out, migration{name: name, sql: string(b), contract: contract})
	}
	slices.SortFunc(out, func(a, b migration) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

// Migrate applies pending migrations in order in one transaction under the
// dialect's migration lock. An expand migration always runs; a contract one
// runs only when no live process needs the shape it drops (see
// store.ContractRefusedError): otherwise Migrate commits the migrations
// before it and returns them with a *store.ContractRefusedError.
func (s *Store) Migrate(ctx context.Context) ([]string, error) {
	return s.MigrateTo(ctx, "")
}

// MigrateTo is Migrate that stops after the migration named last (a name
// this build embeds, e.g. 0004_commands_open_deadline); "" is every one.
func (s *Store) MigrateTo(ctx context.Context, last string) ([]string, error) {
	known, err := s.migrations()
	if err != nil {
		return nil, err
	}
	if last != "" && !slices.ContainsFunc(known, func(m migration) bool { return m.name == last }) {
		return nil, fmt.Errorf("migrate: this build has no migration %q", last)
	}
	var applied []string
	var refused *store.ContractRefusedError
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
			if last != "" && m.name > last {
				break
			}
			if !slices.Contains(st.Pending, m.name) {
				continue
			}
			if m.contract {
				blockers, err := q.contractBlockers(ctx, m.name)
				if err != nil {
					return fmt.Errorf("check contract migration %s: %w", m.name, err)
				}
				if len(blockers) > 0 {
					refused = &store.ContractRefusedError{Migration: m.name, Processes: blockers}
					return nil
				}
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
	if refused != nil {
		return applied, refused
	}
	return applied, nil
}

// contractBlockers describes the live processes whose builds need the
// shape the contract migration name drops (store.ContractRefusedError
// gives the rule). Tables not yet created count as empty.
func (s *Store) contractBlockers(ctx context.Context, name string) ([]string, error) {
	has := func(table string) (bool, error) {
		var ok bool
		if err := s.db.QueryRow(ctx, s.tableExistsSQL(), table).Scan(&ok); err != nil {
			return false, s.wrap("look for "+table, err)
		}
		return ok, nil
	}
	var out []string
	registered := map[string]bool{}      // process ids
	gatewayVersions := map[string]bool{} // versions of registered gateway processes
	if ok, err := has("processes"); err != nil {
		return nil, err
	} else if ok {
		procs, err := s.ProcessList(ctx)
		if err != nil {
			return nil, err
		}
		for _, p := range procs {
			registered[p.ID] = true
			if slices.Contains(p.Roles, "gateway") {
				gatewayVersions[p.Version] = true
			}
			switch {
			case p.Schema == "":
				out = append(out, fmt.Sprintf("process %s (version %s, declares no schema)", p.ID, p.Version))
			case p.Schema < name:
				out = append(out, fmt.Sprintf("process %s (version %s, schema %s)", p.ID, p.Version, p.Schema))
			}
		}
	}
	live := store.ContractLiveWithin.Microseconds()
	if ok, err := has("workers"); err != nil {
		return nil, err
	} else if ok {
		ws, err := s.WorkerList(ctx, store.ContractLiveWithin, nil)
		if err != nil {
			return nil, err
		}
		for _, w := range ws {
			if !registered[w.ID] {
				out = append(out, fmt.Sprintf("worker %s (version %s, no processes row)", w.ID, w.Version))
			}
		}
	}
	if ok, err := has("gateways"); err != nil {
		return nil, err
	} else if ok {
		rows, err := s.db.Query(ctx, `SELECT id, version FROM gateways WHERE heartbeat_at > now() - bc_micros($1) ORDER BY id`, live)
		if err != nil {
			return nil, s.wrap("list live gateways", err)
		}
		defer rows.Close()
		for rows.Next() {
			var id, version string
			if err := rows.Scan(&id, &version); err != nil {
				return nil, s.wrap("list live gateways", err)
			}
			if !gatewayVersions[version] {
				out = append(out, fmt.Sprintf("gateway %s (version %s, no processes row)", id, version))
			}
		}
		if err := rows.Err(); err != nil {
			return nil, s.wrap("list live gateways", err)
		}
	}
	return out, nil
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
			if m.contract {
				st.PendingContract = append(st.PendingContract, m.name)
			}
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
			if m.contract {
				st.PendingContract = append(st.PendingContract, m.name)
			}
		}
	}
	if len(unknown) > 0 {
		return st, &store.MigrationError{Unknown: unknown}
	}
	return st, nil
}
