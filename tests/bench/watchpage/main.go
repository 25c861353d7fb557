// Command watchpage measures the fleet page, GET /watch, with 10,000
// simulated nodes: a real api (in this process, on loopback HTTP) on
// PostgreSQL (or SQLite), the nodes written straight into the store (each
// with the simulated DGX inventory a FakeDaemon reports: 8 GPUs), spread
// over 10 sites with 1% unreachable. It logs in over HTTP and prints the
// time to fetch the whole page and its live part (GET /watch/fragment, what
// the page's script re-fetches after each change) and the bytes of each;
// then it opens the page in a real headless Chromium (Debian's chromium,
// over chromedp), logs in with the form, and changes a listed node's state
// in the store (as the liveness reconciler does: the node and its
// node.unreachable event in one transaction), measuring from the commit
// until the page has swapped in the fragment showing it.
//
//	go run ./tests/bench/watchpage -nodes 10000 -requests 50 -updates 10
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
)

func main() {
	nodes := flag.Int("nodes", 10000, "simulated nodes written into the store")
	requests := flag.Int("requests", 50, "sequential requests of the page and of the fragment")
	updates := flag.Int("updates", 10, "state changes timed in Chromium (at most 100: nodes of the first page)")
	db := flag.String("db", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL server URL (a fresh schema is made and dropped); \"sqlite\" for the embedded store")
	chromium := flag.String("chromium", "chromium", "the Chromium binary")
	flag.Parse()
	if *nodes < 100 || *requests < 1 || *updates < 1 || *updates > 100 {
		fmt.Fprintln(os.Stderr, "bench: want -nodes >= 100, -requests >= 1, 1 <= -updates <= 100")
		os.Exit(2)
	}
	if err := run(*nodes, *requests, *updates, *db, *chromium); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func openStore(ctx context.Context, db string) (store.Store, func(), error) {
	if db == "sqlite" {
		dir, err := os.MkdirTemp("", "bench-watchpage-")
		if err != nil {
			return nil, nil, err
		}
		st, err := sqlite.Open(ctx, filepath.Join(dir, "state.db"))
		return st, func() {
			if st != nil {
				st.Close()
			}
			os.RemoveAll(dir)
		}, err
	}
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		return nil, nil, err
	}
	schema := "bench_" + strings.ToLower(rand.Text()[:10])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return nil, nil, err
	}
	url := db + cmp.Or(map[bool]string{true: "&"}[strings.Contains(db, "?")], "?") + "search_path=" + schema
	st, err := postgres.Open(ctx, url)
	return st, func() {
		if st != nil {
			st.Close()
		}
		conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		conn.Close(context.Background())
	}, err
}

// The totals as the page shows them.
var (
	gpusTotal  = regexp.MustCompile(`GPUs by health <span class="total">(\d+)<`)
	nodesTotal = regexp.MustCompile(`id="nodes-total">(\d+)<`)
)

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

// nodeID is the id of simulated node i; ids sort as i does, so the first
// page lists nodes 0 to 99.
func nodeID(i int) string { return fmt.Sprintf("node_bench%05d", i) }

// populate writes n nodes over 10 sites (a pool each): identity, the
// simulated inventory and state ready (unreachable for every hundredth),
// eight writers at once.
func populate(ctx context.Context, st store.Store, n int) error {
	var pools []string
	for s := range 10 {
		site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: fmt.Sprintf("site-%02d", s), Region: "default"})
		if err != nil {
			return err
		}
		pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: fmt.Sprintf("gpu-%02d", s), SiteID: site.ID})
		if err != nil {
			return err
		}
		pools = append(pools, pool.ID)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := populateOne(ctx, st, i, pools[i%len(pools)]); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func populateOne(ctx context.Context, st store.Store, i int, pool string) error {
	host := fmt.Sprintf("gpu-%05d", i)
	d, err := sim.NewFakeDaemon(sim.DaemonConfig{Name: host})
	if err != nil {
		return err
	}
	id := nodeID(i)
	if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: pool, Hostname: host, MachineID: "machine-" + host,
		BCDVersion: sim.Version, OS: "linux", Arch: "amd64"}); err != nil {
		return err
	}
	inv, err := protojson.Marshal(d.Inventory())
	if err != nil {
		return err
	}
	if err := st.NodeSetInventory(ctx, id, inv, d.Inventory().GetDigest()); err != nil {
		return err
	}
	state := store.NodeReady
	if i%100 == 99 {
		state = store.NodeUnreachable
	}
	return st.NodeSetState(ctx, id, state)
}

