package tests

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/tests/testenv"
)

// watchConfig makes liveness quick for the fleet page test: heartbeats
// every second, a node unreachable after two missed ones (checked every
// second), so a stopped daemon's node turns unreachable within about 3 s.
const watchConfig = `host:
  gateway:
    heartbeatInterval: 1s
    missedHeartbeats: 2
`

// xssHostname is the hostname of a real FakeDaemon the page must show as
// text.
const xssHostname = "<script>alert(1)</script>"

// TestWatchPageInChromium drives GET /watch in a real headless Chromium
// (Debian's chromium, over chromedp) against `dev --sim 3`: a wrong token
// shows an error and not the page; a viewer token opens it; the three
// simulated nodes are listed, and a daemon joined with a hostname of markup
// shows it as text (no dialog opens); the page cookie is HttpOnly and
// SameSite=Strict and the API refuses it; a daemon stopped (SIGUSR1 to
// dev) shows unreachable within 5 s with no reload; logout ends the
// session. WATCH_SCREENSHOT=FILE saves a screenshot there (docs/watch.png
// is made so).
func TestWatchPageInChromium(t *testing.T) {
	t.Parallel()
	chromium := need(t, "chromium", "chromium")
	bin := testenv.Binary(t, "better-compute")
	dataDir := t.TempDir()
	cfg := testenv.WriteFile(t, "better-compute.yaml", watchConfig)
	p := testenv.Start(t, testenv.BaseEnv(), bin, "--config", cfg, "dev", "--sim", "3", "--port", "0", "--gateway-port", "0", "--data-dir", dataDir)
	apiURL := p.WaitLine(`API\s+(http://\S+?)/api\s`, 60*time.Second)[1]
	gatewayURL := p.WaitLine(`gateway\s+(https://\S+)`, 30*time.Second)[1]
	p.WaitLine(`3 simulated daemons connected`, 90*time.Second)
	cli := func(args ...string) string {
		t.Helper()
		code, out, errOut := testenv.Run(t, testenv.BaseEnv(), "", bin, append([]string{"--config", cfg}, append(args, "--server", apiURL, "--data-dir", dataDir)...)...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
		return strings.TrimSpace(out)
	}
	viewer := cli("tokens", "create", "--role", "viewer", "--description", "watch page test")

	// A real daemon whose hostname is markup.
	joinFile := filepath.Join(t.TempDir(), "join-token")
	cli("join-tokens", "create", "--pool", "default", "--max-uses", "1", "--out", joinFile)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	xss, err := sim.NewFakeDaemon(sim.DaemonConfig{Name: xssHostname, Session: session.Config{StartJitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := xss.Join(ctx, gatewayURL, strings.TrimSpace(readFile(t, joinFile))); err != nil {
		t.Fatal(err)
	}
	go xss.Run(ctx)

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.Flag("headless", "new"), chromedp.WindowSize(1280, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	t.Cleanup(cancelAlloc)
	bctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(cancelBrowser)
	dialogs := make(chan string, 4)
	if err := chromedp.Listen(bctx, func(ev any) {
		msg, ok := "", false
		switch d := ev.(type) {
		case *page.EventJavascriptDialogOpening:
			msg, ok = d.Message, true
		case page.EventJavascriptDialogOpening:
			msg, ok = d.Message, true
		}
		if ok {
			select {
			case dialogs <- msg:
			default:
			}
			go chromedp.Call(bctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{})
		}
	}); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
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

	// A wrong token: an error on the form, not the page.
	steps("wrong token", 60*time.Second,
		chromedp.Navigate(apiURL+"/watch"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), "bcat_"+strings.Repeat("a", 52)),
		chromedp.Click(chromedp.CSS("#submit")),
		chromedp.WaitVisible(chromedp.CSS("#error")))
	errText := eval("error text", `document.getElementById("error").textContent`)
	fleetShown := eval("page shown", `String(document.getElementById("fleet") !== null)`)
	if !strings.Contains(errText, "not accepted") || fleetShown != "false" {
		t.Fatalf("wrong token: error %q, page shown %s", errText, fleetShown)
	}

	// The viewer token opens the page: the three simulated nodes, and the
	// markup hostname as text.
	steps("log in", 30*time.Second,
		chromedp.SendKeys(chromedp.CSS("#token"), viewer),
		chromedp.Click(chromedp.CSS("#submit")),
		chromedp.WaitVisible(chromedp.CSS("#fleet")),
		chromedp.WaitVisible(chromedp.CSS("#live.on")))
	if loc := browserRun(t, bctx, "location", chromedp.Location()); strings.Contains(loc, viewer) || strings.Contains(loc, "token") {
		t.Fatalf("the token in the URL: %s", loc)
	}
	browserRun(t, bctx, "four ready nodes listed", chromedp.Poll[bool](`document.querySelectorAll("#nodes tbody tr[data-node]").length === 4 && `+
		`Array.from(document.querySelectorAll("#nodes td.state")).every(td => td.textContent === "ready")`, chromedp.WithPollingTimeout(20*time.Second)))
	hosts := eval("hosts", `Array.from(document.querySelectorAll("#nodes tbody tr[data-node]")).map(r => r.querySelector("td.host").textContent + "=" + r.querySelector("td.state").textContent).join("\n")`)
	for _, h := range []string{"sim-00000=ready", "sim-00001=ready", "sim-00002=ready", xssHostname + "=ready"} {
		if !strings.Contains(hosts, h) {
			t.Fatalf("node %q not on the page:\n%s", h, hosts)
		}
	}
	if srcs := eval("scripts", `Array.from(document.querySelectorAll("script")).map(s => s.getAttribute("src")).join(" ")`); srcs != "/watch/static/watch.js /watch/static/actions.js" {
		t.Fatalf("script elements on the page: %q, want the page's own two (watch.js, actions.js): node markup became elements", srcs)
	}

	// The cookie: HttpOnly, SameSite=Strict, scoped to /watch; the API
	// refuses it.
	var cookies []*network.Cookie
	{
		cctx, cancel := context.WithTimeout(bctx, 5*time.Second)
		res, err := chromedp.Call(cctx, network.GetCookies, network.GetCookiesParams{})
		cancel()
		if err != nil {
			t.Fatalf("cookies: %v", err)
		}
		cookies = res.Cookies
	}
	if len(cookies) != 1 || !cookies[0].HTTPOnly || cookies[0].SameSite != network.CookieSameSiteStrict || cookies[0].Path != "/watch" {
		t.Fatalf("cookies = %+v", cookies)
	}
	if jsCookie := eval("document.cookie", `document.cookie`); jsCookie != "" {
		t.Fatalf("the page cookie is readable from script: %q", jsCookie)
	}
	pageCookie := &http.Cookie{Name: cookies[0].Name, Value: cookies[0].Value}
	req, _ := http.NewRequest(http.MethodPost, apiURL+"/api/nodes/list", strings.NewReader("{}"))
	req.Header.Set("X-Better-Compute", "1")
	req.Header.Set("Content-Type", "application/json")
	req.AddCookie(pageCookie)
	if code, body := do(t, req); code != http.StatusUnauthorized || !strings.Contains(body, "UNAUTHENTICATED") {
		t.Fatalf("nodes.list with the page cookie: %d %s, want 401 UNAUTHENTICATED", code, body)
	}

	// A daemon stops: its node turns unreachable on the page, live.
	before := eval("page id", `String(performance.timeOrigin)`)
	p.Signal(syscall.SIGUSR1)
	m := p.WaitLine(`Stopped simulated daemon (\S+) \(node (\S+)\)`, 10*time.Second)
	stopped := time.Now()
	browserRun(t, bctx, "unreachable", chromedp.Poll[bool](
		`(() => { const r = document.querySelector('#nodes tr[data-node="`+m[2]+`"] td.state'); return r !== null && r.textContent === "unreachable"; })()`,
		chromedp.WithPollingTimeout(8*time.Second), chromedp.WithPollingInterval(50*time.Millisecond)))
	took := time.Since(stopped)
	t.Logf("node %s (%s) unreachable on the page %v after its daemon stopped", m[1], m[2], took.Round(10*time.Millisecond))
	if took > 5*time.Second {
		t.Fatalf("node unreachable on the page after %v, want within 5 s", took)
	}
	if after := eval("page id", `String(performance.timeOrigin)`); after != before {
		t.Fatal("the page reloaded; it should have updated in place")
	}
	if shot := os.Getenv("WATCH_SCREENSHOT"); shot != "" {
		png := browserRun(t, bctx, "screenshot", chromedp.FullScreenshot(100))
		if err := os.WriteFile(shot, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case msg := <-dialogs:
		t.Fatalf("a dialog opened: %q (node markup ran as script)", msg)
	default:
	}

	// Logout ends the session: the login form again, and the old cookie
	// opens nothing.
	steps("log out", 10*time.Second,
		chromedp.Click(chromedp.CSS("#logout-button")),
		chromedp.WaitVisible(chromedp.CSS("#token")))
	req, _ = http.NewRequest(http.MethodGet, apiURL+"/watch/fragment", nil)
	req.AddCookie(pageCookie)
	if code, body := do(t, req); code != http.StatusUnauthorized {
		t.Fatalf("fragment with the logged-out cookie: %d %s, want 401", code, body)
	}
}

// browserRun runs one chromedp action with a 30 s bound and returns its
// value.
func browserRun[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(rctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

func do(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
