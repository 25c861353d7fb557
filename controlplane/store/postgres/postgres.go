// Package postgres is the production store backend: PostgreSQL 15+ through
// pgx v5 (pgxpool), for any number of processes (DESIGN.md, "Storage").
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/internal/queries"
)

//go:embed migrations/*.sql
var migrations embed.FS

// IdleInTransactionTimeout is how long the server lets a session of the
// store sit idle inside a transaction before it ends the session (and so
// the transaction and its locks). It is a third of the leases' 15 s TTL:
// a lease renewal stalled behind a stuck transaction still lands before the
// lease expires. A control-plane transaction idles only between its own
// statements, except the gateway's claim while it sends the claimed commands;
// a claim rolled back leaves its commands queued, to be sent again.
const IdleInTransactionTimeout = 5 * time.Second

// OutboxChannel is the NOTIFY channel on which every transaction that
// writes to the outbox tells, at its commit, the outbox readers of other
// processes (the api's event feed; they LISTEN with wake.ListenChannels).
// A notification is a hint only: the readers also poll.
const OutboxChannel = "better_compute_outbox"

// EnvFenceTag, set to any value in a process's environment, makes every
// fenced transaction of its stores set FenceTagSetting, local to the
// transaction, to "<lease> <holder> <epoch>" after the fence check, so that
// a trigger a test installs can record, with every row a fenced transaction
// writes, the lease and epoch it was written under (tests/soak). Unset, the
// production case, fenced transactions run no extra statement.
const EnvFenceTag = "BETTER_COMPUTE_TEST_FENCE_TAG"

// FenceTagSetting is the custom setting EnvFenceTag fills; a trigger reads
// it with current_setting('better_compute.fence', true).
const FenceTagSetting = "better_compute.fence"

// Open connects to the database at url (a postgres:// URL or a key=value
// connection string). It does not migrate; call Migrate.
func Open(ctx context.Context, url string) (*queries.Store, error) {
	cfg, timeout, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	// A session left idle inside a transaction (its process paused, or cut
	// off between two statements) keeps its row locks, among them a
	// fence's FOR SHARE on a lease row, which stalls every renewal and
	// takeover of that lease and the shard rounds waiting on it: every
	// transaction of the store asks the server to end its session after
	// the timeout, with SET LOCAL in the statement that begins it (one
	// round trip, simple protocol).
	begin := pgx.TxOptions{BeginQuery: "BEGIN; SET LOCAL " + idleTimeoutParam + " = " + timeout}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	if err := p.Ping(ctx); err != nil {
		p.Close()
		return nil, fmt.Errorf("connect to postgres %s:%d: %w", cfg.ConnConfig.Host, cfg.ConnConfig.Port, err)
	}
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return nil, err
	}
	return queries.New(&pool{p: p, begin: begin}, &queries.Dialect{
		Name:      store.DialectPostgres,
		Translate: translate,
		// One lock per schema, held until the migration transaction ends.
		MigrationLock: `SELECT pg_advisory_xact_lock(hashtext('better-compute migrate ' || current_schema()))`,
		ForShare:      " FOR SHARE",
		ForUpdate:     " FOR UPDATE",
		LockParent:    " FOR NO KEY UPDATE",
		SkipLocked:    " FOR UPDATE OF c SKIP LOCKED",
		TextSet:       "SELECT jsonb_array_elements_text(%s)",
		IntSet:        "SELECT jsonb_array_elements_text(%s)::int",
		HasGPUs:       "COALESCE(%s -> 'gpus', '[]'::jsonb) <> '[]'::jsonb",
		Migrations:    sub,
		// One lock per schema: writers share it, a reader excludes them.
		OutboxWriteLock: `SELECT pg_advisory_xact_lock_shared(hashtext('better-compute outbox ' || current_schema()))`,
		OutboxReadLock:  `SELECT pg_advisory_xact_lock(hashtext('better-compute outbox ' || current_schema()))`,
		OutboxNotify:    `SELECT pg_notify('` + OutboxChannel + `', '')`,
		FenceTag:        fenceTag(),
	}), nil
}

// fenceTag is the Dialect's FenceTag statement when EnvFenceTag is set.
func fenceTag() string {
	if os.Getenv(EnvFenceTag) == "" {
		return ""
	}
	return `SELECT set_config('` + FenceTagSetting + `', $1, true)`
}

