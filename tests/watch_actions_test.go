package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/tests/testenv"
)

// Acting from the fleet page (issue 50), in a real headless Chromium
// against a real `serve` (embedded SQLite). Every action is the API's own
// method called as the logged-in person's token, previewed against the
// pool's disruption budget before it is confirmed.

// watchPage is a headless Chromium on the fleet page.
type watchPage struct {
	t   *testing.T
	ctx context.Context
	csp *cspWatch
	api string
}

func newPage(t *testing.T, ctx context.Context, api string) *watchPage {
	t.Helper()
	chromium := need(t, "chromium", "chromium")
	bctx, csp := newWatchBrowser(t, ctx, chromium)
	return &watchPage{t: t, ctx: bctx, csp: csp, api: api}
}

// do runs actions within timeout.
func (p *watchPage) do(what string, timeout time.Duration, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	rctx, cancel := context.WithTimeout(p.ctx, timeout)
	defer cancel()
	if err := chromedp.Do(rctx, actions...); err != nil {
		p.t.Fatalf("%s: %v", what, err)
	}
}

// eval evaluates a JavaScript expression that yields a string.
func (p *watchPage) eval(what, expr string) string {
	p.t.Helper()
	return browserRun(p.t, p.ctx, what, chromedp.Evaluate[string](expr))
}

// poll waits until a JavaScript expression is true.
func (p *watchPage) poll(what, expr string, timeout time.Duration) {
	p.t.Helper()
	rctx, cancel := context.WithTimeout(p.ctx, timeout+10*time.Second)
	defer cancel()
	if _, err := chromedp.Run(rctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(timeout))); err != nil {
		sctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
		defer cancel()
		state, serr := chromedp.Run(sctx, chromedp.Evaluate[string](`document.location.href + " " + JSON.stringify(document.body.dataset) + "\n" + document.body.innerText.slice(0, 2000)`))
		p.t.Fatalf("%s: %v; the page reads (%v):\n%s", what, err, serr, state)
	}
}

func (p *watchPage) login(token string) {
	p.t.Helper()
	p.do("log in", 60*time.Second,
		chromedp.Navigate(p.api+"/watch"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS("#submit")),
		chromedp.WaitVisible(chromedp.CSS("#live.on")))
}

func (p *watchPage) logout() {
	p.t.Helper()
	p.do("log out", 30*time.Second, chromedp.Click(chromedp.CSS("#logout-button")), chromedp.WaitVisible(chromedp.CSS("#token")))
}

// openNode opens a node's page and waits for its live stream.
func (p *watchPage) openNode(nodeID string) {
	p.t.Helper()
	p.do("open the node page", 60*time.Second, chromedp.Navigate(p.api+"/watch/nodes/"+nodeID),
		chromedp.WaitVisible(chromedp.CSS("#node-title")), chromedp.WaitVisible(chromedp.CSS("#live.on")))
}

// confirmation clicks an action's button and returns what its
// confirmation dialog shows: the budget's slots used before and after, and
// why it cannot be done ("" when it can).
func (p *watchPage) confirmation(button string) (before, after, why string) {
	p.t.Helper()
	p.do("ask for "+button, 30*time.Second, chromedp.Click(chromedp.CSS(button)), chromedp.WaitVisible(chromedp.CSS("dialog#confirm[open] #confirm-effect")))
	before = p.eval("budget before", `(document.getElementById("confirm-before") || {textContent: ""}).textContent`)
	after = p.eval("budget after", `(document.getElementById("confirm-after") || {textContent: ""}).textContent`)
	why = p.eval("why not", `(document.getElementById("confirm-why") || {textContent: ""}).textContent`)
	return before, after, why
}

