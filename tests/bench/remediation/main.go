// Command remediation measures the remediation loop with a real gateway and
// the controllers role (workers.Run, as serve runs it: shard membership,
// liveness, the remediation reconciler, the CommandSweeper) in this process,
// on PostgreSQL, and N FakeDaemons holding sessions on that gateway. A
// fraction of the daemons (-fail, default 5%) each raise one XID 95
// (UNCONTAINED_ECC_ERROR, resolution RESET_GPU) through the simulator's
// fault injection (sim.FakeDaemon.RaiseXID, classified with bcd's
// catalogue), at random moments spread over -spread (default one minute);
// each gpu.reset takes -reset (default 30 s) before the GPU reads healthy. It records, per node,
// the time from the daemon's send to the case's quarantine (the
// remediation.quarantined move, its time taken in the move's transaction)
// and from quarantine to the case's return to service, and the process's
// CPU time while the loop ran.
//
//	go run ./tests/bench/remediation -n 1000 -fail 0.05 -spread 1m
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/gateway"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/workers"
)

func main() {
	n := flag.Int("n", 1000, "FakeDaemons")
	fail := flag.Float64("fail", 0.05, "fraction of the daemons that raise an XID")
	spread := flag.Duration("spread", time.Minute, "the XIDs are raised at random moments within this")
	interval := flag.Duration("interval", 500*time.Millisecond, "remediation.interval")
	settle := flag.Duration("settle", 5*time.Second, "remediation.verifySettle")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up waiting for the cases after this")
	reset := flag.Duration("reset", 30*time.Second, "how long each simulated gpu.reset takes (sim.Recovery.ResetDelay)")
	db := flag.String("db", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL server URL (a fresh schema is made and dropped)")
	flag.Parse()
	if *n < 1 || *fail <= 0 || *fail > 1 {
		fmt.Fprintln(os.Stderr, "bench: want -n >= 1 and 0 < -fail <= 1")
		os.Exit(2)
	}
	if err := run(*n, *fail, *spread, *interval, *settle, *timeout, *reset, *db); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// openStore opens a fresh schema on db; the returned function drops it.
func openStore(ctx context.Context, db string) (store.Store, string, func(), error) {
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		return nil, "", nil, err
	}
	schema := "bench_" + strings.ToLower(rand.Text()[:10])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return nil, "", nil, err
	}
	url := db + cmp.Or(map[bool]string{true: "&"}[strings.Contains(db, "?")], "?") + "search_path=" + schema
	st, err := postgres.Open(ctx, url)
	return st, url, func() {
		if st != nil {
			st.Close()
		}
		conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		conn.Close(context.Background())
	}, err
}

func cpu() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func quantiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	slices.Sort(ds)
	q := func(p float64) time.Duration { return ds[min(len(ds)-1, int(p*float64(len(ds))))] }
	return fmt.Sprintf("p50 %v, p99 %v, max %v (%d)", q(0.5).Round(time.Millisecond), q(0.99).Round(time.Millisecond),
		ds[len(ds)-1].Round(time.Millisecond), len(ds))
}

