// Command watch measures the fleet page (GET /watch, issue 49) with N
// simulated nodes in a real `serve` (embedded SQLite), in a real headless
// Chromium (chromedp): the page's first paint after login, and, for each
// of -updates changes (a node turned unreachable in the database, which
// the page's event stream notices from the node counts), the time until
// the page shows that node's GPUs as unknown in its counts.
//
//	go run ./tests/bench/watch -n 10000 -updates 5 -screenshot /tmp/watch.png
//
// The nodes are written straight into the store (with the simulator's
// inventory: 8 GPUs each, sim.FakeDaemon.Inventory), without sessions; the
// liveness window is made long (heartbeatInterval 1m × missedHeartbeats
// 30) so that serve's own liveness leaves them ready while the benchmark
// runs. It prints one "first-paint" line and one "update" line per
// change:
//
//	nodes n=10000 gpus=80000 seconds=41.2
//	first-paint nav_ms=812 fcp_ms=640 map_ms=830
//	update i=1 node=node_... ms=912
//
// Not part of tests/run.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/chromedp/chromedp"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
)

// nodesTx is what making the bench's nodes writes.
type nodesTx interface {
	NodeUpsert(ctx context.Context, p *store.NodeUpsertParams) (*store.Node, error)
	NodeSetInventory(ctx context.Context, id string, inventory []byte, digest string) error
	NodeSetState(ctx context.Context, id, state string) error
}

func main() {
	n := flag.Int("n", 10000, "simulated nodes")
	updates := flag.Int("updates", 5, "changes to time on the page")
	chromium := flag.String("chromium", "chromium", "the Chromium to drive")
	bin := flag.String("bin", "", "a better-compute binary (default: go build ./controlplane/cmd/better-compute)")
	shot := flag.String("screenshot", "", "save a screenshot of the page after the updates here")
	flag.Parse()
	if *n < 1 || *updates < 0 {
		fmt.Fprintln(os.Stderr, "watch bench: want -n >= 1 and -updates >= 0")
		os.Exit(2)
	}
	if err := run(*n, *updates, *chromium, *bin, *shot); err != nil {
		fmt.Fprintln(os.Stderr, "watch bench:", err)
		os.Exit(1)
	}
}

