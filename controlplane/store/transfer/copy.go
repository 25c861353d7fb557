package transfer

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
)

// Defaults of Config.
const (
	DefaultBatchRows = 50000
)

// Config is one copy.
type Config struct {
	// Source is the embedded database file (DATA_DIR/state.db) of a
	// deployment that is not running. Required.
	Source string
	// Target is the PostgreSQL URL (a postgres:// URL or key=value
	// string), its search_path naming the schema when not the default.
	// Required.
	Target string
	// Replace empties the target's tables first (in the copy's
	// transaction) instead of refusing a target that holds rows.
	Replace bool
	// BatchRows is the most rows one COPY statement sends; the rows
	// stream to it as they are read, so that memory does not grow with
	// it. Defaults to DefaultBatchRows.
	BatchRows int
	// Progress, when set, is called after every batch and once when a
	// table is done (Copied == Total).
	Progress func(Progress)
}

// Progress is where a copy is.
type Progress struct {
	Table         string
	Copied, Total int64
}

// TableResult is one table copied and verified.
type TableResult struct {
	Name string
	// Rows is the row count, the same in the source and the target.
	Rows int64
	// Checksum is the table's checksum, the same in the source and the
	// target.
	Checksum Checksum
}

// Result is a copy done.
type Result struct {
	// Migrated are the migrations the copy applied to the target.
	Migrated []string
	// Tables are the tables copied, in the order they were.
	Tables []TableResult
	// Rows is the sum of the tables' rows.
	Rows int64
	// Elapsed is the copy's wall time, checks and verification included;
	// Copying and Verifying are its two long parts: the batches of COPY,
	// and reading every table back from the target to checksum it.
	Elapsed, Copying, Verifying time.Duration
}

// NotEmptyError is a target that holds rows, without Config.Replace.
type NotEmptyError struct {
	// Tables are the tables holding rows.
	Tables []string
}

func (e *NotEmptyError) Error() string {
	return "the target database already holds a deployment (rows in " + strings.Join(e.Tables, ", ") + ")"
}

// SchemaError is a source whose migrations are not this build's.
type SchemaError struct {
	// Missing are this build's migrations the source has not applied;
	// Unknown the source's that this build does not know.
	Missing, Unknown []string
}

func (e *SchemaError) Error() string {
	var parts []string
	if len(e.Missing) > 0 {
		parts = append(parts, "it lacks "+strings.Join(e.Missing, ", ")+" (an older build made it: run better-compute migrate on it with this build first)")
	}
	if len(e.Unknown) > 0 {
		parts = append(parts, "it has "+strings.Join(e.Unknown, ", ")+", which this build does not know (use the build that migrated it)")
	}
	return "the source database's schema is not this build's: " + strings.Join(parts, "; ")
}

// ErrVerify reports a table whose count or checksum in the target differs
// from the source's after the copy; nothing was committed.
var ErrVerify = errors.New("verify the copy")

