// Command internalwake measures commit-to-node dispatch latency in a split
// deployment with the internal control API (docs/tunnels.md): the api and
// two gateways as separate roles (in this process, each with its own
// listeners, talking over loopback mTLS and the database only), PostgreSQL,
// and N FakeDaemons split between the gateways that note when each command
// reaches them. The gateways get no other wake-up (no LISTEN/NOTIFY): a
// command that misses the internal API waits for the 1-second loop, which
// shows in p99.
//
//	go run ./tests/bench/internalwake -n 200 -samples 300 -db postgres://postgres@127.0.0.1:5432/test?sslmode=disable
//
// It prints p50, p99 and max of the time from the api call's start to the
// node receiving the command, and the internal wake-ups each gateway got.
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"log/slog"
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
	"github.com/better-compute/better-compute/controlplane/pkg/control"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

func main() {
	n := flag.Int("n", 200, "FakeDaemons, split between two gateways")
	db := flag.String("db", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL server URL (a fresh schema is made and dropped)")
	samples := flag.Int("samples", 300, "latency samples")
	flag.Parse()
	if err := run(*n, *db, *samples); err != nil {
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

// wakeCount counts a gateway's wake-ups by source (gateway.Metrics).
type wakeCount struct {
	internal, bus atomic.Int64
}

func (*wakeCount) Handshake(string)                                       {}
func (*wakeCount) SessionOpened(string, bool)                             {}
func (*wakeCount) Refused(string, string)                                 {}
func (*wakeCount) HeartbeatReceived(string, time.Duration, time.Duration) {}
func (*wakeCount) DispatchLatency(time.Duration)                          {}
func (*wakeCount) CommandFinished(string, string)                         {}
func (*wakeCount) ClockSkewMax(string, time.Duration)                     {}
func (*wakeCount) XIDNoAction(uint32)                                     {}
func (w *wakeCount) Wakeup(_, source string) {
	if source == gateway.WakeInternal {
		w.internal.Add(1)
	} else {
		w.bus.Add(1)
	}
}

func openStore(ctx context.Context, db string) (store.Store, func(), error) {
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
		if st != nil {
			st.Close()
		}
		conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		conn.Close(context.Background())
	}, err
}

func run(n int, db string, samples int) error {
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
	dir, _ := os.MkdirTemp("", "bench-internalwake-")
	defer os.RemoveAll(dir)
	loop := []net.IP{net.IPv4(127, 0, 0, 1)}
	certFile, keyFile, err := bootstrap.WriteGatewayCert(bundle, dir, []string{"localhost"}, loop, 0)
	if err != nil {
		return err
	}
	identity := func(name string) (*control.Identity, error) {
		c, k, err := bootstrap.WriteInternalCert(bundle, filepath.Join(dir, name), name, []string{"localhost"}, loop, 0)
		if err != nil {
			return nil, err
		}
		return control.NewIdentity(bundle, c, k, log)
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

	type gw struct {
		g     *gateway.Gateway
		wakes *wakeCount
	}
	var gws []gw
	for i := range 2 {
		id, err := identity(fmt.Sprintf("gw-%d", i+1))
		if err != nil {
			return err
		}
		ctrl, err := control.Listen(control.ServerConfig{Listen: "127.0.0.1:0"}, id, log)
		if err != nil {
			return err
		}
		wc := &wakeCount{}
		g, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, MaxStreams: n + 100,
			HandshakeRate: 2000, HandshakeBurst: 200, MaxConnectingPerSource: 256, MaxQueuedPerSource: 4096,
			JoinRate: 1e6, JoinBurst: 100000, InternalAddress: ctrl.Address(), Metrics: wc}, st, bundle, log)
		if err != nil {
			return err
		}
		go g.Run(ctx)
		<-g.Ready()
		go ctrl.Run(ctx, g)
		gws = append(gws, gw{g, wc})
	}
	apiID, err := identity("api-1")
	if err != nil {
		return err
	}
	internal, err := control.NewClient(control.ClientConfig{}, apiID, st, log)
	if err != nil {
		return err
	}
	defer internal.Close()
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Waker: internal, Revoker: internal}, st, log)
	go srv.Run(ctx)
	<-srv.Ready()
	c := &client.Client{BaseURL: "http://" + srv.Addr().String() + "/api", Token: admin}

	rec := &receipts{when: map[string]time.Time{}}
	var nodes []string
	for i, g := range gws {
		token, _, err := api.CreateJoinToken(ctx, st, bundle.GatewayPin(), pool.ID, time.Hour, n/2, "bench", "")
		if err != nil {
			return err
		}
		fleet, err := sim.NewFleet(sim.FleetConfig{GatewayURL: g.g.PublicURL(), Token: token, N: n / 2, NoInventory: true,
			NamePrefix: fmt.Sprintf("gw%d", i+1), Session: session.Config{Handler: rec, StartJitter: -1}})
		if err != nil {
			return err
		}
		if err := fleet.Join(ctx); err != nil {
			return err
		}
		go fleet.Run(ctx)
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
		err = fleet.WaitFor(wctx, func(s sim.FleetStats) bool { return s.Connected >= n/2 })
		wcancel()
		if err != nil {
			return fmt.Errorf("waiting for sessions: %w", err)
		}
		for _, d := range fleet.Daemons() {
			nodes = append(nodes, d.NodeID())
		}
	}
	fmt.Printf("store %s; api and 2 gateways (%d and %d sessions), internal control API over loopback mTLS, no LISTEN/NOTIFY\n",
		st.Dialect(), gws[0].g.Sessions(), gws[1].g.Sessions())

	var lat []time.Duration
	for i := range samples {
		node := nodes[(i*7919)%len(nodes)]
		start := time.Now()
		resp := &apiv1.CreateCommandsResponse{}
		if err := c.Call(ctx, "commands.create", &apiv1.CreateCommandsRequest{NodeIds: []string{node}, Kind: "exec",
			Exec: &apiv1.ExecSpec{Argv: []string{"true"}}}, resp); err != nil {
			return err
		}
		id := resp.Commands[0].Id
		deadline := time.Now().Add(10 * time.Second)
		for {
			if t, ok := rec.at(id); ok {
				lat = append(lat, t.Sub(start))
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("command %s never reached its node", id)
			}
			time.Sleep(100 * time.Microsecond)
		}
		// Spread samples over the dispatch loop's phase.
		time.Sleep(time.Duration(i%7) * 13 * time.Millisecond)
	}
	fmt.Printf("commit-to-node dispatch latency (api call start -> node receives): p50 %v, p99 %v, max %v (%d samples)\n",
		pct(lat, 50), pct(lat, 99), pct(lat, 100), len(lat))
	for i, g := range gws {
		fmt.Printf("gateway %d: %d internal wake-ups, %d bus wake-ups\n", i+1, g.wakes.internal.Load(), g.wakes.bus.Load())
	}
	return nil
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
