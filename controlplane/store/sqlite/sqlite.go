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
	"os"
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

// dsn is the driver's data source name for the database file at path,
// with the pragmas every connection runs when it opens.
func dsn(path string) string {
	q := url.Values{}
	for _, p := range []string{"journal_mode(WAL)", "busy_timeout(10000)", "synchronous(NORMAL)", "foreign_keys(1)"} {
		q.Add("_pragma", p)
	}
	return "file:" + path + "?" + q.Encode()
}

// FileMode is the mode of the database file and its -wal and -shm files:
// they hold command output, the audit log and token hashes.
const FileMode = 0o600

// Open opens (creating if needed) the database file at path, mode
// FileMode, and sets FileMode on the file and its -wal and -shm files when
// they exist with another (a file made by an earlier build, or copied in).
// It does not migrate; call Migrate.
func Open(ctx context.Context, path string) (*queries.Store, error) {
	if err := registerOnce(); err != nil {
		return nil, fmt.Errorf("register sqlite functions: %w", err)
	}
	if err := restrictFiles(path); err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	db, err := sql.Open("sqlite", dsn(path))
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	// One connection writes (held by the pool), the others read.
	// Connections are kept, not closed when more than database/sql's
	// default two are idle: each holds its prepared statements and the
	// schema it read on opening.
	db.SetMaxOpenConns(1 + readers)
	db.SetMaxIdleConns(1 + readers)
	p, err := newPool(ctx, db)
	if err != nil {
		db.Close()
		return nil, explainDamage(path, fmt.Errorf("open sqlite %s: %w", path, err))
	}
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		p.Close()
		return nil, err
	}
	return queries.New(p, &queries.Dialect{
		Name:       store.DialectSQLite,
		Translate:  translate,
		TextSet:    "SELECT value FROM json_each(%s)",
		IntSet:     "SELECT value FROM json_each(%s)",
		HasGPUs:    "COALESCE(json_array_length(%s, '$.gpus'), 0) > 0",
		Migrations: sub,
	}), nil
}

// restrictFiles creates the database file at path with FileMode when it
// does not exist, so that SQLite, which gives its -wal and -shm files the
// database file's mode, never makes one more open, and sets FileMode on the
// three when they exist with another.
func restrictFiles(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, FileMode)
	if err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		if fi.Mode().Perm() != FileMode {
			if err := os.Chmod(p, FileMode); err != nil {
				return fmt.Errorf("restrict %s to mode %o: %w", p, FileMode, err)
			}
		}
	}
	return nil
}

// ErrDamaged marks a database file SQLite finds corrupt or not a
// database at all (SQLITE_CORRUPT, SQLITE_NOTADB): a truncated or
// overwritten file, which no retry mends.
var ErrDamaged = errors.New("the database file is damaged")

// explainDamage returns err unchanged unless SQLite found path's file
// corrupt or not a database; then an error (ErrDamaged) that names the
// file, how to check it and how to restore it (issue 29; docs/security.md,
// "Backups"), wrapping err.
func explainDamage(path string, err error) error {
	var e *sqlite.Error
	if !errors.As(err, &e) {
		return err
	}
	if c := e.Code() & 0xff; c != sqlite3.SQLITE_CORRUPT && c != sqlite3.SQLITE_NOTADB {
		return err
	}
	return fmt.Errorf("%w: %w\n"+
		"  The embedded database %s is truncated or corrupt; better-compute will not start on it.\n"+
		"  Check it: sqlite3 %s 'PRAGMA integrity_check'\n"+
		"  Restore the latest backup to that path (with serve stopped), then start again; backups are\n"+
		"  taken, while serve runs, with: sqlite3 %s \".backup '%s.bak'\"\n"+
		"  (or better-compute backup --out FILE; restore one with better-compute restore --from FILE --data-dir NEW_DIR)\n"+
		"  Nodes keep their identities: they reconnect once the control plane is back",
		ErrDamaged, err, path, path, path, path)
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
		if e.Code()&0xff == sqlite3.SQLITE_FULL {
			return fmt.Errorf("%w: %s", store.ErrDiskFull, e.Error())
		}
	}
	return err
}

// readers is how many connections serve reads beside the writer's.
const readers = 7

