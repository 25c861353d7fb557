package postgres_test

import (
	"context"
	"os"
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
	return openHarness(t, pgtest.URL(t))
}

// openHarness opens and migrates the store at url.
func openHarness(t testing.TB, url string) *storetest.Harness {
	ctx := context.Background()
	s, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return &storetest.Harness{Store: s, Exec: pgtest.Exec(url), Migrations: os.DirFS("migrations")}
}

// TestConformanceExecModes runs the suite in each of pgx's other query exec
// modes, set in the URL as an operator would (docs/scaling.md): JSON
// arguments, among others, must bind in all of them. TestConformance covers
// the default, cache_statement.
func TestConformanceExecModes(t *testing.T) {
	for _, mode := range []string{"exec", "describe_exec", "cache_describe", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			storetest.Exercise(context.Background(), t, func(t testing.TB) *storetest.Harness {
				return openHarness(t, pgtest.URL(t)+"&default_query_exec_mode="+mode)
			})
		})
	}
}

// TestConformancePgBouncer runs the suite through PgBouncer in transaction
// mode (tests/pgbouncer.sh), with the URL docs/scaling.md gives.
func TestConformancePgBouncer(t *testing.T) {
	storetest.Exercise(context.Background(), t, func(t testing.TB) *storetest.Harness {
		_, bouncer := pgtest.Database(t)
		return openHarness(t, bouncer)
	})
}
