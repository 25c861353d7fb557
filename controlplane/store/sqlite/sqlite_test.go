package sqlite_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/better-compute/better-compute/controlplane/store/sqlite"
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
	s, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return &storetest.Harness{Store: s, Exec: s.ExecRaw}
}
