package tests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/gputest"
	"github.com/better-compute/better-compute/bcd/session"
	cpinventory "github.com/better-compute/better-compute/controlplane/pkg/inventory"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestWatchGPUMapInChromium (issue 49) drives the fleet page's GPU map,
// node page and GPU page in a real headless Chromium against a real
// `serve` (embedded SQLite) with three simulated daemons and one real bcd
// built with nvmlmock (a stand-in systemctl first on its PATH, so the
// reboot remediation asks for is recorded, not done):
//
//   - a simulated daemon stops; once its node is unreachable (the state
//     node.unreachable is written with), its GPU cells read unknown within
//     5 s without a reload, and no count calls them ok;
//   - XID 79 on the real node's GPU 3 turns that one cell failed (red);
//     clicking it opens the GPU page, which shows the XID and the steps of
//     the case it opened;
//   - the real node's page lists its eight GPUs and its last command (the
//     case's reboot);
//   - no page logs a Content-Security-Policy violation.
//
// WATCH_MAP_SCREENSHOTS=DIR saves watch-map.png, watch-node.png and
// watch-gpu.png there (docs/ has them from this test).
func TestWatchGPUMapInChromium(t *testing.T) {
	t.Parallel()
	chromium := need(t, "chromium", "chromium")
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{
		gateway: "    heartbeatInterval: 1s\n    missedHeartbeats: 2\n",
		// The reboot the case asks for is recorded by the stand-in and
		// never happens; the case stays remediating for the test.
		top: "remediation:\n  interval: 500ms\n  verifySettle: 2s\n  verifyTimeout: 300s\n  actionTimeout: 300s\n",
	})
	tokenFile, _ := d.joinToken(4, time.Hour)
	token := strings.TrimSpace(readFile(t, tokenFile))

	// Three simulated daemons, each with a context of its own to stop it.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var sims []*sim.FakeDaemon
	var stops []context.CancelFunc
	for i := range 3 {
		fd, err := sim.NewFakeDaemon(sim.DaemonConfig{Name: fmt.Sprintf("map-sim-%d", i), Session: session.Config{StartJitter: -1}})
		if err != nil {
			t.Fatal(err)
		}
		if err := fd.Join(ctx, d.gatewayURL, token); err != nil {
			t.Fatal(err)
		}
		dctx, stop := context.WithCancel(ctx)
		go fd.Run(dctx)
		sims, stops = append(sims, fd), append(stops, stop)
	}

	// The real bcd on go-nvml's mock DGX A100.
	m := newMachine(t, "gpu-map")
	node := m.mustJoin(d.gatewayURL, tokenFile)
	stub := filepath.Join(t.TempDir(), "stub")
	asked := filepath.Join(t.TempDir(), "systemctl.log")
	writeScript(t, filepath.Join(stub, "systemctl"), "#!/bin/sh\necho \"$*\" >>"+shellQuote(asked)+"\n")
	gm := m.tm()
	gm.BCD = testenv.BinaryTags(t, "bcd", "nvmlmock")
	bin, args := gm.Argv("node", "--data-dir", m.dataDir, "--plugin-dir", t.TempDir(), "--bmc-file", filepath.Join(t.TempDir(), "none.yaml"))
	np := testenv.Start(t, []string{"PATH=" + stub + ":" + os.Getenv("PATH")}, bin, args...)
	np.WaitLine(`NVML is go-nvml's mock DGX A100`, 60*time.Second)
	np.WaitLine(sessionEstablished.String(), 60*time.Second)

	// Every node ready with its inventory.
	listNodes := func() []*store.Node {
		ns, err := d.st.NodeList(t.Context(), &store.NodeListParams{ListParams: store.ListParams{Limit: 100}})
		if err != nil {
			t.Fatal(err)
		}
		return ns
	}
	gpusOf := map[string]int{}
	eventually(t, 90*time.Second, func() bool {
		ns := listNodes()
		ready := 0
		for _, n := range ns {
			gpusOf[n.ID] = len(cpinventory.Decode(n.Inventory).GetGpus())
			if n.State == store.NodeReady && gpusOf[n.ID] > 0 {
				ready++
			}
		}
		return len(ns) == 4 && ready == 4
	}, func() string { return fmt.Sprintf("nodes not all ready with GPUs: %v", gpusOf) })
	if gpusOf[node] != 8 {
		t.Fatalf("the real node reports %d GPUs, want the mock's 8", gpusOf[node])
	}
	totalGPUs := 0
	var stoppedNode string
	for id, n := range gpusOf {
		totalGPUs += n
		if id != node && stoppedNode == "" {
			stoppedNode = id
		}
	}
	var stopIdx int
	for i, fd := range sims {
		if fd.NodeID() == stoppedNode {
			stopIdx = i
		}
	}
	viewer := strings.TrimSpace(d.cli(d.viaAPI("tokens", "create", "--role", "viewer", "--description", "gpu map test")...))

	bctx, csp := newWatchBrowser(t, ctx, chromium)
	steps := func(what string, timeout time.Duration, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		rctx, cancel := context.WithTimeout(bctx, timeout)
		defer cancel()
		if err := chromedp.Do(rctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eval := func(what, expr string) string {
		t.Helper()
		return browserRun(t, bctx, what, chromedp.Evaluate[string](expr))
	}
	count := func(state string) int {
		t.Helper()
		n, err := strconv.Atoi(eval("count "+state, `(document.querySelector('#map-counts li[data-state="`+state+`"] b') || {textContent: "-1"}).textContent`))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	steps("log in", 60*time.Second,
		chromedp.Navigate(d.api+"/watch"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), viewer),
		chromedp.Click(chromedp.CSS("#submit")),
		chromedp.WaitVisible(chromedp.CSS("#map")),
		chromedp.WaitVisible(chromedp.CSS("#live.on")))
	browserRun(t, bctx, "every GPU a cell", chromedp.Poll[bool](fmt.Sprintf(`document.querySelectorAll("#map a.cell").length === %d && `+
		`document.querySelectorAll('#map a.cell[data-state="ok"]').length === %d`, totalGPUs, totalGPUs), chromedp.WithPollingTimeout(20*time.Second)))

	// A simulated daemon stops: once its node is unreachable, its cells
	// read unknown within 5 s, and no count calls them ok.
	before := eval("page id", `String(performance.timeOrigin)`)
	stops[stopIdx]()
	var unreachableAt time.Time
	eventually(t, 30*time.Second, func() bool {
		n, err := d.st.NodeGet(t.Context(), stoppedNode)
		if err != nil {
			t.Fatal(err)
		}
		unreachableAt = time.Now()
		return n.State == store.NodeUnreachable
	}, func() string { return "the stopped node is not unreachable" })
	browserRun(t, bctx, "unknown cells", chromedp.Poll[bool](fmt.Sprintf(
		`(() => { const cs = document.querySelectorAll('#map .node[data-node="%s"] a.cell'); return cs.length === %d && Array.from(cs).every(c => c.dataset.state === "unknown"); })()`,
		stoppedNode, gpusOf[stoppedNode]), chromedp.WithPollingTimeout(10*time.Second), chromedp.WithPollingInterval(50*time.Millisecond)))
	took := time.Since(unreachableAt)
	t.Logf("the unreachable node's %d GPU cells read unknown %v after node.unreachable", gpusOf[stoppedNode], took.Round(10*time.Millisecond))
	if took > 5*time.Second {
		t.Fatalf("cells unknown %v after node.unreachable, want within 5 s", took)
	}
	if ok, unknown := count("ok"), count("unknown"); ok != totalGPUs-gpusOf[stoppedNode] || unknown != gpusOf[stoppedNode] {
		t.Fatalf("map counts ok %d unknown %d, want ok %d unknown %d: a silent node's GPUs counted ok", ok, unknown, totalGPUs-gpusOf[stoppedNode], gpusOf[stoppedNode])
	}
	if ok := eval("GPUs by state ok", `document.querySelector('#gpus li[data-health="ok"] b').textContent`); ok != strconv.Itoa(totalGPUs-gpusOf[stoppedNode]) {
		t.Fatalf("GPUs by state shows ok %s, want %d", ok, totalGPUs-gpusOf[stoppedNode])
	}
	if after := eval("page id", `String(performance.timeOrigin)`); after != before {
		t.Fatal("the page reloaded; it should have updated in place")
	}

	// XID 79 on the real node's GPU 3: that one cell turns failed.
	if err := os.WriteFile(filepath.Join(m.dataDir, "nvmlmock-xids"), []byte("3 79\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	np.Signal(syscall.SIGUSR1)
	np.WaitLine(`msg="Mock XID raised" .*gpu_index=3 xid=79`, 30*time.Second)
	uuid := gputest.UUID(3)
	browserRun(t, bctx, "one red cell", chromedp.Poll[bool](fmt.Sprintf(
		`(() => { const f = document.querySelectorAll('#map a.cell[data-state="failed"]'); return f.length === 1 && f[0].dataset.gpu === "%s"; })()`, uuid),
		chromedp.WithPollingTimeout(30*time.Second)))
	if color := eval("cell colour", fmt.Sprintf(`getComputedStyle(document.querySelector('#map a.cell[data-gpu="%s"]')).backgroundColor`, uuid)); color != "rgb(217, 48, 37)" {
		t.Fatalf("the failed cell's colour is %s, want red rgb(217, 48, 37)", color)
	}
	// The case reaches its reboot (the stand-in is asked).
	var c *store.Remediation
	eventually(t, 120*time.Second, func() bool {
		b, _ := os.ReadFile(asked)
		c = latestCase(t, d.st, node)
		return strings.Contains(string(b), "reboot") && c != nil && c.CommandID != ""
	}, func() string {
		if c == nil {
			return "no case for the node"
		}
		return "no reboot asked; case " + c.State + " action " + c.Action + ": " + c.Reason
	})

	// Clicking the red cell opens the GPU page: the XID and the case's
	// steps.
	// The map's live updates swap its cells in place: a cell found just
	// before a swap is gone when the click lands ("Could not find node
	// with given id"), as a person's click would miss it; click the new
	// one.
	for deadline := time.Now().Add(60 * time.Second); ; {
		rctx, cancel := context.WithTimeout(bctx, 20*time.Second)
		err := chromedp.Do(rctx, chromedp.Click(chromedp.CSS(fmt.Sprintf(`#map a.cell[data-gpu="%s"]`, uuid))),
			chromedp.WaitVisible(chromedp.CSS("#gpu-title")))
		cancel()
		if err == nil {
			break
		}
		if !strings.Contains(err.Error(), "Could not find node") || time.Now().After(deadline) {
			t.Fatalf("open the GPU page: %v", err)
		}
		t.Logf("the cell was swapped under the click (%v); clicking the new one", err)
	}
	if loc := browserRun(t, bctx, "location", chromedp.Location()); !strings.HasSuffix(loc, "/watch/gpus/"+uuid) {
		t.Fatalf("clicking the cell opened %s", loc)
	}
	browserRun(t, bctx, "the case's steps", chromedp.Poll[bool](fmt.Sprintf(
		`(() => { const s = Array.from(document.querySelectorAll('.case[data-case="%s"] ol.steps li')).map(l => l.dataset.step); return s.includes("case detected") && s.includes("case quarantined") && s.includes("case remediating"); })()`, c.ID),
		chromedp.WithPollingTimeout(20*time.Second)))
	gpuPage := eval("GPU page", `document.getElementById("fleet").innerText`)
	for _, want := range []string{"XID 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM", "failed", c.ID, "reboot"} {
		if !strings.Contains(gpuPage, want) {
			t.Fatalf("the GPU page does not show %q:\n%s", want, gpuPage)
		}
	}
	if st := eval("GPU state", `document.getElementById("gpu-state").textContent`); st != "failed" {
		t.Fatalf("the GPU page reads %q, want failed", st)
	}
	shot := func(name string) {
		if dir := os.Getenv("WATCH_MAP_SCREENSHOTS"); dir != "" {
			if err := os.WriteFile(filepath.Join(dir, name), browserRun(t, bctx, "screenshot", chromedp.CaptureScreenshot()), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	shot("watch-gpu.png")

	// The real node's page: its GPUs and its last command.
	steps("open the node page", 30*time.Second,
		chromedp.Navigate(d.api+"/watch/nodes/"+node),
		chromedp.WaitVisible(chromedp.CSS("#gpu-table")))
	if n := eval("GPU rows", `String(document.querySelectorAll("#gpu-table tbody tr[data-gpu]").length)`); n != "8" {
		t.Fatalf("the node page lists %s GPUs, want 8", n)
	}
	last := eval("last command", `(() => { const r = document.querySelector("#commands tbody tr[data-command]"); return r ? r.dataset.command + " " + r.querySelector("td.kind").textContent : ""; })()`)
	if want := c.CommandID + " reboot"; last != want {
		t.Fatalf("the node page's last command is %q, want %q", last, want)
	}
	// The stopped node's page: its GPUs read unknown there too.
	steps("open the stopped node's page", 30*time.Second,
		chromedp.Navigate(d.api+"/watch/nodes/"+stoppedNode),
		chromedp.WaitVisible(chromedp.CSS("#gpu-table")))
	if s := eval("stopped node GPU states", `Array.from(document.querySelectorAll("#gpu-table tbody tr[data-gpu]")).map(r => r.dataset.state).join(" ")`); s != strings.TrimSpace(strings.Repeat("unknown ", gpusOf[stoppedNode])) {
		t.Fatalf("the stopped node's GPUs read %q on its page, want unknown", s)
	}
	steps("open the real node's page", 30*time.Second,
		chromedp.Navigate(d.api+"/watch/nodes/"+node), chromedp.WaitVisible(chromedp.CSS("#gpu-table")))
	shot("watch-node.png")
	steps("back to the map", 30*time.Second, chromedp.Navigate(d.api+"/watch"), chromedp.WaitVisible(chromedp.CSS("#map")))
	shot("watch-map.png")
	if v := csp.violations(); len(v) > 0 {
		t.Fatalf("Content-Security-Policy violations in the console:\n%s", strings.Join(v, "\n"))
	}
}

// cspWatch collects what a browser's console says about the
// Content-Security-Policy.
type cspWatch struct {
	mu   sync.Mutex
	msgs []string
}

func (c *cspWatch) add(s string) {
	if strings.Contains(s, "Content Security Policy") || strings.Contains(s, "Content-Security-Policy") {
		c.mu.Lock()
		c.msgs = append(c.msgs, s)
		c.mu.Unlock()
	}
}

func (c *cspWatch) violations() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.msgs...)
}

// newWatchBrowser starts a headless Chromium whose console messages about
// the Content-Security-Policy are collected.
func newWatchBrowser(t *testing.T, ctx context.Context, chromium string) (context.Context, *cspWatch) {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.Flag("headless", "new"), chromedp.WindowSize(1280, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(cancelBrowser)
	csp := &cspWatch{}
	if err := csp.listen(bctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return bctx, csp
}

// listen collects the console messages of the tab of ctx (a tab opened
// with chromedp.NewContext has its own console).
func (c *cspWatch) listen(ctx context.Context) error {
	return chromedp.Listen(ctx, func(ev any) {
		switch e := ev.(type) {
		case *cdplog.EventEntryAdded:
			c.add(e.Entry.Text)
		case cdplog.EventEntryAdded:
			c.add(e.Entry.Text)
		case *runtime.EventConsoleAPICalled:
			for _, a := range e.Args {
				c.add(string(a.Value))
			}
		case *runtime.EventExceptionThrown:
			c.add(e.ExceptionDetails.Text)
		}
	})
}
