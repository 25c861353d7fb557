package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/gateway"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/serve"
	"github.com/better-compute/better-compute/controlplane/store"
)

func devCmd(e *env) *cobra.Command {
	var (
		n           int
		port        int
		gatewayPort int
		pub         publicFlags
	)
	cmd := &cobra.Command{
		Use:   "dev [--sim N]",
		Short: "Run the control plane on the embedded default with N simulated daemons",
		Long: "dev starts serve on the embedded default (SQLite in the data directory), on 127.0.0.1,\n" +
			"and N FakeDaemons that join through a real join token and hold real sessions over TLS,\n" +
			"each reporting a simulated NVIDIA DGX A100. SIGUSR1 stops one simulated daemon (its node goes\n" +
			"unreachable). SIGUSR2 applies the faults listed in <data-dir>/" + sim.FaultFile + ", one a line\n" +
			"(\"xid sim-00001 3 79\", \"ecc 2 0 4\", \"lose-gpu 0 5\", \"pcie 0 1 width=8\", \"fabric 0 2 IN_PROGRESS\",\n" +
			"\"persistence 0 3 off\", \"fabric-manager 0 failed\", \"remove-gpu 0 6\", \"versions 2 535.104.05\",\n" +
			"\"hang 1\", \"disconnect 1 30s\", \"recovery all reset=30s reboot=2m\", \"clear all\"; docs/gpu-health.md).\n" +
			"Ctrl-C stops everything.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if n < 0 || n > 100000 {
				return usageError{fmt.Errorf("--sim %d: want 0 to 100000", n)}
			}
			// dev listens on loopback, unless a public URL off loopback
			// asks other machines in: then on every address. That is its
			// default; host.listen and host.gateway.listen in a
			// configuration file win, and --port and --gateway-port
			// replace only their ports (issue 41).
			f := config.Flags{}
			pub.apply(&f)
			host := "127.0.0.1"
			if u, err := url.Parse(pub.publicURL); err == nil && u.Hostname() != "" && !config.IsLoopbackHost(u.Hostname()) {
				host = "0.0.0.0"
			}
			f.DefaultListen = net.JoinHostPort(host, "3000")
			f.DefaultGatewayListen = net.JoinHostPort(host, "8443")
			for _, p := range []struct {
				name string
				port int
				dst  *string
			}{{"port", port, &f.ListenPort}, {"gateway-port", gatewayPort, &f.GatewayListenPort}} {
				if !cmd.Flags().Changed(p.name) {
					continue
				}
				if p.port < 0 || p.port > 65535 {
					return usageError{fmt.Errorf("--%s %d is out of range 0-65535", p.name, p.port)}
				}
				*p.dst = strconv.Itoa(p.port)
			}
			cfg, err := e.load(f)
			if err != nil {
				return err
			}
			if !cfg.Embedded {
				return usageError{errors.New("dev runs on the embedded default; unset " + config.EnvDatabaseURL)}
			}
			return portInUse(runDev(cmd.Context(), e, cfg, n),
				listenFlag{cfg.Host.Listen, "choose another with --port N (0 picks a free one)"},
				listenFlag{cfg.Host.Gateway.Listen, "choose another with --gateway-port N (0 picks a free one)"})
		},
	}
	cmd.Flags().IntVar(&n, "sim", 3, "number of simulated daemons")
	cmd.Flags().IntVar(&port, "port", 3000, "API port; replaces only the port of host.listen (default 127.0.0.1:3000; 0 picks a free one)")
	cmd.Flags().IntVar(&gatewayPort, "gateway-port", 8443, "gateway port; replaces only the port of host.gateway.listen (default 127.0.0.1:8443; 0 picks a free one)")
	pub.add(cmd)
	return cmd
}

