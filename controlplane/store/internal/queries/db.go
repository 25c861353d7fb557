// Package queries is the one SQL implementation of store.Store that both
// backends share. Each backend supplies a connection pool (database/sql for
// SQLite, pgxpool for PostgreSQL) behind the small interfaces below and a
// Dialect for the few real differences; every query is written once.
//
// Two database functions make the SQL portable: now() (PostgreSQL's own; on
// SQLite the backend registers one returning Unix microseconds) and
// bc_micros(n), an interval of n microseconds (a migration defines it on
// PostgreSQL; on SQLite it returns n).
package queries

import (
	"context"
	"io/fs"

	"github.com/better-compute/better-compute/controlplane/store"
)

// DB runs statements: a pool or a transaction.
type DB interface {
	// Exec runs a statement and returns the number of rows it affected.
	Exec(ctx context.Context, sql string, args ...any) (int64, error)
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) Row
}

// Rows iterates a result set.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Row is one result row; Scan returns a backend "no rows" error when empty.
type Row interface {
	Scan(dest ...any) error
}

// Pool is a backend's connection pool.
type Pool interface {
	DB
	Begin(ctx context.Context) (Tx, error)
	Ping(ctx context.Context) error
	Close() error
}

// Tx is an open transaction.
type Tx interface {
	DB
	Commit(ctx context.Context) error
	Rollback(ctx context.Context) error
}

// JSON marks an argument as a JSON document; backends bind it as text
// (SQLite) or jsonb (PostgreSQL). A nil JSON binds SQL NULL.
type JSON []byte

// Dialect is what differs between backends.
type Dialect struct {
	// Name is the backend's dialect.
	Name store.Dialect
	// Translate maps a driver error to store.ErrNotFound or
	// store.ErrConflict where it means that, and returns it unchanged
	// otherwise.
	Translate func(error) error
	// MigrationLock is run first in the migration transaction to serialise
	// migrators (PostgreSQL: an advisory transaction lock); empty when the
	// transaction itself is exclusive (SQLite's BEGIN IMMEDIATE).
	MigrationLock string
	// ForShare is appended to the fence check so a takeover waits for the
	// fenced transaction (" FOR SHARE" on PostgreSQL).
	ForShare string
	// ForUpdate is appended to a selection that locks rows in its ORDER BY
	// order (" FOR UPDATE" on PostgreSQL; empty where writers are
	// serialised anyway, SQLite).
	ForUpdate string
	// LockParent is appended to a selection that serialises writers on a
	// parent row without blocking the foreign-key checks of its children
	// (" FOR NO KEY UPDATE" on PostgreSQL: a join inserting a node takes
	// FOR KEY SHARE on its pool's row, which FOR UPDATE would wait for,
	// and a cycle with a node row lock would deadlock). Empty on SQLite.
	LockParent string
	// OutboxWriteLock runs before every outbox insert, in its transaction,
	// and OutboxReadLock before every outbox read, in its own; each holds
	// until its transaction ends. Together they make a reader see only a
	// gap-free prefix of the outbox: PostgreSQL takes identity values at
	// insert and rows appear at commit, so without them an entry whose
	// transaction commits after a later one's is skipped by a sink whose
	// cursor has passed it. Writers share their lock (they do not wait for
	// each other); a reader's excludes them, so it waits for the writers
	// that have taken ids to commit, and later writers take higher ids.
	// Empty when writers are serialised anyway (SQLite).
	OutboxWriteLock, OutboxReadLock string
	// OutboxNotify is sent after commits that wrote to the outbox, on a
	// statement of its own and coalesced (notifier), to tell other
	// processes (PostgreSQL: NOTIFY). Empty where every writer is in one
	// process (SQLite): OutboxWritten's in-process signal is enough.
	OutboxNotify string
	// SkipLocked is appended to the claim query's row selection so
	// concurrent claimers skip each other's rows (" FOR UPDATE OF c SKIP
	// LOCKED" on PostgreSQL).
	SkipLocked string
	// TextSet is a subquery yielding, one row each, the strings of the
	// JSON array bound at its one %s placeholder, for "x IN (TextSet)":
	// one parameter however many values, where a list of placeholders
	// makes the statement's text, parse and plan grow with the list.
	TextSet string
	// IntSet is TextSet for a JSON array of integers.
	IntSet string
	// HasGPUs is a condition on an inventory document column named by its
	// one %s placeholder: true when the document lists a GPU.
	HasGPUs string
	// Migrations holds the numbered *.sql files, applied in name order.
	Migrations fs.FS
	// FenceTag, when not empty, runs in every fenced transaction right
	// after its fence check, with "<lease> <holder> <epoch>" bound to $1,
	// so that a test's triggers can record the fence each write was made
	// under (postgres.EnvFenceTag). Empty, the default, runs nothing.
	FenceTag string
}
