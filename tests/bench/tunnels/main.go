// Command tunnels measures tunnels end to end on loopback (docs/tunnels.md):
// a real api (HTTP, WebSocket) and gateway (gRPC over TLS) in this process
// on the embedded store, and one FakeDaemon whose session runs bcd's real
// tunnel handler (bcd/tunnel: a PTY shell, TCP to 127.0.0.1:port).
//
//	go run ./tests/bench/tunnels -keys 500 -mib 256 -idle 200 [-split]
//
// With -split the api reaches the gateway over the internal control API
// (loopback mutual TLS, package control) as in a split deployment.
//
// It prints the keystroke round trip through a shell (a byte typed to
// `cat` on the node's PTY until its echo is back: client -> api ->
// gateway -> node -> PTY and back; p50, p99), port-forward throughput
// each way through the relay (MB/s), and the memory of idle tunnels held
// open (the Go heap and stacks of this process per tunnel, both the
// control plane's side and the in-process node side: an upper bound of
// the gateway's and api's share), as tunnels per GiB.
package main

import (
	"bytes"
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	bcdtunnel "github.com/better-compute/better-compute/bcd/tunnel"
	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/gateway"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/control"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/pkg/tunnel"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

func main() {
	keys := flag.Int("keys", 500, "keystroke samples")
	mib := flag.Int("mib", 256, "MiB sent each way through a port forward")
	idle := flag.Int("idle", 200, "idle tunnels held open for the memory figure")
	split := flag.Bool("split", false, "relay through the internal control API (the api and the gateway as separate roles, loopback mTLS) instead of in process")
	flag.Parse()
	if err := run(*keys, *mib, *idle, *split); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(keys, mib, idle int, split bool) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	dir, _ := os.MkdirTemp("", "bench-tunnels-")
	defer os.RemoveAll(dir)
	st, err := sqlite.Open(ctx, filepath.Join(dir, "state.db"))
	if err != nil {
		return err
	}
	defer st.Close()
	if _, err := st.Migrate(ctx); err != nil {
		return err
	}
	bundle, err := pki.Init(pki.InitOptions{TrustDomain: "bench.local"})
	if err != nil {
		return err
	}
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
	var ctrl *control.Server
	var cl *control.Client
	if split {
		id := func(name string) (*control.Identity, error) {
			c, k, err := bootstrap.WriteInternalCert(bundle, filepath.Join(dir, name), name, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, 0)
			if err != nil {
				return nil, err
			}
			return control.NewIdentity(bundle, c, k, log)
		}
		gid, err := id("gw-1")
		if err != nil {
			return err
		}
		if ctrl, err = control.Listen(control.ServerConfig{Listen: "127.0.0.1:0"}, gid, log); err != nil {
			return err
		}
		aid, err := id("api-1")
		if err != nil {
			return err
		}
		if cl, err = control.NewClient(control.ClientConfig{}, aid, st, log); err != nil {
			return err
		}
		defer cl.Close()
	}
	gcfg := gateway.Config{Listen: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile,
		MaxConnectingPerSource: 64, MaxQueuedPerSource: 4096, JoinRate: 1e6, JoinBurst: 100000}
	if ctrl != nil {
		gcfg.InternalAddress = ctrl.Address()
	}
	gw, err := gateway.New(gcfg, st, bundle, log)
	if err != nil {
		return err
	}
	go gw.Run(ctx)
	<-gw.Ready()
	var opener tunnel.Opener = gw
	mode := "in process (all-in-one)"
	if ctrl != nil {
		go ctrl.Run(ctx, gw)
		opener, mode = cl, "through the internal control API relay (split roles)"
	}
	fmt.Printf("tunnels %s\n", mode)
	// Shells are recorded, sealed under the deployment secret, as in a
	// deployment (docs/tunnels.md, "Recorded shells").
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Tunnels: opener, Secret: strings.Repeat("b", 32)}, st, log)
	go srv.Run(ctx)
	<-srv.Ready()
	c := &client.Client{BaseURL: "http://" + srv.Addr().String() + "/api", Token: admin}

	token, _, err := api.CreateJoinToken(ctx, st, bundle.GatewayPin(), pool.ID, time.Hour, 1000, "bench", "")
	if err != nil {
		return err
	}
	// Idle tunnels are spread over nodes: one node holds at most
	// gateway.MaxTunnelsPerNode at once.
	daemons := max(1, (idle+gateway.MaxTunnelsPerNode-1)/gateway.MaxTunnelsPerNode)
	fleet, err := sim.NewFleet(sim.FleetConfig{GatewayURL: gw.PublicURL(), Token: token, N: daemons, NoInventory: true,
		Session: session.Config{StartJitter: -1, Capabilities: []string{sessionv1.CapabilityTunnel}, Tunnels: bcdtunnel.New(bcdtunnel.Config{Shell: "/bin/sh"})}})
	if err != nil {
		return err
	}
	if err := fleet.Join(ctx); err != nil {
		return err
	}
	go fleet.Run(ctx)
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if err := fleet.WaitFor(wctx, func(s sim.FleetStats) bool { return s.Connected >= daemons }); err != nil {
		return err
	}
	var nodes []string
	for _, d := range fleet.Daemons() {
		nodes = append(nodes, d.NodeID())
	}
	node := nodes[0]

	if err := keystrokes(ctx, c, node, keys); err != nil {
		return fmt.Errorf("keystrokes: %w", err)
	}
	if err := throughput(ctx, c, node, mib); err != nil {
		return fmt.Errorf("throughput: %w", err)
	}
	if err := idleTunnels(ctx, c, nodes, idle); err != nil {
		return fmt.Errorf("idle tunnels: %w", err)
	}
	return nil
}