// execer is what database/sql's DB and Conn share.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// conn runs statements on x, through prepared statements from cache for
// those with arguments (a statement without any may be a script of
// several, a migration, which only the text path runs whole).
type conn struct {
	x     execer
	cache *stmtCache
}

func (c conn) stmt(ctx context.Context, q string, nargs int) *sql.Stmt {
	if nargs == 0 {
		return nil
	}
	return c.cache.get(ctx, q, nargs)
}

func (c conn) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	var r sql.Result
	var err error
	if st := c.stmt(ctx, q, len(args)); st != nil {
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

// Bounds of a statement cache: statements with more arguments are built
// for one batch (a heartbeat flush of N sessions) and not kept.
const (
	maxCachedStmts = 512
	maxCachedArgs  = 32
)

// stmtCache keeps one prepared statement per query text, prepared by
// prepare (on the readers' DB, or on the writer's connection). Without it
// every call parsed and planned its SQL again: a sixth of serve's CPU
// during a burst of joins.
type stmtCache struct {
	prepare func(ctx context.Context, q string) (*sql.Stmt, error)
	mu      sync.Mutex
	m       map[string]*sql.Stmt
}

func newStmtCache(prepare func(ctx context.Context, q string) (*sql.Stmt, error)) *stmtCache {
	return &stmtCache{prepare: prepare, m: map[string]*sql.Stmt{}}
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
	st, err := c.prepare(ctx, q)
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

// pool runs reads on the reader connections and every write (a
// transaction, or a statement that is not a SELECT) on the one writer
// connection it holds, one at a time, first come first served.
//
// SQLite takes one writer at a time. Left to database/sql's pool, writers
// each took a connection and then waited for the write lock in SQLite's
// busy handler, which sleeps (1, 2, 5 ... 100 ms) however soon the lock
// frees, holding the connection meanwhile: under a reconnect storm the
// waiting writers held most connections, reads queued behind them, and
// sessions timed out. Here a writer waits for its turn without a
// connection and is woken as soon as the previous write ends; reads never
// wait for writers (WAL). The busy timeout remains for writers in other
// processes (the CLI's migrate, a second serve on the same file).
type pool struct {
	db    *sql.DB
	reads *stmtCache

	// gate holds a token while a write runs on w.
	gate   chan struct{}
	w      *sql.Conn
	writes *stmtCache
	// begin, commit and rollback are prepared once on w.
	beginStmt, commitStmt, rollbackStmt *sql.Stmt
}

func newPool(ctx context.Context, db *sql.DB) (*pool, error) {
	w, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	p := &pool{
		db:     db,
		reads:  newStmtCache(db.PrepareContext),
		gate:   make(chan struct{}, 1),
		w:      w,
		writes: newStmtCache(w.PrepareContext),
	}
	for _, st := range []struct {
		dst **sql.Stmt
		sql string
	}{{&p.beginStmt, "BEGIN IMMEDIATE"}, {&p.commitStmt, "COMMIT"}, {&p.rollbackStmt, "ROLLBACK"}} {
		if *st.dst, err = w.PrepareContext(ctx, st.sql); err != nil {
			w.Close()
			return nil, fmt.Errorf("prepare %s: %w", st.sql, err)
		}
	}
	return p, nil
}

// lock waits for the writer's turn or for ctx.
func (p *pool) lock(ctx context.Context) error {
	select {
	case p.gate <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for the database's writer: %w", ctx.Err())
	}
}

func (p *pool) unlock() { <-p.gate }

func (p *pool) reader() conn { return conn{x: p.db, cache: p.reads} }
func (p *pool) writer() conn { return conn{x: p.w, cache: p.writes} }

// isRead reports whether q is a plain SELECT, which writes nothing.
func isRead(q string) bool {
	q = strings.TrimLeft(q, " \t\r\n(")
	return len(q) >= 6 && strings.EqualFold(q[:6], "select")
}

func (p *pool) Exec(ctx context.Context, q string, args ...any) (int64, error) {
	if isRead(q) {
		return p.reader().Exec(ctx, q, args...)
	}
	if err := p.lock(ctx); err != nil {
		return 0, err
	}
	defer p.unlock()
	return p.writer().Exec(ctx, q, args...)
}

func (p *pool) Query(ctx context.Context, q string, args ...any) (queries.Rows, error) {
	if isRead(q) {
		return p.reader().Query(ctx, q, args...)
	}
	if err := p.lock(ctx); err != nil {
		return nil, err
	}
	r, err := p.writer().Query(ctx, q, args...)
	if err != nil {
		p.unlock()
		return nil, err
	}
	return &writeRows{Rows: r, unlock: p.unlock}, nil
}

func (p *pool) QueryRow(ctx context.Context, q string, args ...any) queries.Row {
	if isRead(q) {
		return p.reader().QueryRow(ctx, q, args...)
	}
	if err := p.lock(ctx); err != nil {
		return errRow{err}
	}
	return &writeRow{Row: p.writer().QueryRow(ctx, q, args...), unlock: p.unlock}
}

// Begin starts a write transaction (BEGIN IMMEDIATE) on the writer
// connection once it is this caller's turn; the turn ends with Commit or
// Rollback. Its statements, reads included, run on that connection.
func (p *pool) Begin(ctx context.Context) (queries.Tx, error) {
	if err := p.lock(ctx); err != nil {
		return nil, err
	}
	if _, err := p.beginStmt.ExecContext(ctx); err != nil {
		// A context that ends while BEGIN runs may report its error after
		// the transaction began: end it, or the connection stays in it.
		p.rollback(ctx)
		p.unlock()
		return nil, err
	}
	return &tx{conn: p.writer(), p: p}, nil
}

// rollback ends the writer connection's transaction, if any, whatever
// the state of ctx. SQLite also rolls a transaction back itself after
// some errors (an interrupted statement, a full disk), so "no transaction
// is active" is not an error here.
func (p *pool) rollback(ctx context.Context) error {
	_, err := p.rollbackStmt.ExecContext(context.WithoutCancel(ctx))
	if err != nil && strings.Contains(err.Error(), "no transaction is active") {
		return nil
	}
	return err
}

func (p *pool) Ping(ctx context.Context) error { return p.db.PingContext(ctx) }

func (p *pool) Close() error {
	p.reads.close()
	p.writes.close()
	for _, st := range []*sql.Stmt{p.beginStmt, p.commitStmt, p.rollbackStmt} {
		st.Close()
	}
	p.w.Close()
	return p.db.Close()
}

// writeRows ends the writer's turn when closed: the statement holds the
// write lock until then.
type writeRows struct {
	queries.Rows
	unlock func()
	once   sync.Once
}

func (r *writeRows) Close() {
	r.Rows.Close()
	r.once.Do(r.unlock)
}

// writeRow ends the writer's turn once scanned (database/sql closes the
// statement in Scan).
type writeRow struct {
	queries.Row
	unlock func()
	once   sync.Once
}

func (r *writeRow) Scan(dest ...any) error {
	defer r.once.Do(r.unlock)
	return r.Row.Scan(dest...)
}

// errRow is a Row whose Scan returns err.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// tx is a write transaction on the writer connection. COMMIT and ROLLBACK
// run even when the caller's context has ended, so that the connection
// never stays inside a transaction.
type tx struct {
	conn
	p    *pool
	done bool
}

func (t *tx) Commit(ctx context.Context) error {
	if t.done {
		return sql.ErrTxDone
	}
	t.done = true
	defer t.p.unlock()
	if _, err := t.p.commitStmt.ExecContext(context.WithoutCancel(ctx)); err != nil {
		// A failed COMMIT leaves the transaction open.
		_ = t.p.rollback(ctx)
		return err
	}
	return nil
}

func (t *tx) Rollback(ctx context.Context) error {
	if t.done {
		return sql.ErrTxDone
	}
	t.done = true
	defer t.p.unlock()
	return t.p.rollback(ctx)
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

// OpenDB opens the database file at path as a plain database/sql handle,
// with the pragmas and functions of Open, for the operator commands that
// read or write a whole database at once (store copy, backup, restore)
// rather than through the store. It does not create the file: a path with
// no database fails.
func OpenDB(ctx context.Context, path string) (*sql.DB, error) {
	if err := registerOnce(); err != nil {
		return nil, fmt.Errorf("register sqlite functions: %w", err)
	}
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	db, err := sql.Open("sqlite", dsn(path))
	if err != nil {
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, explainDamage(path, fmt.Errorf("open sqlite %s: %w", path, err))
	}
	return db, nil
}
