package transfer

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// skipTables are the tables no copy carries: the migration record, which
// the target's own migrations write.
var skipTables = []string{"schema_migrations"}

// seededRows are the rows a table's migrations write into every new
// database (a condition selecting them per table): a target that holds
// only these is empty, and the copy removes them before it writes the
// source's own (which holds them too, migrated by the same set).
var seededRows = map[string]string{
	"tenants": "id = 'root'", // migration 0024_tenants
}

// kind is how a column's values are typed on each backend.
type kind int

const (
	kindText  kind = iota // text / text
	kindInt               // integer / integer, bigint, smallint
	kindBool              // integer 0 or 1 / boolean
	kindTime              // integer microseconds since the epoch / timestamptz
	kindJSON              // text / jsonb
	kindBytes             // blob / bytea
	kindFloat             // real / double precision, real
)

// pgKinds maps PostgreSQL's information_schema data_type to a kind.
var pgKinds = map[string]kind{
	"text":                     kindText,
	"character varying":        kindText,
	"integer":                  kindInt,
	"bigint":                   kindInt,
	"smallint":                 kindInt,
	"boolean":                  kindBool,
	"timestamp with time zone": kindTime,
	"jsonb":                    kindJSON,
	"json":                     kindJSON,
	"bytea":                    kindBytes,
	"double precision":         kindFloat,
	"real":                     kindFloat,
}

// column is one column of a table.
type column struct {
	name     string
	kind     kind
	identity bool // PostgreSQL GENERATED ... AS IDENTITY (SQLite AUTOINCREMENT)
}

// table is one table of the plan, its columns in PostgreSQL's order.
type table struct {
	name    string
	columns []column
}

// PlanError reports schemas the copy cannot map one onto the other: a
// table or column on one side only, or a column type this package does not
// handle. It is found before anything is written.
type PlanError struct{ Problems []string }

func (e *PlanError) Error() string {
	return "the two schemas do not match: " + strings.Join(e.Problems, "; ")
}

// pgTables reads the base tables of the target's current schema and their
// columns.
func pgTables(ctx context.Context, pg *pgx.Conn) (map[string][]column, []string, error) {
	rows, err := pg.Query(ctx, `SELECT c.table_name, c.column_name, c.data_type, c.is_identity = 'YES'
		FROM information_schema.columns c
		JOIN information_schema.tables t ON t.table_schema = c.table_schema AND t.table_name = c.table_name
		WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'
		ORDER BY c.table_name, c.ordinal_position`)
	if err != nil {
		return nil, nil, fmt.Errorf("read the target's tables: %w", err)
	}
	defer rows.Close()
	cols := map[string][]column{}
	var problems []string
	for rows.Next() {
		var tbl, name, typ string
		var identity bool
		if err := rows.Scan(&tbl, &name, &typ, &identity); err != nil {
			return nil, nil, fmt.Errorf("read the target's tables: %w", err)
		}
		k, ok := pgKinds[typ]
		if !ok && !slices.Contains(skipTables, tbl) {
			problems = append(problems, fmt.Sprintf("%s.%s has type %s, which store copy does not handle", tbl, name, typ))
		}
		cols[tbl] = append(cols[tbl], column{name: name, kind: k, identity: identity})
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read the target's tables: %w", err)
	}
	return cols, problems, nil
}

// pgParents reads the foreign keys of the target's current schema: for
// each table, the tables it references (itself left out).
func pgParents(ctx context.Context, pg *pgx.Conn) (map[string][]string, error) {
	rows, err := pg.Query(ctx, `SELECT child.relname, parent.relname
		FROM pg_constraint k
		JOIN pg_class child ON child.oid = k.conrelid
		JOIN pg_class parent ON parent.oid = k.confrelid
		JOIN pg_namespace n ON n.oid = child.relnamespace
		WHERE k.contype = 'f' AND n.nspname = current_schema()`)
	if err != nil {
		return nil, fmt.Errorf("read the target's foreign keys: %w", err)
	}
	defer rows.Close()
	parents := map[string][]string{}
	for rows.Next() {
		var child, parent string
		if err := rows.Scan(&child, &parent); err != nil {
			return nil, fmt.Errorf("read the target's foreign keys: %w", err)
		}
		if child != parent {
			parents[child] = append(parents[child], parent)
		}
	}
	return parents, rows.Err()
}