// keystrokes types one byte at a time to cat on the node's PTY and times
// each echo.
func keystrokes(ctx context.Context, c *client.Client, node string, n int) error {
	t, err := c.OpenTunnel(ctx, &apiv1.CreateTunnelRequest{Node: node, Kind: "shell"}, nil)
	if err != nil {
		return err
	}
	defer t.Close()
	var out []byte
	waitFor := func(b []byte, times int) error {
		for bytes.Count(out, b) < times {
			f, err := t.Recv(ctx)
			if err != nil {
				return err
			}
			out = append(out, f.GetData()...)
		}
		out = out[:0]
		return nil
	}
	if err := t.Send(ctx, tunnel.Data([]byte("exec cat\n"))); err != nil {
		return err
	}
	if err := t.Send(ctx, tunnel.Data([]byte("ready\n"))); err != nil {
		return err
	}
	if err := waitFor([]byte("ready\r\n"), 2); err != nil { // the echo, then cat's copy
		return err
	}
	var lat []time.Duration
	for i := range n {
		k := []byte{byte('a' + i%26)}
		start := time.Now()
		if err := t.Send(ctx, tunnel.Data(k)); err != nil {
			return err
		}
		if err := waitFor(k, 1); err != nil {
			return err
		}
		lat = append(lat, time.Since(start))
	}
	fmt.Printf("keystroke round trip (shell tunnel, loopback): p50 %v, p99 %v, max %v (%d keystrokes)\n",
		pct(lat, 50), pct(lat, 99), pct(lat, 100), len(lat))
	return nil
}

// throughput sends mib MiB to a TCP sink on the node, then reads mib MiB
// from a TCP source there, each through a port tunnel.
func throughput(ctx context.Context, c *client.Client, node string, mib int) error {
	total := int64(mib) << 20
	sink, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer sink.Close()
	got := make(chan int64, 1)
	go func() {
		conn, err := sink.Accept()
		if err != nil {
			got <- 0
			return
		}
		n, _ := io.Copy(io.Discard, conn)
		conn.Close()
		got <- n
	}()
	t, err := c.OpenTunnel(ctx, &apiv1.CreateTunnelRequest{Node: node, Kind: "port", Port: int32(sink.Addr().(*net.TCPAddr).Port)}, nil)
	if err != nil {
		return err
	}
	chunk := make([]byte, 32<<10)
	start := time.Now()
	for sent := int64(0); sent < total; sent += int64(len(chunk)) {
		if err := t.Send(ctx, tunnel.Data(chunk)); err != nil {
			return err
		}
	}
	if err := t.Send(ctx, tunnel.EOF()); err != nil {
		return err
	}
	n := <-got
	up := time.Since(start)
	t.Close()
	if n != total {
		return fmt.Errorf("the sink got %d of %d bytes", n, total)
	}

	src, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer src.Close()
	go func() {
		conn, err := src.Accept()
		if err != nil {
			return
		}
		buf := make([]byte, 64<<10)
		for sent := int64(0); sent < total; sent += int64(len(buf)) {
			if _, err := conn.Write(buf); err != nil {
				break
			}
		}
		conn.Close()
	}()
	t, err = c.OpenTunnel(ctx, &apiv1.CreateTunnelRequest{Node: node, Kind: "port", Port: int32(src.Addr().(*net.TCPAddr).Port)}, nil)
	if err != nil {
		return err
	}
	defer t.Close()
	start = time.Now()
	var read int64
	for read < total {
		f, err := t.Recv(ctx)
		if err != nil {
			return err
		}
		read += int64(len(f.GetData()))
	}
	down := time.Since(start)
	mb := float64(total) / 1e6
	fmt.Printf("port-forward throughput through the relay: client->node %.0f MB/s, node->client %.0f MB/s (%d MiB each way)\n",
		mb/up.Seconds(), mb/down.Seconds(), mib)
	return nil
}

// idleTunnels holds n port tunnels to an idle TCP server open and reports
// the memory they take.
func idleTunnels(ctx context.Context, c *client.Client, nodes []string, n int) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
		}
	}()
	port := int32(ln.Addr().(*net.TCPAddr).Port)
	before := mem()
	var open []*client.Tunnel
	for i := range n {
		t, err := c.OpenTunnel(ctx, &apiv1.CreateTunnelRequest{Node: nodes[i%len(nodes)], Kind: "port", Port: port}, nil)
		if err != nil {
			return err
		}
		open = append(open, t)
	}
	time.Sleep(time.Second) // let the tunnels settle into their idle reads
	after := mem()
	per := float64(after-before) / float64(n)
	fmt.Printf("idle tunnels: %d open, %.1f KiB each (heap and stacks of api, gateway and the in-process node side together), %.0f per GiB\n",
		n, per/1024, float64(1<<30)/per)
	for _, t := range open {
		t.Close()
	}
	// Let the api record the tunnels' ends before the store closes.
	time.Sleep(2 * time.Second)
	return nil
}

// mem is the process's Go heap in use plus goroutine stacks, after a GC.
func mem() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
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