func run(n, updates int, chromium, bin, shot string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	dir, err := os.MkdirTemp("", "watch-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if bin == "" {
		bin = filepath.Join(dir, "better-compute")
		if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "./controlplane/cmd/better-compute").CombinedOutput(); err != nil {
			return fmt.Errorf("build better-compute: %v\n%s", err, out)
		}
	}
	apiPort, err := freePort()
	if err != nil {
		return err
	}
	gwPort, err := freePort()
	if err != nil {
		return err
	}
	dataDir := filepath.Join(dir, "data")
	cfg := filepath.Join(dir, "better-compute.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "host:\n  listen: 127.0.0.1:%d\n  gateway:\n    listen: 127.0.0.1:%d\n    heartbeatInterval: 1m\n    missedHeartbeats: 30\n", apiPort, gwPort), 0o600); err != nil {
		return err
	}
	serve := exec.CommandContext(ctx, bin, "serve", "--config", cfg)
	serve.Env = append(os.Environ(), "BETTER_COMPUTE_DATA_DIR="+dataDir)
	var logs bytes.Buffer
	serve.Stdout, serve.Stderr = &logs, &logs
	if err := serve.Start(); err != nil {
		return err
	}
	defer func() { _ = serve.Process.Signal(os.Interrupt); _ = serve.Wait() }()
	api := fmt.Sprintf("http://127.0.0.1:%d", apiPort)
	if err := waitHTTP(ctx, api+"/watch", 90*time.Second); err != nil {
		return fmt.Errorf("serve did not answer: %w\n%s", err, logs.String())
	}
	st, err := backend.Open(ctx, "", dataDir)
	if err != nil {
		return err
	}
	defer st.Close()
	pool, err := st.PoolGet(ctx, "default")
	if err != nil {
		return fmt.Errorf("the default pool: %w", err)
	}

	// The nodes, in transactions of 500.
	start := time.Now()
	ids := make([]string, 0, n)
	gpus := 0
	for i := 0; i < n; i += 500 {
		err := store.InTx(ctx, st, func(tx nodesTx) error {
			for j := i; j < min(i+500, n); j++ {
				name := fmt.Sprintf("bench-%05d", j)
				fd, err := sim.NewFakeDaemon(sim.DaemonConfig{Name: name, Session: session.Config{StartJitter: -1}})
				if err != nil {
					return err
				}
				inv := fd.Inventory()
				b, err := protojson.Marshal(inv)
				if err != nil {
					return err
				}
				id := store.NewID("node")
				if _, err := tx.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: pool.ID, Hostname: name, MachineID: name,
					BCDVersion: "bench", OS: "linux", Arch: "amd64"}); err != nil {
					return err
				}
				if err := tx.NodeSetInventory(ctx, id, b, inv.GetDigest()+id); err != nil {
					return err
				}
				if err := tx.NodeSetState(ctx, id, store.NodeReady); err != nil {
					return err
				}
				ids = append(ids, id)
				gpus += len(inv.GetGpus())
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("write nodes: %w", err)
		}
	}
	fmt.Printf("nodes n=%d gpus=%d seconds=%.1f\n", n, gpus, time.Since(start).Seconds())
	viewer, _, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleViewer, Description: "watch bench"})
	if err != nil {
		return err
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.Flag("headless", "new"), chromedp.WindowSize(1280, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	// The browser starts on bctx itself (a first run on a shorter-lived
	// context would close it with that context).
	if err := chromedp.Listen(bctx, func(any) {}); err != nil {
		return fmt.Errorf("start chromium: %w", err)
	}
	step := func(timeout time.Duration, actions ...chromedp.Action[chromedp.Void]) error {
		rctx, cancel := context.WithTimeout(bctx, timeout)
		defer cancel()
		return chromedp.Do(rctx, actions...)
	}
	eval := func(expr string) (string, error) {
		rctx, cancel := context.WithTimeout(bctx, 30*time.Second)
		defer cancel()
		return chromedp.Run(rctx, chromedp.Evaluate[string](expr))
	}
	if err := step(2*time.Minute, chromedp.Navigate(api+"/watch"), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), viewer), chromedp.Click(chromedp.CSS("#submit")),
		chromedp.WaitVisible(chromedp.CSS("#map"))); err != nil {
		return fmt.Errorf("log in: %w", err)
	}
	// First paint: a fresh load of the page, the session made.
	t0 := time.Now()
	if err := step(2*time.Minute, chromedp.Navigate(api+"/watch"), chromedp.WaitVisible(chromedp.CSS("#map"))); err != nil {
		return fmt.Errorf("load the page: %w", err)
	}
	mapMS := time.Since(t0).Milliseconds()
	nav, err := eval(`String(Math.round(performance.getEntriesByType("navigation")[0].responseEnd))`)
	if err != nil {
		return err
	}
	// Chromium records the paint entry a moment after the load.
	fcp := "-1"
	for range 20 {
		if fcp, err = eval(`String(Math.round((performance.getEntriesByName("first-contentful-paint")[0] || {startTime: -1}).startTime))`); err != nil {
			return err
		}
		if fcp != "-1" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Printf("first-paint nav_ms=%s fcp_ms=%s map_ms=%d\n", nav, fcp, mapMS)
	if err := step(time.Minute, chromedp.WaitVisible(chromedp.CSS("#live.on"))); err != nil {
		return fmt.Errorf("the page's stream: %w", err)
	}

	// Updates: a node unreachable; the page's unknown count moves by its
	// GPUs.
	for i := 1; i <= updates; i++ {
		unknown, err := eval(`document.querySelector('#map-counts li[data-state="unknown"] b').textContent`)
		if err != nil {
			return err
		}
		was, _ := strconv.Atoi(unknown)
		id := ids[(i*7919)%len(ids)]
		t := time.Now()
		if err := st.NodeSetState(ctx, id, store.NodeUnreachable); err != nil {
			return err
		}
		want := strconv.Itoa(was + gpus/n)
		rctx, cancel := context.WithTimeout(bctx, time.Minute)
		_, err = chromedp.Run(rctx, chromedp.Poll[bool](`document.querySelector('#map-counts li[data-state="unknown"] b').textContent === "`+want+`"`,
			chromedp.WithPollingInterval(20*time.Millisecond), chromedp.WithPollingTimeout(time.Minute)))
		cancel()
		if err != nil {
			return fmt.Errorf("update %d: the page never showed %s unknown: %w", i, want, err)
		}
		fmt.Printf("update i=%d node=%s ms=%d\n", i, id, time.Since(t).Milliseconds())
	}
	if shot != "" {
		rctx, cancel := context.WithTimeout(bctx, time.Minute)
		png, err := chromedp.Run(rctx, chromedp.FullScreenshot(100))
		cancel()
		if err != nil {
			return err
		}
		if err := os.WriteFile(shot, png, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitHTTP waits until url answers at all.
func waitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %w", url, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
