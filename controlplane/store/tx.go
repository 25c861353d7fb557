package store

import (
	"context"
	"fmt"
	"reflect"
)

// Transactor runs functions in one transaction. A consumer embeds it in the
// small interface it declares for its store, and runs its transactions with
// InTx, never with Tx directly.
type Transactor interface {
	// Tx runs fn in one transaction, committed when fn returns nil and
	// rolled back otherwise; fn's error is returned. Inside a transaction
	// it runs fn in the same one.
	Tx(ctx context.Context, fn func(Store) error) error
}

// FencedTransactor runs functions in one transaction fenced by a lease. A
// consumer that writes under a lease embeds it in its store interface and
// runs its transactions with InFencedTx.
type FencedTransactor interface {
	// FencedTx runs fn in one transaction that first checks the writer
	// still holds fence's lease at fence's epoch (and that it has not
	// expired by the database's clock), and keeps it from changing hands
	// until the transaction ends. Otherwise it returns ErrFenced and runs
	// nothing.
	FencedTx(ctx context.Context, fence Fence, fn func(Store) error) error
}

// InTx runs fn in one transaction of db (Transactor.Tx), handing it the
// transaction's store as T: the small interface the caller declares for
// what the transaction may touch, such as
//
//	type joinTx interface {
//		store.NodeStore
//		AuditInsert(ctx context.Context, e *store.AuditEntry) (int64, error)
//	}
//	err := store.InTx(ctx, a.store, func(tx joinTx) error { ... })
//
// T must be an interface that Store implements; when the backend's
// transaction store does not implement it, InTx returns an error naming T
// and runs nothing in the transaction (tests/storeseam_test.go checks at
// build time that no instantiation in production code can fail so).
func InTx[T any](ctx context.Context, db Transactor, fn func(T) error) error {
	return db.Tx(ctx, func(tx Store) error {
		t, err := as[T](tx)
		if err != nil {
			return err
		}
		return fn(t)
	})
}

// InFencedTx is InTx in a transaction fenced by fence's lease
// (FencedTransactor.FencedTx): it returns ErrFenced, and runs nothing,
// when the writer no longer holds the lease at fence's epoch.
func InFencedTx[T any](ctx context.Context, db FencedTransactor, fence Fence, fn func(T) error) error {
	return db.FencedTx(ctx, fence, func(tx Store) error {
		t, err := as[T](tx)
		if err != nil {
			return err
		}
		return fn(t)
	})
}

// as converts a transaction's store to T, or says that the backend does
// not offer T.
func as[T any](tx Store) (T, error) {
	t, ok := tx.(T)
	if !ok {
		return t, fmt.Errorf("run transaction: the backend's transaction store %T does not implement %v", tx, reflect.TypeFor[T]())
	}
	return t, nil
}