func runDev(ctx context.Context, e *env, cfg *config.Config, n int) error {
	// A line per step, so that a first start (which makes the secret, the
	// database and the PKI) shows where it is (issue 51).
	fmt.Fprintf(e.stdout, "Starting Better Compute dev in %s\n", cfg.DataDir)
	if n > 0 {
		// Every simulated daemon comes from 127.0.0.1: the bounds per
		// source address (docs/gateway.md, "Connection setup") would
		// make them queue behind one another, so there they are the
		// bounds in all, and joins are not rate-limited.
		l := &cfg.Host.Gateway.Limits
		l.PendingPerSource, l.QueuedPerSource = l.Pending, l.Queued
		l.JoinsPerSecond, l.JoinBurst = max(l.JoinsPerSecond, 100000), max(l.JoinBurst, n)
	}
	st, err := openStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer st.Close()
	fmt.Fprintln(e.stdout, "  database  SQLite opened; applying migrations, then the PKI (made on the first run), the API and the gateway")
	g, ctx := errgroup.WithContext(ctx)
	apiReady := make(chan *api.Server, 1)
	gwReady := make(chan *gateway.Gateway, 1)
	g.Go(func() error {
		return serve.Run(ctx, cfg, st, serve.Options{Version: version, Commit: commit, Log: e.log, Now: testNow,
			APIReady:     func(s *api.Server) { apiReady <- s },
			GatewayReady: func(gw *gateway.Gateway) { gwReady <- gw }})
	})
	g.Go(func() error {
		var srv *api.Server
		var gw *gateway.Gateway
		for srv == nil || gw == nil {
			select {
			case <-ctx.Done():
				return nil
			case srv = <-apiReady:
			case gw = <-gwReady:
			}
		}
		apiURL := apiURLOf(cfg, srv)
		fmt.Fprintf(e.stdout, "Better Compute is running on the embedded default (%s)\n", cfg.DataDir)
		fmt.Fprintf(e.stdout, "  API      %s%s  (admin token in %s)\n", apiURL, cfg.BasePath, filepath.Join(cfg.DataDir, serve.AdminTokenFile))
		fmt.Fprintf(e.stdout, "  gateway  %s\n", gw.PublicURL())
		if n == 0 {
			fmt.Fprintln(e.stdout, "Press Ctrl-C to stop.")
			return nil
		}
		token, err := devJoinToken(ctx, st, cfg, n)
		if err != nil {
			return err
		}
		// The simulated daemons keep their identities in the data
		// directory (sim/<name>), so their node ids stay the same from
		// one run to the next. The nodes of an earlier run that no daemon
		// holds now (fewer daemons, an expired certificate) would stay
		// behind, unreachable, beside the new ones: they are removed.
		fleet, err := sim.NewFleet(sim.FleetConfig{GatewayURL: gw.PublicURL(), Token: token, N: n,
			StateDir: filepath.Join(cfg.DataDir, devSimStateDir)})
		if err != nil {
			return err
		}
		keep := map[string]bool{}
		for _, d := range fleet.Daemons() {
			if id := d.NodeID(); id != "" {
				keep[id] = true
			}
		}
		if removed, err := removeSimulatedNodes(ctx, st, keep); err != nil {
			return err
		} else if removed > 0 {
			fmt.Fprintf(e.stdout, "  removed %d simulated node(s) of an earlier dev run\n", removed)
		}
		fmt.Fprintf(e.stdout, "  joining %d simulated daemon(s) through the gateway (%d kept from an earlier run)\n", n, len(keep))
		if err := fleet.Join(ctx); err != nil {
			return fmt.Errorf("join simulated daemons: %w", err)
		}
		g.Go(func() error { return fleet.Run(ctx) })
		stopSig := make(chan os.Signal, 1)
		signal.Notify(stopSig, syscall.SIGUSR1)
		g.Go(func() error { return stopOnSignal(ctx, e, fleet, stopSig) })
		faultSig := make(chan os.Signal, 1)
		signal.Notify(faultSig, syscall.SIGUSR2)
		g.Go(func() error {
			return faultsOnSignal(ctx, e, fleet, filepath.Join(cfg.DataDir, sim.FaultFile), faultSig)
		})
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		_ = fleet.WaitFor(wctx, func(s sim.FleetStats) bool { return s.Connected >= n })
		// The lines below invite a GPU query at once: wait (within the
		// same minute) until the gateway has stored each daemon's
		// inventory, which it writes in batches after the Welcome.
		waitInventories(wctx, st, fleet.Daemons())
		fmt.Fprintf(e.stdout, "%d simulated daemons connected (%d GPUs each). Look at the fleet:\n", fleet.Stats().Connected, 8)
		fmt.Fprintf(e.stdout, "  better-compute nodes list --server %s --data-dir %s\n", apiURL, cfg.DataDir)
		fmt.Fprintf(e.stdout, "  better-compute nodes list --server %s --data-dir %s --gpu-model A100 --min-gpus 8\n", apiURL, cfg.DataDir)
		fmt.Fprintln(e.stdout, "Press Ctrl-C to stop.")
		return nil
	})
	err = g.Wait()
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// stopOnSignal stops one simulated daemon (the last one still running) on
// each signal from sig (SIGUSR1), as if its machine stopped answering: a
// test, or a demo, sees its node go unreachable. It returns when ctx ends.
func stopOnSignal(ctx context.Context, e *env, fleet *sim.Fleet, sig chan os.Signal) error {
	defer signal.Stop(sig)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sig:
			if d := fleet.StopDaemon(); d != nil {
				fmt.Fprintf(e.stdout, "Stopped simulated daemon %s (node %s)\n", d.Name(), d.NodeID())
			}
		}
	}
}