func run(n int, fail float64, spread, interval, settle, timeout, reset time.Duration, db string) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	st, url, cleanup, err := openStore(ctx, db)
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
	dir, err := os.MkdirTemp("", "bench-remediation-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	certFile, keyFile, err := bootstrap.WriteGatewayCert(bundle, dir, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, 0)
	if err != nil {
		return err
	}
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "bench", Region: "default"})
	if err != nil {
		return err
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "bench", SiteID: site.ID})
	if err != nil {
		return err
	}
	failing := max(1, int(float64(n)*fail))
	// Enough room that the breaker and the concurrency measure the loop,
	// not themselves.
	if err := st.PoolSetBudget(ctx, &store.PoolSetBudgetParams{PoolID: pool.ID, RemediationConcurrency: failing}); err != nil {
		return err
	}
	gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile,
		HeartbeatInterval: 10 * time.Second, MaxStreams: n + 10,
		MaxConnectingPerSource: 64, MaxQueuedPerSource: 4096, JoinRate: 1e6, JoinBurst: 100000}, st, bundle, log)
	if err != nil {
		return err
	}
	gwDone := make(chan struct{})
	go func() { defer close(gwDone); _ = gw.Run(ctx) }()
	<-gw.Ready()
	token, _, err := api.CreateJoinToken(ctx, st, bundle.GatewayPin(), pool.ID, time.Hour, n, "bench", "")
	if err != nil {
		return err
	}
	fleet, err := sim.NewFleet(sim.FleetConfig{GatewayURL: gw.PublicURL(), Token: token, N: n, JoinConcurrency: 32,
		Session: session.Config{StartJitter: -1}})
	if err != nil {
		return err
	}
	start := time.Now()
	if err := fleet.Join(ctx); err != nil {
		return err
	}
	fleetDone := make(chan struct{})
	go func() { defer close(fleetDone); _ = fleet.Run(ctx) }()
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer wcancel()
	if err := fleet.WaitFor(wctx, func(s sim.FleetStats) bool { return s.Connected == n }); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	fmt.Printf("%d daemons joined and connected in %v\n", n, time.Since(start).Round(time.Millisecond))

	env := map[string]string{config.EnvDatabaseURL: url, config.EnvSecret: strings.Repeat("b", 32), "HOME": dir}
	cfg, err := config.Load("", func(k string) string { return env[k] }, config.Flags{Roles: "controllers"})
	if err != nil {
		return err
	}
	cfg.Remediation.Interval.Duration = interval
	cfg.Remediation.VerifySettle.Duration = settle
	cfg.Remediation.Breaker.Share = 100 // the breaker admits every node: it measures the loop, not itself
	wDone := make(chan error, 1)
	go func() {
		wDone <- workers.Run(ctx, cfg, st, workers.Options{WorkerID: "bench", ShardTTL: 15 * time.Second, ShardRenew: time.Second}, log)
	}()

	daemons := fleet.Daemons()
	mrand.Shuffle(len(daemons), func(i, j int) { daemons[i], daemons[j] = daemons[j], daemons[i] })
	daemons = daemons[:failing]
	sent := map[string]time.Time{}
	cpu0, wall0 := cpu(), time.Now()
	delays := make([]time.Duration, failing)
	for i := range delays {
		delays[i] = time.Duration(mrand.Int64N(int64(spread) + 1))
	}
	slices.Sort(delays)
	for i, d := range daemons {
		if wait := time.Until(wall0.Add(delays[i])); wait > 0 {
			time.Sleep(wait) // the benchmark's own schedule of XIDs
		}
		d.SetRecovery(sim.Recovery{ResetDelay: reset})
		sent[d.NodeID()] = time.Now()
		if err := d.RaiseXID(0, 95); err != nil {
			return err
		}
	}
	var toQuarantine, toService []time.Duration
	returned, escalated := 0, 0
	deadline := time.Now().Add(timeout)
	for {
		toQuarantine, toService, returned, escalated = toQuarantine[:0], toService[:0], 0, 0
		cases, err := st.RemediationList(ctx, &store.RemediationListParams{PoolID: pool.ID, ListParams: store.ListParams{Limit: store.MaxListLimit}})
		if err != nil {
			return err
		}
		for _, c := range cases {
			if s, ok := sent[c.NodeID]; ok && c.QuarantinedAt != nil {
				toQuarantine = append(toQuarantine, c.QuarantinedAt.Sub(s))
			}
			switch c.State {
			case store.RemediationReturned:
				returned++
				toService = append(toService, c.ClosedAt.Sub(*c.QuarantinedAt))
			case store.RemediationEscalated:
				escalated++
			}
		}
		if returned+escalated == failing || time.Now().After(deadline) {
			break
		}
		time.Sleep(interval) // polling the store for the result
	}
	used, wall := cpu()-cpu0, time.Since(wall0)
	cancel()
	<-fleetDone
	<-gwDone
	<-wDone
	fmt.Printf("%d of %d daemons raised XID 95 within %v; gpu.reset takes %v; reconciler interval %v, verify settle %v\n",
		failing, n, spread, reset, interval, settle)
	fmt.Printf("XID on the node -> quarantined: %s\n", quantiles(toQuarantine))
	fmt.Printf("quarantined -> back in service: %s\n", quantiles(toService))
	fmt.Printf("cases returned %d, escalated %d, open %d\n", returned, escalated, failing-returned-escalated)
	fmt.Printf("process CPU while the loop ran: %v over %v wall (%.1f%% of one core; gateway, %d daemons and workers together)\n",
		used.Round(time.Millisecond), wall.Round(time.Millisecond), 100*used.Seconds()/wall.Seconds(), n)
	return nil
}