// fetch runs a request from the page's own script context (same origin,
// the page's cookie) and returns "STATUS MESSAGE".
func (p *watchPage) fetch(what, path, headers, body string) string {
	p.t.Helper()
	return browserRun(p.t, p.ctx, what, chromedp.Evaluate[string](fmt.Sprintf(`fetch(%q, {method: "POST", credentials: "same-origin", headers: %s, body: %q})
		.then(r => r.json().then(j => r.status + " " + (j.message || "")))`, path, headers, body), chromedp.EvalAwaitPromise))
}

// shot saves a screenshot of the page as dir/name when
// WATCH_ACTIONS_SCREENSHOTS names a directory (docs/ has them from these
// tests).
func (p *watchPage) shot(name string) {
	p.t.Helper()
	if dir := os.Getenv("WATCH_ACTIONS_SCREENSHOTS"); dir != "" {
		if err := os.WriteFile(filepath.Join(dir, name), browserRun(p.t, p.ctx, "screenshot", chromedp.CaptureScreenshot()), 0o644); err != nil {
			p.t.Fatal(err)
		}
	}
}

// csrfHeader is the header object the page's own script sends.
const csrfHeader = `{"Content-Type": "application/json", "X-Watch-CSRF": document.querySelector('#logout input[name="csrf"]').value}`

// tokenID is the id of API token secret.
func tokenID(t *testing.T, st store.Store, secret string) string {
	t.Helper()
	tok, err := st.APITokenBySecret(context.Background(), iam.Hash(secret))
	if err != nil {
		t.Fatal(err)
	}
	return tok.ID
}

// joinSims joins n simulated daemons with names prefix-0... and runs them
// until the test ends; it returns their node ids once each is ready.
func joinSims(t *testing.T, d *deployment, prefix string, n int) []string {
	t.Helper()
	tokenFile, _ := d.joinToken(n, time.Hour)
	token := strings.TrimSpace(readFile(t, tokenFile))
	var ds []*sim.FakeDaemon
	for i := range n {
		fd, err := sim.NewFakeDaemon(sim.DaemonConfig{Name: fmt.Sprintf("%s-%d", prefix, i), Session: session.Config{StartJitter: -1}})
		if err != nil {
			t.Fatal(err)
		}
		if err := fd.Join(context.Background(), d.gatewayURL, token); err != nil {
			t.Fatal(err)
		}
		ds = append(ds, fd)
	}
	runDaemons(t, ds)
	var ids []string
	for _, fd := range ds {
		ids = append(ids, fd.NodeID())
	}
	eventually(t, 90*time.Second, func() bool {
		for _, id := range ids {
			if n, err := d.st.NodeGet(context.Background(), id); err != nil || n.State != store.NodeReady {
				return false
			}
		}
		return true
	}, func() string { return "the simulated daemons are not all ready" })
	return ids
}

