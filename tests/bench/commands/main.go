// Command commands measures command dispatch and throughput end to end:
// a real gateway and API (in this process, on loopback, over real TLS and
// HTTP), a real store, and N FakeDaemons that answer each command at once.
//
//	go run ./tests/bench/commands -n 1000 -db postgres://postgres@127.0.0.1:5432/test
//
// It prints the dispatch latency from the API call to the node receiving the
// command (p50, p99), with the API's wake-up and with the 1-second loop alone,
// and the end-to-end rate (create → terminal) of commands to every node.
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
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/gateway"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/metrics"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/pkg/wake"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

func main() {
	n := flag.Int("n", 1000, "FakeDaemons")
	db := flag.String("db", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL server URL (a fresh schema is made and dropped); \"sqlite\" for the embedded store")
	samples := flag.Int("samples", 200, "latency samples")
	rounds := flag.Int("rounds", 10, "throughput: commands.create calls targeting every node")
	flag.Parse()
	if err := run(*n, *db, *samples, *rounds); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// receipts records when each command reached a node.
type receipts struct {
	mu   sync.Mutex
	when map[string]time.Time
}

func (r *receipts) HandleCommand(_ context.Context, cmd *sessionv1.Command, send func(*sessionv1.CommandUpdate) error) {
	r.mu.Lock()
	if _, ok := r.when[cmd.GetId()]; !ok {
		r.when[cmd.GetId()] = time.Now()
	}
	r.mu.Unlock()
	_ = send(&sessionv1.CommandUpdate{CommandId: cmd.GetId(), UpdateSeq: 1, Update: &sessionv1.CommandUpdate_Result{
		Result: &sessionv1.CommandResult{CommandId: cmd.GetId(), State: sessionv1.CommandState_COMMAND_STATE_SUCCEEDED}}})
}

func (r *receipts) HandleCancel(context.Context, *sessionv1.Cancel) {}

func (r *receipts) at(id string) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.when[id]
	return t, ok
}

func openStore(ctx context.Context, db string) (store.Store, func(), error) {
	if db == "sqlite" {
		dir, err := os.MkdirTemp("", "bench-commands-")
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

func run(n int, db string, samples, rounds int) error {
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
	admin, _, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleAdmin})
	if err != nil {
		return err
	}

	bus := wake.NewBus(nil)
	wakeups, _ := bus.Subscribe()
	var withWake bool
	m := &countFinished{Metrics: metrics.New(metrics.Config{}, st)}
	finished := &m.finished // an *atomic.Int64
	gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, MaxStreams: n + 100,
		HandshakeRate: 2000, HandshakeBurst: 200, MaxConnectingPerSource: 256, MaxQueuedPerSource: 4096,
		JoinRate: 1e6, JoinBurst: 100000, Wakeups: wakeups, Metrics: m}, st, bundle, log)
	if err != nil {
		return err
	}
	go gw.Run(ctx)
	<-gw.Ready()
	waker := &switchWaker{bus: bus, on: &withWake}
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Waker: waker}, st, log)
	go srv.Run(ctx)
	<-srv.Ready()
	c := &client.Client{BaseURL: "http://" + srv.Addr().String() + "/api", Token: admin}

	token, _, err := api.CreateJoinToken(ctx, st, bundle.GatewayPin(), pool.ID, time.Hour, n, "bench", "")
	if err != nil {
		return err
	}
	rec := &receipts{when: map[string]time.Time{}}
	fleet, err := sim.NewFleet(sim.FleetConfig{GatewayURL: gw.PublicURL(), Token: token, N: n, NoInventory: true,
		Session: session.Config{Handler: rec, StartJitter: -1}})
	if err != nil {
		return err
	}
	joinStart := time.Now()
	if err := fleet.Join(ctx); err != nil {
		return err
	}
	fmt.Printf("joined %d FakeDaemons in %v (%.0f joins/s)\n", n, time.Since(joinStart).Round(time.Millisecond), float64(n)/time.Since(joinStart).Seconds())
	go fleet.Run(ctx)
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer wcancel()
	if err := fleet.WaitFor(wctx, func(s sim.FleetStats) bool { return s.Connected >= n }); err != nil {
		return fmt.Errorf("waiting for sessions: %w", err)
	}
	nodes := make([]string, 0, n)
	for _, d := range fleet.Daemons() {
		nodes = append(nodes, d.NodeID())
	}
	fmt.Printf("store %s, %d sessions on one gateway\n", st.Dialect(), gw.Sessions())

	for _, wakeOn := range []bool{true, false} {
		withWake = wakeOn
		lat, err := latency(ctx, c, rec, nodes, samples, wakeOn)
		if err != nil {
			return err
		}
		mode := "with the wake-up"
		if !wakeOn {
			mode = "with the 1-second loop alone"
		}
		fmt.Printf("dispatch latency %s: p50 %v, p99 %v (%d samples)\n", mode, pct(lat, 50), pct(lat, 99), len(lat))
	}
	withWake = true
	rate, err := throughput(ctx, c, finished, nodes, rounds)
	if err != nil {
		return err
	}
	fmt.Printf("end to end: %.0f commands/s (%d commands, create -> terminal, %d nodes)\n", rate, rounds*len(nodes), len(nodes))
	return nil
}

