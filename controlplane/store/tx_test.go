package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/store"
)

// txStore is a Store whose transactions run fn on itself; every other
// method is the nil embedded Store's (never called here).
type txStore struct {
	store.Store
	fenced bool
}

func (s *txStore) Tx(_ context.Context, fn func(store.Store) error) error { return fn(s) }

func (s *txStore) FencedTx(_ context.Context, _ store.Fence, fn func(store.Store) error) error {
	s.fenced = true
	return fn(s)
}

// outside is an interface no Store implements.
type outside interface {
	NotAStoreMethod()
}

func TestInTxHandsTheNarrowInterface(t *testing.T) {
	ctx := t.Context()
	db := &txStore{}
	var got store.NodeStore
	if err := store.InTx(ctx, db, func(tx store.NodeStore) error { got = tx; return nil }); err != nil {
		t.Fatal(err)
	}
	if got != db {
		t.Fatalf("InTx handed %v, want the transaction's store", got)
	}
	want := errors.New("callback failed")
	if err := store.InTx(ctx, db, func(store.NodeStore) error { return want }); !errors.Is(err, want) {
		t.Fatalf("InTx returned %v, want the callback's error", err)
	}
	if err := store.InFencedTx(ctx, db, store.Fence{Lease: "shard:1"}, func(store.LeaseStore) error { return nil }); err != nil || !db.fenced {
		t.Fatalf("InFencedTx: err %v, fenced %v; want nil, true", err, db.fenced)
	}
}

func TestInTxRefusesAnInterfaceTheBackendLacks(t *testing.T) {
	ctx := t.Context()
	called := false
	for name, run := range map[string]func() error{
		"InTx": func() error {
			return store.InTx(ctx, &txStore{}, func(outside) error { called = true; return nil })
		},
		"InFencedTx": func() error {
			return store.InFencedTx(ctx, &txStore{}, store.Fence{}, func(outside) error { called = true; return nil })
		},
	} {
		err := run()
		if err == nil || !strings.Contains(err.Error(), "store_test.outside") {
			t.Errorf("%s: err %v, want one naming store_test.outside", name, err)
		}
	}
	if called {
		t.Error("a callback ran with a store that does not implement its interface")
	}
}
