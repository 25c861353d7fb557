// Command quarantine measures how fast a pool is quarantined when a quarter
// of it fails at once (issue 33): a real gateway and the controllers role
// (workers.Run, as serve runs it) in this process, on PostgreSQL, and N
// FakeDaemons (default 1,000) holding sessions on that gateway; a fraction
// of them (-fail, default 25 %) raise XID 79 (GPU_HAS_FALLEN_OFF_THE_BUS,
// RESTART_BM) at once, through the simulator's fault injection. Every
// failing node is cordoned: the ones the pool's breaker admits (default 10
// % of the GPU nodes; -share) are quarantined and acted on, the rest are
// cordoned and held. It prints the nodes cordoned per second, from the
// first XID sent to the last cordon, and the time from each daemon's send
// to its node's cordon (the case's move to quarantined or held, timed in
// the move's transaction), p50 and p99.
//
//	go run ./tests/bench/quarantine -n 1000 -fail 0.25
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
	fail := flag.Float64("fail", 0.25, "fraction of the daemons that raise XID 79 at once")
	interval := flag.Duration("interval", 2*time.Second, "remediation.interval (the default)")
	share := flag.Float64("share", 10, "remediation.breaker.share, per cent (the default)")
	timeout := flag.Duration("timeout", 5*time.Minute, "give up waiting for the cordons after this")
	db := flag.String("db", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL server URL (a fresh schema is made and dropped)")
	flag.Parse()
	if *n < 1 || *fail <= 0 || *fail > 1 {
		fmt.Fprintln(os.Stderr, "bench: want -n >= 1 and 0 < -fail <= 1")
		os.Exit(2)
	}
	if err := run(*n, *fail, *interval, *share, *timeout, *db); err != nil {
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

func run(n int, fail float64, interval time.Duration, share float64, timeout time.Duration, db string) error {
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
	dir, err := os.MkdirTemp("", "bench-quarantine-")
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
	cfg.Remediation.Breaker.Share = config.Percent(share)
	wDone := make(chan error, 1)
	go func() {
		wDone <- workers.Run(ctx, cfg, st, workers.Options{WorkerID: "bench", ShardTTL: 15 * time.Second, ShardRenew: time.Second}, log)
	}()
	// The workers take their shards before the XIDs: the figures measure
	// the loop, not the start.
	time.Sleep(3 * interval)

	daemons := fleet.Daemons()
	mrand.Shuffle(len(daemons), func(i, j int) { daemons[i], daemons[j] = daemons[j], daemons[i] })
	daemons = daemons[:failing]
	sent := map[string]time.Time{}
	cpu0, wall0 := cpu(), time.Now()
	for _, d := range daemons {
		d.SetRecovery(sim.Recovery{RebootDelay: time.Hour}) // a reboot takes the node away: it is not what is measured
		sent[d.NodeID()] = time.Now()
		if err := d.RaiseXID(0, 79); err != nil {
			return err
		}
	}
	raised := time.Since(wall0)
	var toCordon []time.Duration
	var last time.Time
	acted, held := 0, 0
	deadline := time.Now().Add(timeout)
	for {
		toCordon, last, acted, held = toCordon[:0], time.Time{}, 0, 0
		cases, err := remediationCases(ctx, st, pool.ID)
		if err != nil {
			return err
		}
		for _, c := range cases {
			s, ok := sent[c.NodeID]
			if !ok {
				continue
			}
			var at time.Time
			switch {
			case c.QuarantinedAt != nil:
				at = *c.QuarantinedAt
				acted++
			case c.State == store.RemediationHeld:
				at = c.StateSince
				held++
			default:
				continue
			}
			toCordon = append(toCordon, at.Sub(s))
			if at.After(last) {
				last = at
			}
		}
		if acted+held == failing || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // polling the store for the result
	}
	used, wall := cpu()-cpu0, time.Since(wall0)
	cancel()
	<-fleetDone
	<-gwDone
	<-wDone
	fmt.Printf("%d of %d daemons raised XID 79 at once (all sent within %v); reconciler interval %v, breaker share %v%%\n",
		failing, n, raised.Round(time.Millisecond), interval, share)
	fmt.Printf("cordoned %d of %d: %d quarantined and acted on, %d held by the breaker\n", acted+held, failing, acted, held)
	if span := last.Sub(wall0); acted+held > 0 && span > 0 {
		fmt.Printf("nodes quarantined (cordoned) per second: %.1f (%d in %v from the first XID sent to the last cordon)\n",
			float64(acted+held)/span.Seconds(), acted+held, span.Round(time.Millisecond))
	}
	fmt.Printf("XID sent by the node -> cordoned: %s\n", quantiles(toCordon))
	fmt.Printf("process CPU: %v over %v wall (%.1f%% of one core; gateway, %d daemons and workers together)\n",
		used.Round(time.Millisecond), wall.Round(time.Millisecond), 100*used.Seconds()/wall.Seconds(), n)
	return nil
}

// remediationCases reads every case of pool.
func remediationCases(ctx context.Context, st store.Store, pool string) ([]*store.Remediation, error) {
	var out []*store.Remediation
	q := &store.RemediationListParams{PoolID: pool, ListParams: store.ListParams{Limit: store.MaxListLimit}}
	for {
		page, err := st.RemediationList(ctx, q)
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		if len(page) < q.Limit {
			return out, nil
		}
		q.Cursor = page[len(page)-1].ID
	}
}
