package sweeper_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/better-compute/better-compute/controlplane/internal/clocktest"
	"github.com/better-compute/better-compute/controlplane/reconcilers/sweeper"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
)

func TestSweeperExpiresOverdueCommands(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	site, _ := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	pool, _ := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_1", PoolID: pool.ID, Hostname: "h"}); err != nil {
		t.Fatal(err)
	}
	// Enqueued two minutes ago with a minute to run: overdue at once, on
	// the database's clock, which judges deadlines.
	overdue := func() *store.Command {
		t.Helper()
		past := time.Now().Add(-2 * time.Minute)
		cmds, err := st.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{"node_1"}, Kind: "exec", SessionSpec: []byte("{}"), Timeout: time.Minute, Now: &past})
		if err != nil {
			t.Fatal(err)
		}
		return cmds[0]
	}
	first := overdue()
	clock := clocktest.New(time.Now())
	swept := make(chan *store.CommandSweepResult, 4)
	s, err := sweeper.New(sweeper.Config{Holder: "w1", Clock: clock, OnSweep: func(r *store.CommandSweepResult) { swept <- r }}, st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(rctx) }()
	expired := func(c *store.Command, what string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		select {
		case r := <-swept:
			if len(r.Expired) != 1 || r.Expired[0].ID != c.ID {
				t.Fatalf("%s: sweep = %+v, want %s expired", what, r, c.ID)
			}
		case <-ctx.Done():
			t.Fatalf("%s: no sweep expired the overdue command", what)
		}
	}
	// The first sweep runs as soon as the lease is held.
	expired(first, "first sweep")
	// The next one runs an Interval (1 s by default) later on the sweeper's
	// clock: once it and its lease holder wait on the clock, move it on.
	second := overdue()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := clock.BlockUntil(wctx, 2); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	expired(second, "sweep after an interval")
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c, _ := st.CommandGet(ctx, first.ID)
	if c.State != store.CommandExpired || c.FinishedAt == nil {
		t.Fatalf("command = %+v", c)
	}
	l, err := st.LeaseGet(ctx, sweeper.LeaseName)
	if err != nil || l.Holder != "" {
		t.Fatalf("sweeper lease after stop = %+v %v, want released", l, err)
	}
}