// TestPageActionCordonShowsBudget: an operator cordons a node from its
// page: the confirmation shows the pool's disruption budget before and
// after (a cordon takes no slot), and the audit row names the operator's
// token. A drain then shows its slot taken (0 → 1 of 1), and a second drain
// in the full pool says why it cannot be done, its confirm disabled. A
// viewer sees no action button and is told why; the viewer's forged
// request, made from the page with the form token, is refused by the API's
// role check and audited; a request without the form token header is
// refused before it reaches the API. No CSP violation is logged.
func TestPageActionCordonShowsBudget(t *testing.T) {
	t.Parallel()
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{})
	nodes := joinSims(t, d, "act", 3) // 10% of 3 nodes: a budget of one slot
	operator := strings.TrimSpace(d.cli(d.viaAPI("tokens", "create", "--role", "operator", "--description", "page actions test")...))
	viewer := strings.TrimSpace(d.cli(d.viaAPI("tokens", "create", "--role", "viewer", "--description", "page actions test")...))
	ctx := t.Context()
	p := newPage(t, ctx, d.api)

	p.login(operator)
	p.openNode(nodes[0])
	before, after, why := p.confirmation("#act-cordon")
	if before != "0 of 1" || after != "0 of 1" || why != "" {
		t.Fatalf("cordon's confirmation shows budget %q → %q (why not: %q), want 0 of 1 → 0 of 1: a cordon takes no slot", before, after, why)
	}
	if effect := p.eval("effect", `document.getElementById("confirm-effect").textContent`); !strings.Contains(effect, "No new commands") {
		t.Fatalf("cordon's confirmation says %q", effect)
	}
	p.do("confirm the cordon", 30*time.Second, chromedp.Click(chromedp.CSS("#confirm-ok")), chromedp.WaitVisible(chromedp.CSS("#confirm-result.done")))
	if n, err := d.st.NodeGet(ctx, nodes[0]); err != nil || !n.Cordoned {
		t.Fatalf("node %s after the page's cordon: %+v %v", nodes[0], n, err)
	}
	opID := tokenID(t, d.st, operator)
	rows, err := d.st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "nodes.cordon", Resource: nodes[0]})
	if err != nil || len(rows) != 1 || rows[0].Actor != "token:"+opID || rows[0].Outcome != "ok" {
		t.Fatalf("audit rows of the cordon: %+v %v; want one, ok, under token:%s", rows, err, opID)
	}
	// The page updates itself: the node reads cordoned, and offers
	// uncordon instead.
	p.do("close the dialog", 10*time.Second, chromedp.Click(chromedp.CSS("#confirm-cancel")))
	p.poll("the node reads cordoned", `document.querySelector("#node-title .state").textContent.includes("cordoned") && !!document.getElementById("act-uncordon")`, 20*time.Second)

	// A drain takes the pool's one slot...
	before, after, why = p.confirmation("#act-drain")
	if before != "0 of 1" || after != "1 of 1" || why != "" {
		t.Fatalf("drain's confirmation shows budget %q → %q (why not: %q), want 0 of 1 → 1 of 1", before, after, why)
	}
	p.shot("watch-confirm.png")
	p.do("confirm the drain", 30*time.Second, chromedp.Click(chromedp.CSS("#confirm-ok")), chromedp.WaitVisible(chromedp.CSS("#confirm-result.done")))
	if b, err := d.st.PoolBudget(ctx, mustNode(t, d.st, nodes[0]).PoolID); err != nil || b.OutOfService != 1 {
		t.Fatalf("pool budget after the drain: %+v %v", b, err)
	}
	// ...so a second node's drain says why it cannot start.
	p.openNode(nodes[1])
	before, after, why = p.confirmation("#act-drain")
	if before != "1 of 1" || !strings.Contains(why, "disruption budget") {
		t.Fatalf("a drain in the full pool shows %q → %q, why %q; want 1 of 1 and the budget named", before, after, why)
	}
	if disabled := p.eval("confirm disabled", `String(document.getElementById("confirm-ok").disabled)`); disabled != "true" {
		t.Fatal("the confirm button of a drain the budget refuses is enabled")
	}
	p.do("cancel", 10*time.Second, chromedp.Click(chromedp.CSS("#confirm-cancel")))

	// Without the form token header the page's own origin is not enough.
	if got := p.fetch("post without the header", "/watch/actions/uncordon", `{"Content-Type": "application/json"}`, `{"target":"`+nodes[0]+`"}`); !strings.HasPrefix(got, "403 ") {
		t.Fatalf("an action without %s: %s, want 403", "X-Watch-CSRF", got)
	}
	if n := mustNode(t, d.st, nodes[0]); !n.Cordoned {
		t.Fatal("the refused uncordon uncordoned the node")
	}

	// A viewer: no button, the reason, and a forged request refused.
	p.logout()
	p.login(viewer)
	p.openNode(nodes[1])
	if n := p.eval("buttons", `String(document.querySelectorAll("button.act").length)`); n != "0" {
		t.Fatalf("a viewer's node page shows %s action buttons", n)
	}
	if why := p.eval("why", `document.getElementById("no-actions").textContent`); !strings.Contains(why, "viewer") {
		t.Fatalf("a viewer's page says %q, want why it cannot act", why)
	}
	got := p.fetch("forged cordon", "/watch/actions/cordon", csrfHeader, `{"target":"`+nodes[1]+`"}`)
	if !strings.HasPrefix(got, "403 ") || !strings.Contains(got, "role viewer may not call nodes.cordon") {
		t.Fatalf("a viewer's forged cordon: %q, want 403 from the API's role check", got)
	}
	if n := mustNode(t, d.st, nodes[1]); n.Cordoned {
		t.Fatal("the viewer's forged request cordoned the node")
	}
	vID := tokenID(t, d.st, viewer)
	rows, err = d.st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "nodes.cordon", Actor: "token:" + vID})
	if err != nil || len(rows) != 1 || rows[0].Outcome != "denied" {
		t.Fatalf("audit rows of the viewer's cordon: %+v %v; want one, denied", rows, err)
	}
	// The page cookie still opens no API method.
	if v := p.csp.violations(); len(v) > 0 {
		t.Fatalf("Content-Security-Policy violations in the console:\n%s", strings.Join(v, "\n"))
	}
}

