// Command rollouts benchmarks the rollout reconciler (issue 20): N
// FakeDaemons on a real gateway roll from one release to another with
// --wave 10% and a 10 s soak, as the reconciler of the controllers role
// drives them (one shard lease, stepped every --interval). It prints the
// total time, the largest number of the pool's nodes out of service at any
// moment (sampled every 10 ms from the pool's budget count, and replayed
// from the event stream; it must never exceed the budget), and the
// reconciler's CPU: the CPU time of the OS thread its steps run on
// (RUSAGE_THREAD; the database server's own work on PostgreSQL is not in
// it), and the wall time of its steps.
//
//	go run ./tests/bench/rollouts                  # PostgreSQL at 127.0.0.1:5432, 1,000 daemons
//	go run ./tests/bench/rollouts -db sqlite -n 200
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/gateway"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/pkg/shard"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/pkg/wake"
	"github.com/better-compute/better-compute/controlplane/reconcilers/rollouts"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
)

func main() {
	n := flag.Int("n", 1000, "FakeDaemons in the pool")
	db := flag.String("db", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL server URL (a fresh schema is made and dropped); \"sqlite\" for the embedded store")
	wave := flag.String("wave", "10%", "the rollout's --wave")
	soak := flag.Duration("soak", 10*time.Second, "the rollout's --soak")
	interval := flag.Duration("interval", time.Second, "the reconciler's interval (rollouts.interval)")
	flag.Parse()
	if err := run(*n, *db, *wave, *soak, *interval); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func openStore(ctx context.Context, db string) (store.Store, func(), error) {
	if db == "sqlite" {
		dir, err := os.MkdirTemp("", "bench-rollouts-")
		if err != nil {
			return nil, nil, err
		}
		st, err := sqlite.Open(ctx, filepath.Join(dir, "state.db"))
		return st, func() { st.Close(); os.RemoveAll(dir) }, err
	}
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		return nil, nil, err
	}
	schema := "bench_" + strings.ToLower(rand.Text()[:10])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return nil, nil, err
	}
	sep := "?"
	if strings.Contains(db, "?") {
		sep = "&"
	}
	st, err := postgres.Open(ctx, db+sep+"search_path="+schema)
	return st, func() {
		st.Close()
		conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		conn.Close(context.Background())
	}, err
}