// sqliteTables reads the source's tables (SQLite's own left out) and their
// column names.
func sqliteTables(ctx context.Context, db *sql.DB) (map[string][]string, error) {
	rows, err := db.QueryContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("read the source's tables: %w", err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read the source's tables: %w", err)
		}
		names = append(names, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the source's tables: %w", err)
	}
	out := map[string][]string{}
	for _, n := range names {
		cr, err := db.QueryContext(ctx, `SELECT name FROM pragma_table_info($1)`, n)
		if err != nil {
			return nil, fmt.Errorf("read the source's columns of %s: %w", n, err)
		}
		cols := []string{}
		for cr.Next() {
			var c string
			if err := cr.Scan(&c); err != nil {
				cr.Close()
				return nil, fmt.Errorf("read the source's columns of %s: %w", n, err)
			}
			cols = append(cols, c)
		}
		cr.Close()
		if err := cr.Err(); err != nil {
			return nil, fmt.Errorf("read the source's columns of %s: %w", n, err)
		}
		out[n] = cols
	}
	return out, nil
}

// makePlan matches the source's tables with the (migrated) target's and
// orders them parents first; ties go by name. Any mismatch is a
// *PlanError naming every problem found.
func makePlan(ctx context.Context, lite *sql.DB, pg *pgx.Conn) ([]*table, error) {
	src, err := sqliteTables(ctx, lite)
	if err != nil {
		return nil, err
	}
	dst, problems, err := pgTables(ctx, pg)
	if err != nil {
		return nil, err
	}
	parents, err := pgParents(ctx, pg)
	if err != nil {
		return nil, err
	}
	var names []string
	for n := range dst {
		if slices.Contains(skipTables, n) {
			continue
		}
		srcCols, ok := src[n]
		if !ok {
			problems = append(problems, fmt.Sprintf("table %s is in the target only", n))
			continue
		}
		var dstNames []string
		for _, c := range dst[n] {
			dstNames = append(dstNames, c.name)
			if !slices.Contains(srcCols, c.name) {
				problems = append(problems, fmt.Sprintf("column %s.%s is in the target only", n, c.name))
			}
		}
		for _, c := range srcCols {
			if !slices.Contains(dstNames, c) {
				problems = append(problems, fmt.Sprintf("column %s.%s is in the source only", n, c))
			}
		}
		names = append(names, n)
	}
	for n := range src {
		if _, ok := dst[n]; !ok && !slices.Contains(skipTables, n) {
			problems = append(problems, fmt.Sprintf("table %s is in the source only", n))
		}
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		return nil, &PlanError{Problems: problems}
	}
	order, err := topological(names, parents)
	if err != nil {
		return nil, err
	}
	out := make([]*table, len(order))
	for i, n := range order {
		out[i] = &table{name: n, columns: dst[n]}
	}
	return out, nil
}

// topological orders names so that every table comes after the tables it
// references; ties go by name.
func topological(names []string, parents map[string][]string) ([]string, error) {
	slices.Sort(names)
	done := map[string]bool{}
	var out []string
	for len(out) < len(names) {
		progressed := false
		for _, n := range names {
			if done[n] {
				continue
			}
			ready := true
			for _, p := range parents[n] {
				if !done[p] && slices.Contains(names, p) {
					ready = false
					break
				}
			}
			if ready {
				done[n] = true
				out = append(out, n)
				progressed = true
			}
		}
		if !progressed {
			var left []string
			for _, n := range names {
				if !done[n] {
					left = append(left, n)
				}
			}
			return nil, &PlanError{Problems: []string{"the foreign keys of " + strings.Join(left, ", ") + " form a cycle"}}
		}
	}
	return out, nil
}

// quoted is the column list of t, quoted, with cast (such as "::text")
// appended to JSON columns.
func (t *table) quoted(jsonCast string) string {
	parts := make([]string, len(t.columns))
	for i, c := range t.columns {
		parts[i] = pgx.Identifier{c.name}.Sanitize()
		if c.kind == kindJSON {
			parts[i] += jsonCast
		}
	}
	return strings.Join(parts, ", ")
}

func (t *table) columnNames() []string {
	out := make([]string, len(t.columns))
	for i, c := range t.columns {
		out[i] = c.name
	}
	return out
}