// faultsOnSignal applies the faults in path (sim.Fleet.ApplyFaults) on each
// signal from sig (SIGUSR2), so that a demo or a test can raise an XID or
// hang a node of a running dev. A bad line is reported and the lines after
// it are not applied. It returns when ctx ends.
func faultsOnSignal(ctx context.Context, e *env, fleet *sim.Fleet, path string, sig chan os.Signal) error {
	defer signal.Stop(sig)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sig:
			f, err := os.Open(path)
			if err != nil {
				fmt.Fprintf(e.stderr, "Simulated faults: %v\n", err)
				continue
			}
			n, err := fleet.ApplyFaults(f)
			f.Close()
			fmt.Fprintf(e.stdout, "Applied %d simulated fault(s) from %s\n", n, path)
			if err != nil {
				fmt.Fprintf(e.stderr, "Simulated faults: %s: %v\n", path, err)
			}
		}
	}
}

// devSimTokenDescription marks the join tokens dev makes for its
// simulated daemons.
const devSimTokenDescription = "dev --sim"

// devSimStateDir is the folder in the data directory where dev's simulated
// daemons keep their identities (sim.FleetConfig.StateDir).
const devSimStateDir = "sim"

// removeSimulatedNodes deletes the nodes that joined with a token dev made
// for simulated daemons, but those in keep (held by this run's daemons),
// and returns how many.
// waitInventories waits until the node of each of daemons has an
// inventory stored, or ctx ends; it polls every 100 ms.
func waitInventories(ctx context.Context, st store.Store, daemons []*sim.FakeDaemon) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		stored := 0
		for _, d := range daemons {
			if n, err := st.NodeGet(ctx, d.NodeID()); err == nil && n.InventoryDigest != "" {
				stored++
			}
		}
		if stored == len(daemons) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func removeSimulatedNodes(ctx context.Context, st store.Store, keep map[string]bool) (int, error) {
	sim := map[string]bool{}
	removed := 0
	for cursor := ""; ; {
		nodes, err := st.NodeList(ctx, &store.NodeListParams{ListParams: store.ListParams{Cursor: cursor, Limit: store.MaxListLimit}})
		if err != nil {
			return removed, fmt.Errorf("list nodes: %w", err)
		}
		for _, n := range nodes {
			if n.JoinTokenID == "" {
				continue
			}
			isSim, seen := sim[n.JoinTokenID]
			if !seen {
				t, err := st.JoinTokenGet(ctx, n.JoinTokenID)
				isSim = err == nil && t.Description == devSimTokenDescription
				sim[n.JoinTokenID] = isSim
			}
			if isSim && !keep[n.ID] {
				if err := st.NodeDelete(ctx, n.ID); err != nil {
					return removed, fmt.Errorf("remove simulated node %s: %w", n.ID, err)
				}
				removed++
			}
		}
		if len(nodes) < store.MaxListLimit {
			return removed, nil
		}
		cursor = nodes[len(nodes)-1].ID
	}
}

// devJoinToken makes a token of the default pool admitting n joins.
func devJoinToken(ctx context.Context, st store.Store, cfg *config.Config, n int) (string, error) {
	b, err := bootstrap.LoadBundle(ctx, st, cfg.Secret)
	if err != nil {
		return "", err
	}
	pool, err := st.PoolGet(ctx, bootstrap.DefaultPool)
	if err != nil {
		return "", fmt.Errorf("default pool: %w", err)
	}
	token, _, err := api.CreateJoinToken(ctx, st, b.GatewayPin(), pool.ID, time.Hour, n, devSimTokenDescription, "")
	return token, err
}