// threadCPU is the CPU time (user + system) of the calling OS thread.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	const rusageThread = 1 // RUSAGE_THREAD (Linux)
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func run(n int, db, wave string, soak, interval time.Duration) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	st, cleanup, err := openStore(ctx, db)
	if err != nil {
		return err
	}
	defer cleanup()
	if _, err := st.Migrate(ctx); err != nil {
		return err
	}
	bundle, err := pki.Init(pki.InitOptions{TrustDomain: "bench.local"})
	if err != nil {
		return err
	}
	dir, _ := os.MkdirTemp("", "bench-pki-")
	defer os.RemoveAll(dir)
	certFile, keyFile, err := bootstrap.WriteGatewayCert(bundle, dir, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, 0)
	if err != nil {
		return err
	}
	site, _ := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "bench", Region: "default"})
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "bench", SiteID: site.ID})
	if err != nil {
		return err
	}
	bus := wake.NewBus(nil)
	wakeups, _ := bus.Subscribe()
	gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, MaxStreams: n + 100,
		HandshakeRate: 2000, HandshakeBurst: 200, MaxConnectingPerSource: 256, MaxQueuedPerSource: 4096,
		JoinRate: 1e6, JoinBurst: 100000, Wakeups: wakeups}, st, bundle, log)
	if err != nil {
		return err
	}
	gwDone := make(chan struct{})
	go func() { defer close(gwDone); _ = gw.Run(ctx) }()
	// Stop the gateway and the daemons before the store closes.
	defer func() { cancel(); <-gwDone }()
	<-gw.Ready()
	token, _, err := api.CreateJoinToken(ctx, st, bundle.GatewayPin(), pool.ID, time.Hour, n, "bench", "")
	if err != nil {
		return err
	}
	fleet, err := sim.NewFleet(sim.FleetConfig{GatewayURL: gw.PublicURL(), Token: token, N: n, NoInventory: true,
		Session: session.Config{StartJitter: -1}})
	if err != nil {
		return err
	}
	if err := fleet.Join(ctx); err != nil {
		return err
	}
	go fleet.Run(ctx)
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer wcancel()
	if err := fleet.WaitFor(wctx, func(s sim.FleetStats) bool { return s.Connected >= n }); err != nil {
		return fmt.Errorf("waiting for sessions: %w", err)
	}
	budget, err := st.PoolBudget(ctx, pool.ID)
	if err != nil {
		return err
	}
	fmt.Printf("store %s, %d FakeDaemons connected; pool budget %s = %d nodes\n", st.Dialect(), n, budget.Spec, budget.Budget)

	spec, err := store.ParseCount("wave", wave)
	if err != nil {
		return err
	}
	ro, err := st.RolloutCreate(ctx, &store.RolloutCreateParams{PoolID: pool.ID, Version: "9.9.9", BaseURL: "https://bench.invalid/api/downloads",
		Canary: rollouts.DefaultCanary, Wave: spec, MaxUnavailable: spec, Soak: soak, Timeout: 2 * time.Minute, Drain: true})
	if err != nil {
		return err
	}
	n0 := store.ShardOf(ro.ID)
	l, ok, err := st.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: shard.LeaseName(n0), Holder: "bench", TTL: time.Hour})
	if err != nil || !ok {
		return fmt.Errorf("shard lease: %v %v", ok, err)
	}
	fence := store.Fence{Lease: l.Name, Holder: l.Holder, Epoch: l.Epoch}
	r := rollouts.New(rollouts.Config{Interval: interval, Waker: bus}, st, log)

	// Sample the pool's out-of-service count.
	var maxOut atomic.Int64
	go func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if b, err := st.PoolBudget(ctx, pool.ID); err == nil && int64(b.OutOfService) > maxOut.Load() {
				maxOut.Store(int64(b.OutOfService))
			}
		}
	}()

	type result struct {
		cpu, wall time.Duration
		steps     int
		state     string
		err       error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var res result
		cpu0 := threadCPU()
		defer func() { res.cpu = threadCPU() - cpu0; done <- res }()
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			s := time.Now()
			if _, err := r.Due(ctx, s, []int{n0}); err != nil {
				res.err = err
				return
			}
			if err := r.Reconcile(ctx, n0, fence); err != nil {
				res.err = err
				return
			}
			res.wall += time.Since(s)
			res.steps++
			cur, err := st.RolloutGet(ctx, ro.ID)
			if err != nil {
				res.err = err
				return
			}
			if !store.RolloutActive(cur.State) {
				res.state = cur.State
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	res := <-done
	total := time.Since(start)
	if res.err != nil {
		return res.err
	}
	cur, _ := st.RolloutGet(ctx, ro.ID)
	replayed, err := replayOut(ctx, st, ro.ID)
	if err != nil {
		return err
	}
	fmt.Printf("rollout of %d nodes, --wave %s (%d waves after the canary), --soak %v, interval %v: %s in %v\n",
		n, wave, cur.CurrentWave-1, soak, interval, res.state, total.Round(time.Millisecond))
	fmt.Printf("largest number unavailable at any moment: %d sampled (pool count), %d from the event stream; budget %d\n",
		maxOut.Load(), replayed, budget.Budget)
	fmt.Printf("reconciler: %d steps, CPU %v (%.2f%% of one core over the rollout), step wall time %v (mean %v)\n",
		res.steps, res.cpu.Round(time.Millisecond), 100*res.cpu.Seconds()/total.Seconds(), res.wall.Round(time.Millisecond),
		(res.wall / time.Duration(max(1, res.steps))).Round(time.Microsecond))
	if int(maxOut.Load()) > budget.Budget || replayed > budget.Budget {
		return fmt.Errorf("the budget was exceeded")
	}
	if res.state != store.RolloutCompleted {
		return fmt.Errorf("rollout ended %s: %s", res.state, cur.Reason)
	}
	return nil
}

// replayOut replays the rollout's node events and returns the most nodes
// out at once.
func replayOut(ctx context.Context, st store.Store, id string) (int, error) {
	out, most := map[string]bool{}, 0
	for after := int64(0); ; {
		entries, err := st.OutboxQuery(ctx, &store.OutboxQueryParams{Key: id, AfterID: after, Ascending: true, Limit: store.MaxListLimit})
		if err != nil {
			return 0, err
		}
		for _, e := range entries {
			after = e.ID
			env, err := events.Parse(e.Payload)
			if err != nil {
				return 0, err
			}
			var d events.RolloutNodeData
			if json.Unmarshal(env.Data, &d) != nil || d.NodeID == "" {
				continue
			}
			switch d.State {
			case store.RolloutNodeDraining, store.RolloutNodeUpgrading, store.RolloutNodeSoaking, store.RolloutNodeRollingBack:
				out[d.NodeID] = true
			default:
				delete(out, d.NodeID)
			}
			most = max(most, len(out))
		}
		if len(entries) < store.MaxListLimit {
			return most, nil
		}
	}
}