// translate maps driver errors to the store's.
func translate(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return store.ErrNotFound
	}
	var e *pgconn.PgError
	if errors.As(err, &e) {
		switch e.Code {
		case "23505": // unique_violation
			return fmt.Errorf("%w: %s", store.ErrConflict, e.Message)
		case "23503": // foreign_key_violation
			return fmt.Errorf("%w: referenced row: %s", store.ErrNotFound, e.Message)
		case "23P01": // exclusion_violation: a reservation slot overlapping another (0015_reservations)
			return fmt.Errorf("%w: %s", store.ErrConflict, e.Message)
		case "53100": // disk_full
			return fmt.Errorf("%w: %s", store.ErrDiskFull, e.Message)
		case "57P01", "57P02", "57P03", // admin_shutdown, crash_shutdown, cannot_connect_now
			"25006": // read_only_sql_transaction: a standby, not yet promoted
			return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
		}
		if strings.HasPrefix(e.Code, "08") { // connection_exception
			return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
		}
		return err
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	if errors.As(err, &ce) || errors.As(err, &ne) && !errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, io.ErrUnexpectedEOF) || pgconn.SafeToRetry(err) {
		return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	return err
}

// querier is what pgxpool.Pool and pgx.Tx share.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type conn struct{ q querier }

func (c conn) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := c.q.Exec(ctx, sql, bind(args)...)
	return tag.RowsAffected(), err
}

func (c conn) Query(ctx context.Context, sql string, args ...any) (queries.Rows, error) {
	r, err := c.q.Query(ctx, sql, bind(args)...)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (c conn) QueryRow(ctx context.Context, sql string, args ...any) queries.Row {
	return c.q.QueryRow(ctx, sql, bind(args)...)
}

// ParseURL parses a database URL (a postgres:// URL or a key=value
// connection string) for a pgx pool the way every part of the control plane
// connects: idle_in_transaction_session_timeout, when the URL sets it, is
// taken out of the startup parameters (PgBouncer in transaction mode
// refuses a startup parameter it does not know) and returned as
// idleTimeout, a SQL literal for the store's SET LOCAL;
// IdleInTransactionTimeout in milliseconds otherwise. It fails for a URL
// pgx cannot parse or a timeout that is not milliseconds or a number with
// ms, s, min or h.
func ParseURL(url string) (cfg *pgxpool.Config, idleTimeout string, err error) {
	cfg, err = pgxpool.ParseConfig(url)
	if err != nil {
		return nil, "", fmt.Errorf("parse database url: %w", err)
	}
	idleTimeout = strconv.Itoa(int(IdleInTransactionTimeout.Milliseconds()))
	if v, ok := cfg.ConnConfig.RuntimeParams[idleTimeoutParam]; ok {
		if !timeoutValue.MatchString(v) {
			return nil, "", fmt.Errorf("parse database url: %s=%q: want milliseconds or a number with ms, s, min or h", idleTimeoutParam, v)
		}
		idleTimeout = "'" + v + "'"
		delete(cfg.ConnConfig.RuntimeParams, idleTimeoutParam)
	}
	return cfg, idleTimeout, nil
}

// idleTimeoutParam is the server setting IdleInTransactionTimeout sets.
const idleTimeoutParam = "idle_in_transaction_session_timeout"

// timeoutValue is what a URL may give idleTimeoutParam.
var timeoutValue = regexp.MustCompile(`^[0-9]+(ms|s|min|h)?$`)

type pool struct {
	p     *pgxpool.Pool
	begin pgx.TxOptions // BEGIN, then SET LOCAL of idleTimeoutParam
}

func (p *pool) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	return conn{p.p}.Exec(ctx, sql, args...)
}

func (p *pool) Query(ctx context.Context, sql string, args ...any) (queries.Rows, error) {
	return conn{p.p}.Query(ctx, sql, args...)
}

func (p *pool) QueryRow(ctx context.Context, sql string, args ...any) queries.Row {
	return conn{p.p}.QueryRow(ctx, sql, args...)
}

func (p *pool) Begin(ctx context.Context) (queries.Tx, error) {
	t, err := p.p.BeginTx(ctx, p.begin)
	if err != nil {
		return nil, err
	}
	return &tx{conn: conn{t}, t: t}, nil
}

func (p *pool) Ping(ctx context.Context) error { return p.p.Ping(ctx) }
func (p *pool) Close() error                   { p.p.Close(); return nil }

type tx struct {
	conn
	t pgx.Tx
}

func (t *tx) Commit(ctx context.Context) error   { return t.t.Commit(ctx) }
func (t *tx) Rollback(ctx context.Context) error { return t.t.Rollback(ctx) }

// bind converts JSON arguments to strings (nil to SQL NULL). A string
// binds as a jsonb parameter in every pgx exec mode
// (default_query_exec_mode in the URL): the modes that describe the
// statement encode it as jsonb, and exec and simple_protocol send it as
// text of unknown type, which the server reads as the jsonb the statement
// wants. []byte would go as bytea in the last two ("invalid input syntax
// for type json").
func bind(args []any) []any {
	out := args
	for i, a := range args {
		if v, ok := a.(queries.JSON); ok {
			if &out[0] == &args[0] {
				out = append([]any(nil), args...)
			}
			if v == nil {
				out[i] = nil
			} else {
				out[i] = string(v)
			}
		}
	}
	return out
}