// fetch GETs path with c and returns the time to the last byte and the
// body's size.
func fetch(c *http.Client, u string) (time.Duration, int, error) {
	start := time.Now()
	res, err := c.Get(u)
	if err != nil {
		return 0, 0, err
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	took := time.Since(start)
	if err != nil || res.StatusCode != 200 {
		return 0, 0, fmt.Errorf("GET %s: %d %v", u, res.StatusCode, err)
	}
	return took, len(b), nil
}

func pct(l []time.Duration, p int) time.Duration {
	s := slices.Sorted(slices.Values(l))
	return s[min(len(s)-1, len(s)*p/100)].Round(time.Millisecond / 10)
}

func run(n, requests, updates int, db, chromium string) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := exec.LookPath(chromium); err != nil {
		return fmt.Errorf("chromium: %w (apt-get install chromium)", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	st, cleanup, err := openStore(ctx, db)
	if err != nil {
		return err
	}
	defer cleanup()
	if _, err := st.Migrate(ctx); err != nil {
		return err
	}
	start := time.Now()
	if err := populate(ctx, st, n); err != nil {
		return err
	}
	fmt.Printf("store %s: %d nodes written in %v; load average %s\n",
		st.Dialect(), n, time.Since(start).Round(time.Millisecond), loadavg())
	viewer, _, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleViewer, Description: "bench watch page"})
	if err != nil {
		return err
	}
	srv := api.New(api.Config{Listen: "127.0.0.1:0", Secret: strings.Repeat("b", 32)}, st, log)
	srvDone := make(chan error, 1)
	go func() { srvDone <- srv.Run(ctx) }()
	defer func() { cancel(); <-srvDone }()
	select {
	case <-srv.Ready():
	case err := <-srvDone:
		return err
	}
	base := "http://" + srv.Addr().String()

	// Over HTTP: log in, then the page and the fragment, one at a time.
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar}
	req, _ := http.NewRequest(http.MethodPost, base+"/watch/login", strings.NewReader(url.Values{"token": {viewer}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", base)
	res, err := hc.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(body), `id="fleet"`) {
		return fmt.Errorf("login: %d\n%s", res.StatusCode, body)
	}
	if m := gpusTotal.FindSubmatch(body); m != nil {
		fmt.Printf("the page counts %s nodes and %s GPUs\n", nodesTotal.FindSubmatch(body)[1], m[1])
	}
	for _, what := range []struct{ name, path string }{{"page", "/watch"}, {"fragment", "/watch/fragment"}} {
		// Cold: the GPU totals (a scan of every inventory) are recomputed,
		// as on the first request after they are 5 s old.
		var cold []time.Duration
		for range 3 {
			time.Sleep(5100 * time.Millisecond)
			took, _, err := fetch(hc, base+what.path)
			if err != nil {
				return err
			}
			cold = append(cold, took)
		}
		var warm []time.Duration
		size := 0
		for range requests {
			took, b, err := fetch(hc, base+what.path)
			if err != nil {
				return err
			}
			warm = append(warm, took)
			size = b
		}
		fmt.Printf("GET %s (%s): %d bytes; with the GPU totals cached: p50 %v, p99 %v (%d requests); "+
			"recomputing them (every 5 s): %v, %v, %v\n", what.path, what.name, size, pct(warm, 50), pct(warm, 99), requests,
			cold[0].Round(time.Millisecond/10), cold[1].Round(time.Millisecond/10), cold[2].Round(time.Millisecond/10))
	}

	// In Chromium: log in with the form, then time state changes.
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.Flag("headless", "new"), chromedp.WindowSize(1280, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	// The browser starts on bctx itself (a first action on a child context
	// with a deadline would tie the browser's life to that child).
	if err := chromedp.Listen(bctx, func(any) {}); err != nil {
		return fmt.Errorf("start chromium: %w", err)
	}
	do := func(what string, timeout time.Duration, actions ...chromedp.Action[chromedp.Void]) error {
		rctx, cancel := context.WithTimeout(bctx, timeout)
		defer cancel()
		if err := chromedp.Do(rctx, actions...); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	}
	if err := do("open the login form", 60*time.Second, chromedp.Navigate(base+"/watch"), chromedp.WaitVisible(chromedp.CSS("#token"))); err != nil {
		return err
	}
	loginStart := time.Now()
	if err := do("log in", 60*time.Second,
		chromedp.SendKeys(chromedp.CSS("#token"), viewer),
		chromedp.Click(chromedp.CSS("#submit")),
		chromedp.WaitVisible(chromedp.CSS("#fleet")),
		chromedp.WaitVisible(chromedp.CSS("#live.on"))); err != nil {
		return err
	}
	fmt.Printf("Chromium: login submitted -> page shown and its stream open: %v; load average %s\n",
		time.Since(loginStart).Round(time.Millisecond), loadavg())
	eval := func(expr string) (string, error) {
		rctx, cancel := context.WithTimeout(bctx, 30*time.Second)
		defer cancel()
		return chromedp.Run(rctx, chromedp.Evaluate[string](expr))
	}
	var lat []time.Duration
	for k := range updates {
		id := nodeID(k)
		// Let the previous change's refresh settle: an update lands in a
		// quiet page.
		time.Sleep(1500 * time.Millisecond)
		if err := st.NodeSetState(ctx, id, store.NodeUnreachable); err != nil {
			return err
		}
		committed := time.Now()
		rctx, cancel := context.WithTimeout(bctx, 30*time.Second)
		_, err := chromedp.Run(rctx, chromedp.Poll[bool](
			`(() => { const r = document.querySelector('#nodes tr[data-node="`+id+`"] td.state'); return r !== null && r.textContent === "unreachable"; })()`,
			chromedp.WithPollingInterval(5*time.Millisecond)))
		cancel()
		if err != nil {
			return fmt.Errorf("node %s never shown unreachable: %w", id, err)
		}
		// The page stamps document.body.dataset.updated (ms since the epoch)
		// when it swaps a fragment in: the same clock as committed.
		v, err := eval(`document.body.dataset.updated || ""`)
		if err != nil {
			return err
		}
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("the page's update stamp %q: %w", v, err)
		}
		lat = append(lat, time.UnixMilli(ms).Sub(committed))
	}
	fmt.Printf("Chromium: commit of a node's state change -> the page showing it (%d changes): p50 %v, max %v; load average %s\n",
		updates, pct(lat, 50), slices.Max(lat).Round(time.Millisecond), loadavg())
	var each []string
	for _, l := range lat {
		each = append(each, l.Round(time.Millisecond).String())
	}
	fmt.Printf("  each: %s\n", strings.Join(each, " "))
	return nil
}
