package sweeper_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
	"github.com/better-compute/better-compute/controlplane/sweeper"
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
	cmds, err := st.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{"node_1"}, Kind: "exec", Spec: []byte("{}"), Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	swept := make(chan *store.CommandSweepResult, 1)
	s, err := sweeper.New(sweeper.Config{Holder: "w1", Interval: 20 * time.Millisecond, OnSweep: func(r *store.CommandSweepResult) { swept <- r }}, st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(rctx) }()
	select {
	case r := <-swept:
		if len(r.Expired) != 1 || r.Expired[0].ID != cmds[0].ID {
			t.Fatalf("sweep = %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no sweep expired the overdue command")
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c, _ := st.CommandGet(ctx, cmds[0].ID)
	if c.State != store.CommandExpired || c.FinishedAt == nil {
		t.Fatalf("command = %+v", c)
	}
	l, err := st.LeaseGet(ctx, sweeper.LeaseName)
	if err != nil || l.Holder != "" {
		t.Fatalf("sweeper lease after stop = %+v %v, want released", l, err)
	}
}