// switchWaker forwards wake-ups while on is set.
type switchWaker struct {
	bus *wake.Bus
	on  *bool
}

func (w *switchWaker) Wake(ctx context.Context, nodes []string) {
	if *w.on {
		w.bus.Wake(ctx, nodes)
	}
}

func latency(ctx context.Context, c *client.Client, rec *receipts, nodes []string, samples int, wakeOn bool) ([]time.Duration, error) {
	var out []time.Duration
	for i := range samples {
		node := nodes[i%len(nodes)]
		start := time.Now()
		resp := &apiv1.CreateCommandsResponse{}
		if err := c.Call(ctx, "commands.create", &apiv1.CreateCommandsRequest{NodeIds: []string{node}, Kind: "exec",
			Exec: &apiv1.ExecSpec{Argv: []string{"true"}}}, resp); err != nil {
			return nil, err
		}
		id := resp.Commands[0].Id
		deadline := time.Now().Add(10 * time.Second)
		for {
			if t, ok := rec.at(id); ok {
				out = append(out, t.Sub(start))
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("command %s never reached its node", id)
			}
			time.Sleep(200 * time.Microsecond)
		}
		// Spread samples over the dispatch loop's phase.
		if wakeOn {
			time.Sleep(time.Duration(i%7) * 13 * time.Millisecond)
		} else {
			time.Sleep(time.Duration(mrand.Int64N(int64(time.Second))))
		}
	}
	return out, nil
}

func throughput(ctx context.Context, c *client.Client, finished *atomic.Int64, nodes []string, rounds int) (float64, error) {
	base := finished.Load()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, rounds)
	for range rounds {
		wg.Go(func() {
			resp := &apiv1.CreateCommandsResponse{}
			if err := c.Call(ctx, "commands.create", &apiv1.CreateCommandsRequest{NodeIds: nodes, Kind: "exec",
				Exec: &apiv1.ExecSpec{Argv: []string{"true"}}}, resp); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return 0, err
	}
	total := int64(rounds * len(nodes))
	for finished.Load()-base < total {
		if time.Since(start) > 5*time.Minute {
			return 0, fmt.Errorf("only %d of %d commands finished", finished.Load()-base, total)
		}
		time.Sleep(time.Millisecond)
	}
	return float64(total) / time.Since(start).Seconds(), nil
}

func pct(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := cmp.Or(len(s)*p/100, 0)
	if i >= len(s) {
		i = len(s) - 1
	}
	return s[i].Round(10 * time.Microsecond)
}

// countFinished is the gateway's metrics, counting the commands it saw end.
type countFinished struct {
	*metrics.Metrics
	finished atomic.Int64
}

func (c *countFinished) CommandFinished(kind, state string) {
	c.finished.Add(1)
	c.Metrics.CommandFinished(kind, state)
}
