package reaper_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/better-compute/better-compute/controlplane/internal/clocktest"
	"github.com/better-compute/better-compute/controlplane/reconcilers/reaper"
	"github.com/better-compute/better-compute/controlplane/reconcilers/sweeper"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// TestDeadGatewaysCommandsEndLost: a gateway killed with its node; its
// lease has expired. The reaper closes its session, and the sweeper then
// finds the node's running command session-less and ends it lost, once,
// without waiting for the command's deadline.
func TestDeadGatewaysCommandsEndLost(t *testing.T) {
	// Registered first, so it runs after the store's own cleanup.
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	ctx := context.Background()
	st := sqlitetest.Open(t)
	site, _ := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	pool, _ := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_1", PoolID: pool.ID, Hostname: "h"}); err != nil {
		t.Fatal(err)
	}
	// The gateway took its 20 s lease a minute ago and was killed.
	killed := time.Now().Add(-time.Minute)
	if _, err := st.GatewayUpsert(ctx, &store.GatewayUpsertParams{ID: "gw-1", Region: "r", Now: &killed}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := st.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: store.GatewayLeasePrefix + "gw-1", Holder: "p1", TTL: 20 * time.Second, Now: &killed}); err != nil || !ok {
		t.Fatalf("gateway lease: %v %v", ok, err)
	}
	if _, _, err := st.SessionOpen(ctx, &store.SessionOpenParams{NodeID: "node_1", SessionID: "sess-1", GatewayID: "gw-1", Now: &killed}); err != nil {
		t.Fatal(err)
	}
	cmds, err := st.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{"node_1"}, Kind: "exec", SessionSpec: []byte("{}"), Timeout: time.Hour, Now: &killed})
	if err != nil {
		t.Fatal(err)
	}
	if claimed, err := st.CommandClaim(ctx, &store.CommandClaimParams{GatewayID: "gw-1", Limit: 10}); err != nil || len(claimed) != 1 {
		t.Fatalf("claim: %v %v", claimed, err)
	}

	// Without the reaper the sweeper sees a session and leaves the command.
	var sweep store.CommandSweepResult
	if err := st.Tx(ctx, func(tx store.Store) error {
		r, err := tx.CommandSweep(ctx, &store.CommandSweepParams{LostAfter: 30 * time.Second})
		sweep = *r
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(sweep.Lost) != 0 {
		t.Fatalf("lost before the reaper ran: %+v", sweep.Lost)
	}

	clock := clocktest.New(time.Now())
	r, err := reaper.New(reaper.Config{Holder: "w1", Clock: clock}, st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	swept := make(chan *store.CommandSweepResult, 4)
	s, err := sweeper.New(sweeper.Config{Holder: "w1", Clock: clock, OnSweep: func(res *store.CommandSweepResult) { swept <- res }}, st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 2)
	go func() { done <- r.Run(rctx) }()
	go func() { done <- s.Run(rctx) }()
	defer func() {
		stop()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		}
	}()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// The reaper's first pass, as soon as it holds its lease, closes the
	// dead gateway's session; then it waits on the (fake) clock.
	if err := clock.Until(wctx, func() bool {
		_, err := st.SessionGet(ctx, "node_1")
		return errors.Is(err, store.ErrNotFound)
	}); err != nil {
		t.Fatalf("the reaper did not close the dead gateway's session: %v", err)
	}
	// The sweeper passes once a (fake) second; the node's last heartbeat
	// is a minute old, past LostAfter, so the first pass after the reap
	// ends the command.
	// Each turn waits until the reaper and the sweeper (each a pass loop
	// under a lease holder: two waits on the clock apiece) have finished
	// their passes, reads what the sweeps reported, and moves the clock on.
	for {
		if err := clock.BlockUntil(wctx, 4); err != nil {
			t.Fatalf("the command did not end lost: %v", err)
		}
		select {
		case res := <-swept:
			if len(res.Lost) == 0 {
				continue
			}
			if len(res.Lost) != 1 || res.Lost[0].ID != cmds[0].ID {
				t.Fatalf("swept %+v, want %s lost", res, cmds[0].ID)
			}
			got, err := st.CommandGet(ctx, cmds[0].ID)
			if err != nil || got.State != store.CommandLost {
				t.Fatalf("command = %+v (%v), want lost", got, err)
			}
			return
		default:
		}
		clock.Advance(time.Second)
	}
}
