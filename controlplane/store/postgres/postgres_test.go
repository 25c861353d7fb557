package postgres_test

import (
	"context"
	"testing"

	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
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
	s, err := postgres.Open(ctx, pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return &storetest.Harness{Store: s, Exec: s.ExecRaw}
}