// Copy copies the embedded database cfg.Source into the PostgreSQL
// database cfg.Target: it checks that the source's schema is this build's
// and that the target holds no rows (unless Replace) and none of another
// build's migrations, migrates the target, then copies every table and
// verifies it, in one transaction. The caller makes sure no process uses
// the source (backend.LockDataDir) and that the deployment secret opens
// its PKI bundle.
func Copy(ctx context.Context, cfg Config) (*Result, error) {
	start := time.Now()
	cfg.BatchRows = cmp.Or(cfg.BatchRows, DefaultBatchRows)
	if cfg.Source == "" || cfg.Target == "" {
		return nil, errors.New("store copy: a source file and a target URL are required")
	}
	lite, err := sqlite.OpenDB(ctx, cfg.Source)
	if err != nil {
		return nil, err
	}
	defer lite.Close()

	// The target's schema: none of another build's migrations.
	target, err := postgres.Open(ctx, cfg.Target)
	if err != nil {
		return nil, err
	}
	defer target.Close()
	status, err := target.MigrationStatus(ctx)
	if err != nil {
		return nil, fmt.Errorf("the target's schema: %w", err)
	}
	known := slices.Concat(status.Applied, status.Pending)
	slices.Sort(known)
	if err := checkSourceSchema(ctx, lite, known); err != nil {
		return nil, err
	}

	pgCfg, _, err := postgres.ParseURL(cfg.Target)
	if err != nil {
		return nil, err
	}
	pg, err := pgx.ConnectConfig(ctx, pgCfg.ConnConfig)
	if err != nil {
		return nil, fmt.Errorf("connect to the target: %w", err)
	}
	defer pg.Close(context.WithoutCancel(ctx))
	full, err := nonEmpty(ctx, pg)
	if err != nil {
		return nil, err
	}
	if len(full) > 0 && !cfg.Replace {
		return nil, &NotEmptyError{Tables: full}
	}

	res := &Result{}
	if res.Migrated, err = target.Migrate(ctx); err != nil {
		return nil, fmt.Errorf("migrate the target: %w", err)
	}
	plan, err := makePlan(ctx, lite, pg)
	if err != nil {
		return nil, err
	}
	src, err := lite.BeginTx(ctx, nil) // one snapshot of the source
	if err != nil {
		return nil, fmt.Errorf("read the source: %w", err)
	}
	defer src.Rollback()
	tx, err := pg.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin the copy: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if cfg.Replace {
		names := make([]string, len(plan))
		for i, t := range plan {
			names[i] = pgx.Identifier{t.name}.Sanitize()
		}
		if _, err := tx.Exec(ctx, "TRUNCATE "+strings.Join(names, ", ")+" RESTART IDENTITY"); err != nil {
			return nil, fmt.Errorf("empty the target (--replace): %w", err)
		}
	}
	copying := time.Now()
	for _, t := range plan {
		if cond, ok := seededRows[t.name]; ok && !cfg.Replace {
			if _, err := tx.Exec(ctx, `DELETE FROM `+pgx.Identifier{t.name}.Sanitize()+` WHERE `+cond); err != nil {
				return nil, fmt.Errorf("copy %s: remove the rows the target's migrations wrote: %w", t.name, err)
			}
		}
		tr, err := copyTable(ctx, cfg, src, tx, t)
		if err != nil {
			return nil, fmt.Errorf("copy %s: %w", t.name, err)
		}
		res.Tables = append(res.Tables, *tr)
		res.Rows += tr.Rows
	}
	res.Copying = time.Since(copying)
	verifying := time.Now()
	for _, want := range res.Tables {
		t := plan[slices.IndexFunc(plan, func(t *table) bool { return t.name == want.Name })]
		got, sum, err := targetSum(ctx, tx, t)
		if err != nil {
			return nil, fmt.Errorf("verify %s: %w", t.name, err)
		}
		if got != want.Rows || sum != want.Checksum {
			return nil, fmt.Errorf("%w: table %s has %d rows, checksum %s in the target; %d rows, checksum %s in the source (nothing was committed)",
				ErrVerify, t.name, got, sum, want.Rows, want.Checksum)
		}
	}
	res.Verifying = time.Since(verifying)
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit the copy: %w", err)
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// checkSourceSchema compares the source's applied migrations with known,
// this build's.
func checkSourceSchema(ctx context.Context, lite *sql.DB, known []string) error {
	rows, err := lite.QueryContext(ctx, `SELECT name FROM schema_migrations`)
	if err != nil {
		return fmt.Errorf("read the source's migrations: %w", err)
	}
	defer rows.Close()
	var applied []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return fmt.Errorf("read the source's migrations: %w", err)
		}
		applied = append(applied, n)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the source's migrations: %w", err)
	}
	e := &SchemaError{}
	for _, m := range known {
		if !slices.Contains(applied, m) {
			e.Missing = append(e.Missing, m)
		}
	}
	for _, m := range applied {
		if !slices.Contains(known, m) {
			e.Unknown = append(e.Unknown, m)
		}
	}
	if len(e.Missing) > 0 || len(e.Unknown) > 0 {
		return e
	}
	return nil
}

// nonEmpty lists the target's tables (of its current schema) that hold
// rows, the migration record left out.
func nonEmpty(ctx context.Context, pg *pgx.Conn) ([]string, error) {
	cols, _, err := pgTables(ctx, pg)
	if err != nil {
		return nil, err
	}
	var names, full []string
	for n := range cols {
		if !slices.Contains(skipTables, n) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		var any bool
		where := ""
		if cond, ok := seededRows[n]; ok {
			where = " WHERE NOT (" + cond + ")"
		}
		if err := pg.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+pgx.Identifier{n}.Sanitize()+where+`)`).Scan(&any); err != nil {
			return nil, fmt.Errorf("look into the target's %s: %w", n, err)
		}
		if any {
			full = append(full, n)
		}
	}
	return full, nil
}

