package sqlite_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	"github.com/better-compute/better-compute/controlplane/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Exercise(context.Background(), t, newHarness)
}

func BenchmarkStore(b *testing.B) {
	storetest.Benchmark(b, newHarness)
}

func newHarness(t testing.TB) *storetest.Harness {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return &storetest.Harness{Store: s, Exec: sqlitetest.Exec(path), Migrations: os.DirFS("migrations")}
}

// TestWritesAfterCancelledTransactions: every write runs on one
// connection; transactions whose context ends at any point (before BEGIN,
// during it, between statements, before COMMIT) must leave it outside any
// transaction and lose only their own writes, while writers and readers
// run beside them.
func TestWritesAfterCancelledTransactions(t *testing.T) {
	ctx := context.Background()
	h := newHarness(t)
	st := h.Store
	var wg sync.WaitGroup
	var committed sync.Map // site name -> whether its Tx returned nil
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, time.Duration(i%20)*15*time.Millisecond)
			defer cancel()
			name := fmt.Sprintf("racing-%d", i)
			err := st.Tx(cctx, func(tx store.Store) error {
				if _, err := tx.SiteCreate(cctx, &store.SiteCreateParams{Name: name, Region: "r"}); err != nil {
					return err
				}
				time.Sleep(time.Duration(i%3) * 100 * time.Microsecond)
				return cctx.Err()
			})
			committed.Store(name, err == nil)
			if _, err := st.SiteList(ctx, &store.ListParams{Limit: store.MaxListLimit}); err != nil {
				t.Errorf("read beside the writers: %v", err)
			}
		}()
	}
	wg.Wait()
	if err := st.Tx(ctx, func(tx store.Store) error {
		_, err := tx.SiteCreate(ctx, &store.SiteCreateParams{Name: "after", Region: "r"})
		return err
	}); err != nil {
		t.Fatalf("a transaction after the cancelled ones: %v", err)
	}
	sites, err := st.SiteList(ctx, &store.ListParams{Limit: store.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	present := map[string]bool{}
	for _, s := range sites {
		present[s.Name] = true
	}
	if !present["after"] {
		t.Fatal("the last transaction's site is missing")
	}
	n := 0
	committed.Range(func(k, v any) bool {
		name, ok := k.(string), v.(bool)
		if ok {
			n++
		}
		if present[name] != ok {
			t.Errorf("site %s: present %v, but its transaction returned nil = %v", name, present[name], ok)
		}
		return true
	})
	t.Logf("%d of 200 racing transactions committed", n)
}

// TestWritesAfterPanicInTransaction: a transaction whose callback panics
// is rolled back and gives the writer back.
func TestWritesAfterPanicInTransaction(t *testing.T) {
	ctx := context.Background()
	st := newHarness(t).Store
	func() {
		defer func() { _ = recover() }()
		_ = st.Tx(ctx, func(tx store.Store) error {
			if _, err := tx.SiteCreate(ctx, &store.SiteCreateParams{Name: "panicked", Region: "r"}); err != nil {
				return err
			}
			panic("callback failed")
		})
	}()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := st.SiteCreate(wctx, &store.SiteCreateParams{Name: "after", Region: "r"}); err != nil {
		t.Fatalf("a write after the panic: %v", err)
	}
	sites, err := st.SiteList(ctx, &store.ListParams{Limit: store.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sites {
		if s.Name == "panicked" {
			t.Fatal("the panicked transaction's site was committed")
		}
	}
}