func mustNode(t *testing.T, st store.Store, id string) *store.Node {
	t.Helper()
	n, err := st.NodeGet(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPageActionRolloutPauseStartsNoWave: a rollout of four simulated
// daemons (canary 1, waves of 1, soak 6 s) paused from the fleet page
// while its canary soaks starts no next wave, well past the soak; resumed
// from the page, its next wave starts. The confirmation names what waits.
func TestPageActionRolloutPauseStartsNoWave(t *testing.T) {
	t.Parallel()
	bc := testenv.Binary(t, "better-compute")
	dir := t.TempDir()
	key, dist := filepath.Join(dir, "keys", "release.key"), filepath.Join(dir, "dist")
	out := runOK(t, nil, bc, "release", "keygen", "--out", key)
	pin := regexp.MustCompile(`pin:\s+(sha256/\S+)`).FindStringSubmatch(out)[1]
	// The daemons are simulated: they play the upgrade, and never run the
	// release's binary.
	rdir := filepath.Join(dist, relB)
	writeScript(t, filepath.Join(rdir, buildDir("bcd"), "bcd"), "#!/bin/sh\nexit 0\n")
	runOK(t, nil, bc, "release", "manifest", "--dist", rdir, "--version", relB, "--expires", "24h")
	runOK(t, nil, bc, "release", "sign", "--key", key, "--in", filepath.Join(rdir, "manifest.json"))
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{
		top: fmt.Sprintf("downloads:\n  dir: %s\n  releasePins: [%s]\nrollouts:\n  interval: 200ms\n", dist, pin),
	})
	tokenFile, _ := d.joinToken(4, time.Hour)
	fl, err := sim.NewFleet(sim.FleetConfig{GatewayURL: d.gatewayURL, Token: strings.TrimSpace(readFile(t, tokenFile)), N: 4, NamePrefix: "ro",
		NoInventory: true, Session: session.Config{StartJitter: -1, BackoffBase: 50 * time.Millisecond, BackoffMax: 500 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := fl.Join(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, fd := range fl.Daemons() {
		fd.SetVersion(relA)
	}
	runDaemons(t, fl.Daemons())
	ctx := t.Context()
	eventually(t, 90*time.Second, func() bool {
		for _, fd := range fl.Daemons() {
			if n, err := d.st.NodeGet(ctx, fd.NodeID()); err != nil || n.State != store.NodeReady || n.BCDVersion != relA {
				return false
			}
		}
		return true
	}, func() string { return "the simulated daemons are not all ready on " + relA })
	pool := mustNode(t, d.st, fl.Daemons()[0].NodeID()).PoolID
	d.cli(d.viaAPI("pools", "set-budget", pool, "--budget", "2")...)
	operator := strings.TrimSpace(d.cli(d.viaAPI("tokens", "create", "--role", "operator", "--description", "page rollout test")...))
	p := newPage(t, ctx, d.api)
	p.login(operator)
	// The canary soaks 6 s, and its health gate extends that once while
	// it has too little evidence: the next wave would start about 12 s
	// after the canary's.
	const soak = 6 * time.Second
	id := regexp.MustCompile(`roll_[a-z0-9]+`).FindString(d.cli(d.viaAPI("rollouts", "create", "--version", relB, "--pool", pool, "--canary", "1",
		"--wave", "1", "--max-unavailable", "1", "--soak", soak.String(), "--bake", "0s")...))
	if id == "" {
		t.Fatal("rollouts create printed no rollout id")
	}
	// Pause while the canary is in its wave.
	eventually(t, 60*time.Second, func() bool {
		ro, err := d.st.RolloutGet(ctx, id)
		return err == nil && ro.CurrentWave == 1
	}, func() string { return "the rollout did not start its canary" })
	canaryAt := time.Now()
	pauseBtn := fmt.Sprintf(`tr[data-rollout="%s"] button[data-action="rollout-pause"]`, id)
	p.poll("the pause button", fmt.Sprintf(`!!document.querySelector(%q)`, pauseBtn), 30*time.Second)
	for deadline := time.Now().Add(60 * time.Second); ; {
		rctx, cancel := context.WithTimeout(p.ctx, 20*time.Second)
		err := chromedp.Do(rctx, chromedp.Click(chromedp.CSS(pauseBtn)), chromedp.WaitVisible(chromedp.CSS("dialog#confirm[open] #confirm-effect")))
		cancel()
		if err == nil {
			break
		}
		// The rollouts table is swapped in place by live updates.
		if !strings.Contains(err.Error(), "Could not find node") || time.Now().After(deadline) {
			t.Fatalf("ask to pause: %v", err)
		}
	}
	if w := p.eval("waits", `document.getElementById("confirm-waits").textContent`); !strings.Contains(w, "wait until the rollout is resumed") {
		t.Fatalf("the pause's confirmation says of what waits: %q", w)
	}
	p.do("confirm the pause", 30*time.Second, chromedp.Click(chromedp.CSS("#confirm-ok")), chromedp.WaitVisible(chromedp.CSS("#confirm-result.done")))
	ro, err := d.st.RolloutGet(ctx, id)
	if err != nil || ro.State != store.RolloutPaused {
		t.Fatalf("rollout after the page's pause: %+v %v", ro, err)
	}
	pausedWave := ro.CurrentWave
	pausedAt := time.Now()
	opID := tokenID(t, d.st, operator)
	if rows, err := d.st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "rollouts.pause", Actor: "token:" + opID}); err != nil || len(rows) != 1 || rows[0].Outcome != "ok" {
		t.Fatalf("audit rows of the pause: %+v %v", rows, err)
	}
	if pausedWave != 1 {
		t.Fatalf("paused in wave %d, want the canary's (the test was too slow to pause it)", pausedWave)
	}
	// Paused: until well past when the next wave would have started (three
	// soaks after the canary's, at least 5 s and 25 reconciler rounds after
	// the pause), no node of a later wave is sent an upgrade. The absence
	// of a thing takes time to see.
	for time.Since(canaryAt) < 3*soak || time.Since(pausedAt) < 5*time.Second {
		nodes, err := d.st.RolloutNodes(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			if n.Wave > pausedWave || (n.Wave == 0 && n.UpgradeCommandID != "") {
				t.Fatalf("paused at wave %d, node %s started in wave %d (%s)", pausedWave, n.NodeID, n.Wave, n.State)
			}
		}
		if ro, _ := d.st.RolloutGet(ctx, id); ro.CurrentWave != pausedWave || ro.State != store.RolloutPaused {
			t.Fatalf("paused rollout moved to wave %d, state %s", ro.CurrentWave, ro.State)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Resumed from the page, its next wave starts.
	p.do("close", 10*time.Second, chromedp.Click(chromedp.CSS("#confirm-cancel")))
	resumeBtn := fmt.Sprintf(`tr[data-rollout="%s"] button[data-action="rollout-resume"]`, id)
	p.poll("the resume button", fmt.Sprintf(`!!document.querySelector(%q)`, resumeBtn), 30*time.Second)
	p.do("resume", 30*time.Second, chromedp.Click(chromedp.CSS(resumeBtn)), chromedp.WaitVisible(chromedp.CSS("dialog#confirm[open] #confirm-effect")),
		chromedp.Click(chromedp.CSS("#confirm-ok")), chromedp.WaitVisible(chromedp.CSS("#confirm-result.done")))
	eventually(t, 60*time.Second, func() bool {
		ro, err := d.st.RolloutGet(ctx, id)
		return err == nil && ro.CurrentWave > pausedWave
	}, func() string { return "the resumed rollout started no next wave" })
	if v := p.csp.violations(); len(v) > 0 {
		t.Fatalf("Content-Security-Policy violations in the console:\n%s", strings.Join(v, "\n"))
	}
}

// TestBrowserShellRunsHostname: an operator opens a shell on a real bcd
// node from its page: the xterm.js terminal, under the page's strict CSP
// (style-src 'self' with a nonce per response), runs `hostname` through
// the API's tunnel and shows its output; closing the tab closes the
// tunnel (its row closed, tunnels.close audited under the operator's
// token). No CSP violation is logged. A viewer's node page offers no
// shell, and its shell page opens none.
func TestBrowserShellRunsHostname(t *testing.T) {
	t.Parallel()
	d := newDeployment(t, backendSQLite)
	file, _ := d.joinToken(1, time.Hour)
	m := newMachine(t, "browser-shell")
	nodeID := m.mustJoin(d.gatewayURL, file)
	bcd := m.node()
	bcd.WaitLine(sessionEstablished.String(), 60*time.Second)
	// The node runs in a namespace of its own: `hostname` there prints the
	// name bcd reported, not this machine's.
	host := mustNode(t, d.st, nodeID).Hostname
	operator := strings.TrimSpace(d.cli(d.viaAPI("tokens", "create", "--role", "operator", "--description", "browser shell test")...))
	ctx := t.Context()
	p := newPage(t, ctx, d.api)
	p.login(operator)
	p.openNode(nodeID)
	if target := p.eval("shell link", `document.getElementById("act-shell").getAttribute("href")`); target != "/watch/nodes/"+nodeID+"/shell" {
		t.Fatalf("the shell link goes to %q", target)
	}

	// The shell in a tab of its own.
	tab, closeTab := chromedp.NewContext(p.ctx)
	defer closeTab()
	tp := &watchPage{t: t, ctx: tab, csp: p.csp, api: d.api}
	if err := p.csp.listen(tab); err != nil {
		t.Fatal(err)
	}
	tp.do("open the shell", 60*time.Second, chromedp.Navigate(d.api+"/watch/nodes/"+nodeID+"/shell"), chromedp.WaitVisible(chromedp.CSS("#terminal .xterm")))
	tp.poll("the shell opens", `document.body.dataset.shell === "open"`, 30*time.Second)
	if n := tp.eval("styles", `String(Array.from(document.querySelectorAll("style")).filter(s => s.nonce !== "").length + "/" + document.querySelectorAll("style").length)`); strings.HasPrefix(n, "0/") {
		t.Fatalf("xterm.js's style elements with the nonce: %s", n)
	}
	// The terminal's rows as text: what a person reads on the screen.
	screen := `Array.from(document.querySelectorAll("#terminal .xterm-rows > div")).map(r => r.textContent).join("\n")`
	// Typed as a keyboard would: the text inserted into the terminal's
	// input (as typing or an input method does), then Enter. (chromedp's
	// SendKeys sends each printable key both as a key and as its text,
	// which xterm.js takes twice.)
	tp.do("type hostname", 20*time.Second, chromedp.Click(chromedp.CSS("#terminal .xterm")),
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := cdp.Call(ctx, tg, input.InsertText, input.InsertTextParams{Text: "echo marker-$((6*7)); hostname"})
			return err
		}),
		chromedp.KeyEvent(kb.Enter))
	tp.poll("the output", fmt.Sprintf(`(() => { const s = %s; return s.includes("marker-42") && s.split("\n").some(l => l.trim() === %q); })()`, screen, host), 30*time.Second)
	t.Logf("the terminal shows:\n%s", strings.TrimRight(tp.eval("screen", screen), "\n "))
	tp.shot("watch-shell.png")

	tun, err := d.st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "tunnels.open", Actor: "token:" + tokenID(t, d.st, operator), Outcome: "ok"})
	if err != nil || len(tun) != 1 {
		t.Fatalf("tunnels.open audit rows: %+v %v", tun, err)
	}
	tunnelID := tun[0].Resource

	// Closing the tab closes the tunnel.
	closeTab()
	eventually(t, 30*time.Second, func() bool {
		rows, err := d.st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "tunnels.close", Resource: tunnelID})
		return err == nil && len(rows) == 1
	}, func() string { return "no tunnels.close for " + tunnelID + " after the tab closed" })
	tr, err := d.st.TunnelGet(ctx, tunnelID)
	if err != nil || tr.ClosedAt == nil {
		t.Fatalf("tunnel %s after the tab closed: %+v %v", tunnelID, tr, err)
	}
	t.Logf("tunnel %s closed: %q", tunnelID, tr.Reason)

	// The page's shell is recorded as nodes shell's is: its audit row
	// names the recording, which plays back what was typed and printed.
	var opened map[string]any
	if err := json.Unmarshal(tun[0].Details, &opened); err != nil {
		t.Fatalf("tunnels.open details %s: %v", tun[0].Details, err)
	}
	recID, _ := opened["recordingId"].(string)
	eventually(t, 30*time.Second, func() bool {
		rec, err := d.st.RecordingGet(ctx, recID)
		return err == nil && rec.State == store.RecordingComplete
	}, func() string {
		return "the page's shell has no complete recording (tunnels.open details " + string(tun[0].Details) + ")"
	})
	played := d.cli(d.viaAPI("recordings", "play", recID, "--speed", "0")...)
	if i, j := strings.Index(played, "echo marker-$((6*7)); hostname"), strings.Index(played, "marker-42"); i < 0 || j < i {
		t.Fatalf("recordings play %s of the page's shell, want the command and then marker-42:\n%q", recID, played)
	}

	// A viewer: no shell.
	viewer := strings.TrimSpace(d.cli(d.viaAPI("tokens", "create", "--role", "viewer", "--description", "browser shell test")...))
	p.logout()
	p.login(viewer)
	p.openNode(nodeID)
	if n := p.eval("shell link", `String(document.querySelectorAll("#act-shell").length)`); n != "0" {
		t.Fatal("a viewer's node page offers a shell")
	}
	p.do("a viewer's shell page", 30*time.Second, chromedp.Navigate(d.api+"/watch/nodes/"+nodeID+"/shell"), chromedp.WaitVisible(chromedp.CSS("#no-actions")))
	if got := p.fetch("a viewer's shell ticket", "/watch/actions/shell", csrfHeader, `{"target":"`+nodeID+`"}`); !strings.HasPrefix(got, "403 ") {
		t.Fatalf("a viewer's shell ticket: %q, want 403", got)
	}
	if v := p.csp.violations(); len(v) > 0 {
		t.Fatalf("Content-Security-Policy violations in the console:\n%s", strings.Join(v, "\n"))
	}
}