// copyTable copies t from the source in batches, each one COPY statement
// fed row by row as the source is read (so that reading SQLite and
// PostgreSQL's writing overlap), and sets its identity sequences past the
// copied ids.
func copyTable(ctx context.Context, cfg Config, src *sql.Tx, tx pgx.Tx, t *table) (*TableResult, error) {
	res := &TableResult{Name: t.name}
	var total int64
	if err := src.QueryRowContext(ctx, `SELECT count(*) FROM "`+t.name+`"`).Scan(&total); err != nil {
		return nil, fmt.Errorf("count the source's rows: %w", err)
	}
	rows, err := src.QueryContext(ctx, `SELECT `+t.quoted("")+` FROM "`+t.name+`"`)
	if err != nil {
		return nil, fmt.Errorf("read the source: %w", err)
	}
	defer rows.Close()
	b := newBatchSource(rows, t, cfg.BatchRows, &res.Checksum)
	for !b.done {
		b.n = 0
		n, err := tx.CopyFrom(ctx, pgx.Identifier{t.name}, t.columnNames(), b)
		if err != nil {
			return nil, fmt.Errorf("write a batch of rows: %w", err)
		}
		res.Rows += n
		if cfg.Progress != nil && (n > 0 || b.done) {
			cfg.Progress(Progress{Table: t.name, Copied: res.Rows, Total: total})
		}
	}
	if res.Rows != total {
		return nil, fmt.Errorf("%w: copied %d rows of %d", ErrVerify, res.Rows, total)
	}
	for i, c := range t.columns {
		if !c.identity {
			continue
		}
		// AUTOINCREMENT never gives an id again, even one pruned since:
		// nor may the target (a sink's cursor is an outbox id).
		var seq sql.NullInt64
		err := src.QueryRowContext(ctx, `SELECT seq FROM sqlite_sequence WHERE name = $1`, t.name).Scan(&seq)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("read the source's sequence: %w", err)
		}
		next := max(b.maxID[i], seq.Int64)
		if _, err := tx.Exec(ctx, `SELECT setval(pg_get_serial_sequence(quote_ident(current_schema()) || '.' || quote_ident($1), $2), $3, $4)`,
			t.name, c.name, max(next, 1), next > 0); err != nil {
			return nil, fmt.Errorf("set the sequence of %s.%s: %w", t.name, c.name, err)
		}
	}
	return res, nil
}

// batchSource is a pgx.CopyFromSource over the source's rows of one table:
// it gives at most limit rows to one COPY, converting each to the target's
// types and adding it to the table's checksum as it goes; done once the
// rows are exhausted.
type batchSource struct {
	rows  *sql.Rows
	t     *table
	limit int
	n     int // rows given to the current COPY
	done  bool
	err   error
	sum   *Checksum
	maxID []int64 // per column: the largest identity value seen
	row   []any
	raw   []any
	ptrs  []any
	buf   []byte
}

func newBatchSource(rows *sql.Rows, t *table, limit int, sum *Checksum) *batchSource {
	b := &batchSource{rows: rows, t: t, limit: limit, sum: sum, maxID: make([]int64, len(t.columns)),
		raw: make([]any, len(t.columns)), ptrs: make([]any, len(t.columns))}
	for i := range b.raw {
		b.ptrs[i] = &b.raw[i]
	}
	return b
}

// Next reads the next row; false at the batch's end, at the table's end
// (done) or on an error (Err).
func (b *batchSource) Next() bool {
	if b.done || b.n >= b.limit {
		return false
	}
	if !b.rows.Next() {
		b.done = true
		if err := b.rows.Err(); err != nil {
			b.err = fmt.Errorf("read the source: %w", err)
		}
		return false
	}
	if err := b.rows.Scan(b.ptrs...); err != nil {
		b.err, b.done = fmt.Errorf("read the source: %w", err), true
		return false
	}
	b.row = make([]any, len(b.t.columns))
	b.buf = b.buf[:0]
	for i, c := range b.t.columns {
		v, err := c.fromSQLite(b.raw[i])
		if err == nil {
			b.buf, err = c.canonical(b.buf, v)
		}
		if err != nil {
			b.err, b.done = err, true
			return false
		}
		b.row[i] = v
		if id, ok := v.(int64); ok && c.identity {
			b.maxID[i] = max(b.maxID[i], id)
		}
	}
	b.sum.add(b.buf)
	b.n++
	return true
}

// Values is the row Next read, in the target's types.
func (b *batchSource) Values() ([]any, error) { return b.row, nil }

// Err is what ended the rows early, if anything.
func (b *batchSource) Err() error { return b.err }

// targetSum counts and checksums t in the target.
func targetSum(ctx context.Context, tx pgx.Tx, t *table) (int64, Checksum, error) {
	var sum Checksum
	rows, err := tx.Query(ctx, `SELECT `+t.quoted("::text")+` FROM `+pgx.Identifier{t.name}.Sanitize())
	if err != nil {
		return 0, sum, err
	}
	defer rows.Close()
	var n int64
	var buf []byte
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return 0, sum, err
		}
		buf = buf[:0]
		for i, c := range t.columns {
			if buf, err = c.canonical(buf, vals[i]); err != nil {
				return 0, sum, err
			}
		}
		sum.add(buf)
		n++
	}
	return n, sum, rows.Err()
}
