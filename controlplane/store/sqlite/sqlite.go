// Package sqlite is the embedded store backend: SQLite through the pure-Go
// modernc.org/sqlite driver (no cgo), in WAL mode with a busy timeout and
// foreign keys on. One process, all roles (DESIGN.md, "Storage").
package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"sync"
	"time"

	sqlite "modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/internal/queries"
)

//go:embed migrations/*.sql
var migrations embed.FS

// registerOnce registers now() and bc_micros() with the driver; the driver
// keeps registrations process-wide, so they are made once.
var registerOnce = sync.OnceValue(func() error {
	if err := sqlite.RegisterScalarFunction("now", 0, func(*sqlite.FunctionContext, []driver.Value) (driver.Value, error) {
		return time.Now().UnixMicro(), nil
	}); err != nil {
		return err
	}
	return sqlite.RegisterDeterministicScalarFunction("bc_micros", 1, func(_ *sqlite.FunctionContext, args []driver.Value) (driver.Value, error) {
		return args[0], nil
	})
})

// Open opens (creating if needed) the database file at path. It does not
// migrate; call Migrate.
func Open(ctx context.Context, path string) (*queries.Store, error) {
	if err := registerOnce(); err != nil {
		return nil, fmt.Errorf("register sqlite functions: %w", err)
	}
	q := url.Values{}
	for _, p := range []string{"journal_mode(WAL)", "busy_timeout(10000)", "synchronous(NORMAL)", "foreign_keys(1)"} {
		q.Add("_pragma", p)
	}
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	db.SetMaxOpenConns(8)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return nil, err
	}
	return queries.New(&pool{db: db}, &queries.Dialect{
		Name:       store.DialectSQLite,
		Translate:  translate,
		Migrations: sub,
	}), nil
}

// translate maps driver errors to the store's.
func translate(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return store.ErrNotFound
	}
	var e *sqlite.Error
	if errors.As(err, &e) {
		switch e.Code() {
		case sqlite3.SQLITE_CONSTRAINT_UNIQUE, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
			return fmt.Errorf("%w: %s", store.ErrConflict, e.Error())
		case sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY:
			return fmt.Errorf("%w: referenced row: %s", store.ErrNotFound, e.Error())
		}
	}
	return err
}

// execer is what database/sql's DB and Tx share.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

type conn struct{ x execer }

func (c conn) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	r, err := c.x.ExecContext(ctx, q, bind(args)...)
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}

func (c conn) Query(ctx context.Context, q string, args ...any) (queries.Rows, error) {
	r, err := c.x.QueryContext(ctx, q, bind(args)...)
	if err != nil {
		return nil, err
	}
	return rows{r}, nil
}

func (c conn) QueryRow(ctx context.Context, q string, args ...any) queries.Row {
	return row{c.x.QueryRowContext(ctx, q, bind(args)...)}
}

type pool struct{ db *sql.DB }

func (p *pool) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	return conn{p.db}.Exec(ctx, q, args...)
}

func (p *pool) Query(ctx context.Context, q string, args ...any) (queries.Rows, error) {
	return conn{p.db}.Query(ctx, q, args...)
}

func (p *pool) QueryRow(ctx context.Context, q string, args ...any) queries.Row {
	return conn{p.db}.QueryRow(ctx, q, args...)
}

func (p *pool) Begin(ctx context.Context) (queries.Tx, error) {
	t, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return &tx{conn: conn{t}, t: t}, nil
}

func (p *pool) Ping(ctx context.Context) error { return p.db.PingContext(ctx) }
func (p *pool) Close() error                   { return p.db.Close() }

type tx struct {
	conn
	t *sql.Tx
}

func (t *tx) Commit(context.Context) error   { return t.t.Commit() }
func (t *tx) Rollback(context.Context) error { return t.t.Rollback() }

// bind converts arguments to what the schema stores: times as Unix
// microseconds, JSON as text.
func bind(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case time.Time:
			out[i] = v.UnixMicro()
		case *time.Time:
			if v == nil {
				out[i] = nil
			} else {
				out[i] = v.UnixMicro()
			}
		case queries.JSON:
			if v == nil {
				out[i] = nil
			} else {
				out[i] = string(v)
			}
		default:
			out[i] = a
		}
	}
	return out
}

// scanner is what sql.Row and sql.Rows share.
type scanner interface{ Scan(dest ...any) error }

// scanTimes scans src into dest, reading time columns as Unix microseconds.
func scanTimes(src scanner, dest []any) error {
	conv := make([]any, len(dest))
	var fix []func()
	for i, d := range dest {
		switch p := d.(type) {
		case *time.Time:
			var us int64
			conv[i] = &us
			fix = append(fix, func() { *p = time.UnixMicro(us).UTC() })
		case **time.Time:
			var us sql.NullInt64
			conv[i] = &us
			fix = append(fix, func() {
				*p = nil
				if us.Valid {
					t := time.UnixMicro(us.Int64).UTC()
					*p = &t
				}
			})
		default:
			conv[i] = d
		}
	}
	if err := src.Scan(conv...); err != nil {
		return err
	}
	for _, f := range fix {
		f()
	}
	return nil
}

type row struct{ r *sql.Row }

func (r row) Scan(dest ...any) error { return scanTimes(r.r, dest) }

type rows struct{ r *sql.Rows }

func (r rows) Next() bool             { return r.r.Next() }
func (r rows) Scan(dest ...any) error { return scanTimes(r.r, dest) }
func (r rows) Err() error             { return r.r.Err() }
func (r rows) Close()                 { _ = r.r.Close() }
