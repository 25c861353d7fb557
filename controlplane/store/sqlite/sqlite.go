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
	"strings"
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
	return queries.New(newPool(db), &queries.Dialect{
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

// conn runs statements on the database (tx nil) or in a transaction,
// through the statement cache.
type conn struct {
	x     execer
	tx    *sql.Tx
	cache *stmtCache
}

// stmt returns the prepared form of q for this conn, or nil to run q as
// text.
func (c conn) stmt(ctx context.Context, q string, nargs int) *sql.Stmt {
	st := c.cache.get(ctx, q, nargs)
	if st == nil || c.tx == nil {
		return st
	}
	// Reuses the statement where the transaction's connection has it
	// prepared already; closed with the transaction.
	return c.tx.StmtContext(ctx, st)
}

func (c conn) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	var r sql.Result
	var err error
	// A statement without arguments may be a script of several (a
	// migration), which only the text path runs whole.
	var st *sql.Stmt
	if len(args) > 0 {
		st = c.stmt(ctx, q, len(args))
	}
	if st != nil {
		r, err = st.ExecContext(ctx, bind(args)...)
	} else {
		r, err = c.x.ExecContext(ctx, q, bind(args)...)
	}
	if err != nil {
		return 0, err
	}
	return r.RowsAffected()
}

func (c conn) Query(ctx context.Context, q string, args ...any) (queries.Rows, error) {
	var r *sql.Rows
	var err error
	if st := c.stmt(ctx, q, len(args)); st != nil {
		r, err = st.QueryContext(ctx, bind(args)...)
	} else {
		r, err = c.x.QueryContext(ctx, q, bind(args)...)
	}
	if err != nil {
		return nil, err
	}
	return rows{r}, nil
}

func (c conn) QueryRow(ctx context.Context, q string, args ...any) queries.Row {
	if st := c.stmt(ctx, q, len(args)); st != nil {
		return row{st.QueryRowContext(ctx, bind(args)...)}
	}
	return row{c.x.QueryRowContext(ctx, q, bind(args)...)}
}

// Bounds of the statement cache: statements with more arguments are
// built for one batch (a heartbeat flush of N sessions) and not kept.
const (
	maxCachedStmts = 512
	maxCachedArgs  = 32
)

// stmtCache keeps one prepared statement per query text. database/sql
// prepares each on a connection the first time it runs there and reuses
// it after, also inside transactions; without it every call parsed and
// planned its SQL again, a sixth of serve's CPU during a burst of joins.
type stmtCache struct {
	db *sql.DB
	mu sync.Mutex
	m  map[string]*sql.Stmt
}

// get returns the cached statement for q, preparing it on first use; nil
// when q is not cached (too many arguments, the cache full, or a
// statement that does not prepare, whose error the text path reports).
func (c *stmtCache) get(ctx context.Context, q string, nargs int) *sql.Stmt {
	if nargs > maxCachedArgs {
		return nil
	}
	c.mu.Lock()
	st, ok := c.m[q]
	full := len(c.m) >= maxCachedStmts
	c.mu.Unlock()
	if ok || full {
		return st
	}
	st, err := c.db.PrepareContext(ctx, q)
	if err != nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if prev, ok := c.m[q]; ok {
		st.Close()
		return prev
	}
	c.m[q] = st
	return st
}

func (c *stmtCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for q, st := range c.m {
		st.Close()
		delete(c.m, q)
	}
}

// pool runs statements on the database's connections. SQLite takes one
// writer at a time, and a writer that finds the write lock taken sleeps in
// SQLite's busy handler (1 ms, then 2, 5, 10, up to 100 ms) however soon
// the lock frees: under a burst of joins most of the time went to those
// sleeps. So writes wait their turn here instead, first come first served,
// and are woken as soon as the previous one ends; the busy timeout remains
// for writers in other processes (the CLI's migrate, a second serve on the
// same file). Reads are not gated: WAL lets them run beside the writer.
type pool struct {
	db    *sql.DB
	cache *stmtCache
	// writer holds a token while a write (a transaction, which is BEGIN
	// IMMEDIATE, or a statement that is not a SELECT) runs.
	writer chan struct{}
}

func newPool(db *sql.DB) *pool {
	return &pool{db: db, cache: &stmtCache{db: db, m: map[string]*sql.Stmt{}}, writer: make(chan struct{}, 1)}
}

func (p *pool) conn() conn { return conn{x: p.db, cache: p.cache} }

// lock waits for the writer's turn or for ctx.
func (p *pool) lock(ctx context.Context) error {
	select {
	case p.writer <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for the database's write lock: %w", ctx.Err())
	}
}

func (p *pool) unlock() { <-p.writer }

// isRead reports whether q is a plain SELECT, which takes no write lock.
func isRead(q string) bool {
	q = strings.TrimLeft(q, " \t\r\n(")
	return len(q) >= 6 && strings.EqualFold(q[:6], "select")
}

func (p *pool) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	if !isRead(q) {
		if err := p.lock(ctx); err != nil {
			return 0, err
		}
		defer p.unlock()
	}
	return p.conn().Exec(ctx, q, args...)
}

func (p *pool) Query(ctx context.Context, q string, args ...any) (queries.Rows, error) {
	if isRead(q) {
		return p.conn().Query(ctx, q, args...)
	}
	if err := p.lock(ctx); err != nil {
		return nil, err
	}
	r, err := p.conn().Query(ctx, q, args...)
	if err != nil {
		p.unlock()
		return nil, err
	}
	// The statement holds the write lock until its rows are closed.
	return &lockedRows{Rows: r, unlock: p.unlock}, nil
}

func (p *pool) QueryRow(ctx context.Context, q string, args ...any) queries.Row {
	if isRead(q) {
		return p.conn().QueryRow(ctx, q, args...)
	}
	if err := p.lock(ctx); err != nil {
		return errRow{err}
	}
	return &lockedRow{Row: p.conn().QueryRow(ctx, q, args...), unlock: p.unlock}
}

func (p *pool) Begin(ctx context.Context) (queries.Tx, error) {
	if err := p.lock(ctx); err != nil {
		return nil, err
	}
	t, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		p.unlock()
		return nil, err
	}
	return &tx{conn: conn{x: t, tx: t, cache: p.cache}, t: t, unlock: p.unlock}, nil
}

func (p *pool) Ping(ctx context.Context) error { return p.db.PingContext(ctx) }
func (p *pool) Close() error {
	p.cache.close()
	return p.db.Close()
}

// lockedRows releases the writer's turn when closed.
type lockedRows struct {
	queries.Rows
	unlock func()
	once   sync.Once
}

func (r *lockedRows) Close() {
	r.Rows.Close()
	r.once.Do(r.unlock)
}

// lockedRow releases the writer's turn once scanned (database/sql closes
// the statement in Scan).
type lockedRow struct {
	queries.Row
	unlock func()
	once   sync.Once
}

func (r *lockedRow) Scan(dest ...any) error {
	defer r.once.Do(r.unlock)
	return r.Row.Scan(dest...)
}

// errRow is a Row whose Scan returns err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type tx struct {
	conn
	t      *sql.Tx
	unlock func()
	once   sync.Once
}

func (t *tx) Commit(context.Context) error {
	defer t.once.Do(t.unlock)
	return t.t.Commit()
}

func (t *tx) Rollback(context.Context) error {
	defer t.once.Do(t.unlock)
	return t.t.Rollback()
}

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
