package queries

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// Store implements store.Store on a backend's pool.
type Store struct {
	pool Pool
	db   DB // the pool, or the open transaction
	d    *Dialect
	inTx bool
	// written signals OutboxWritten's subscribers, shared by the handle
	// and its transactions; wrote (in a transaction) is set by an outbox
	// write, for the commit to signal.
	written *signal
	wrote   *bool
	// notify tells other processes of outbox commits (nil where the
	// dialect has no OutboxNotify).
	notify *notifier
	// pending (in a transaction) holds the events emit was given, written
	// in one multi-row insert just before the commit.
	pending *[]timedEvent
}

var _ store.Store = (*Store)(nil)

// New returns a Store running on pool with dialect d.
func New(pool Pool, d *Dialect) *Store {
	return &Store{pool: pool, db: pool, d: d, written: newSignal(), notify: newNotifier(pool, d.OutboxNotify)}
}

// Dialect names the backend.
func (s *Store) Dialect() store.Dialect { return s.d.Name }

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.pool.Ping(ctx); err != nil {
		return fmt.Errorf("ping database: %w", err)
	}
	return nil
}

// Now returns the database's clock.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var t time.Time
	err := s.db.QueryRow(ctx, `SELECT now()`).Scan(&t)
	return t.UTC(), s.wrap("read database clock", err)
}

// Close stops the notifier and releases the pool.
func (s *Store) Close() error {
	s.notify.close()
	return s.pool.Close()
}

// Tx runs fn in one transaction.
func (s *Store) Tx(ctx context.Context, fn func(store.Store) error) error {
	if s.inTx {
		return fn(s)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", s.d.Translate(err))
	}
	inner := &Store{pool: s.pool, db: tx, d: s.d, inTx: true, written: s.written, notify: s.notify, wrote: new(bool), pending: new([]timedEvent)}
	// A panic in fn (which net/http, say, recovers) must not leave the
	// transaction open: on SQLite it would hold the one writer for good.
	defer func() {
		if p := recover(); p != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			panic(p)
		}
	}()
	if err := fn(inner); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	if err := inner.flushEvents(ctx); err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", s.d.Translate(err))
	}
	if *inner.wrote {
		s.written.fire()
		s.notify.wake()
	}
	return nil
}

// FencedTx runs fn in one transaction under fence.
func (s *Store) FencedTx(ctx context.Context, fence store.Fence, fn func(store.Store) error) error {
	return s.Tx(ctx, func(tx store.Store) error {
		inner := tx.(*Store)
		var one int
		err := inner.db.QueryRow(ctx, `SELECT 1 FROM leases
			WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > coalesce($4, now())`+s.d.ForShare,
			fence.Lease, fence.Holder, fence.Epoch, fence.Now).Scan(&one)
		if err != nil {
			if errors.Is(s.d.Translate(err), store.ErrNotFound) {
				return fmt.Errorf("%s at epoch %d: %w", fence.Lease, fence.Epoch, store.ErrFenced)
			}
			return fmt.Errorf("check fence %s: %w", fence.Lease, err)
		}
		if s.d.FenceTag != "" {
			tag := fence.Lease + " " + fence.Holder + " " + strconv.FormatInt(fence.Epoch, 10)
			if _, err := inner.db.Exec(ctx, s.d.FenceTag, tag); err != nil {
				return fmt.Errorf("tag fence %s: %w", fence.Lease, s.d.Translate(err))
			}
		}
		return fn(inner)
	})
}

// wrap names the operation and translates the driver error.
func (s *Store) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", op, s.d.Translate(err))
}

// collect scans every row with scan.
func collect[T any](rows Rows, scan func(Row) (*T, error)) ([]*T, error) {
	defer rows.Close()
	var out []*T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// texts collects rows of one text column.
func texts(rows Rows) ([]string, error) {
	ps, err := collect(rows, scanText)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = *p
	}
	return out, nil
}

// limit clamps a list limit to 1..store.MaxListLimit, 100 by default.
func limit(n int) int {
	switch {
	case n <= 0:
		return 100
	case n > store.MaxListLimit:
		return store.MaxListLimit
	}
	return n
}

// scanText scans a one-column text row.
func scanText(r Row) (*string, error) {
	var v string
	return &v, r.Scan(&v)
}

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }

// clock returns t, or where the database's now() is not stable within a
// statement (SQLite's registered function reads the clock on every call)
// the current time, so that one statement sees one instant. PostgreSQL's
// now() is the transaction's start and needs no help.
func (s *Store) clock(t *time.Time) *time.Time {
	if t != nil || s.d.Name != store.DialectSQLite {
		return t
	}
	now := time.Now()
	return &now
}
