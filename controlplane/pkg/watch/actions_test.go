package watch_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/watch"
	"github.com/better-compute/better-compute/controlplane/store"
)

// fakeActions stands for the API (api.Server's page actions): operators
// may call every method, viewers none; each call is recorded.
type fakeActions struct {
	st store.Store

	mu    sync.Mutex
	calls []string // "token method body"
}

func (a *fakeActions) Principal(ctx context.Context, hash [32]byte, addr netip.Addr) (*iam.Principal, error) {
	t, err := a.st.APITokenBySecret(ctx, hash[:])
	if err != nil {
		return nil, iam.ErrUnknownToken
	}
	return &iam.Principal{TokenID: t.ID, Role: t.Role}, nil
}

func (a *fakeActions) Allows(role, method string) bool { return iam.Allows(role, store.RoleOperator) }

func (a *fakeActions) Call(_ context.Context, p *iam.Principal, _ netip.Addr, method, body string) ([]byte, error) {
	if !a.Allows(p.Role, method) {
		return nil, &watch.ActionError{Status: http.StatusForbidden, Code: "PERMISSION_DENIED", Message: "role " + p.Role + " may not call " + method}
	}
	a.mu.Lock()
	a.calls = append(a.calls, p.TokenID+" "+method+" "+body)
	a.mu.Unlock()
	return []byte(`{"ticket":"tun_x.secret"}`), nil
}

func (a *fakeActions) ServeTunnel(w http.ResponseWriter, _ *http.Request, _ *iam.Principal, _ [32]byte, ticket string) {
	http.Error(w, "tunnel "+ticket, http.StatusTeapot)
}

func (a *fakeActions) called() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.calls...)
}

// actionFixture is a page with fake actions and a logged-in operator.
func actionFixture(t *testing.T) (*fixture, *fakeActions, *http.Client, string) {
	t.Helper()
	fa := &fakeActions{}
	f := newFixture(t, watch.Config{Actions: fa})
	fa.st = f.st
	op, tok, err := iam.Create(context.Background(), f.st, iam.CreateParams{Role: store.RoleOperator})
	if err != nil {
		t.Fatal(err)
	}
	c := f.client(t)
	if resp := f.login(t, c, op); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("operator login: %d", resp.StatusCode)
	}
	return f, fa, c, tok.ID
}

// csrfOf reads the session's form token from a page.
func csrfOf(t *testing.T, body string) string {
	t.Helper()
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(body)
	if m == nil {
		t.Fatal("no form token on the page")
	}
	return m[1]
}

func (f *fixture) act(t *testing.T, c *http.Client, name, body, csrf, origin string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/watch/actions/"+name, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if csrf != "" {
		req.Header.Set(watch.HeaderCSRF, csrf)
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ Message string }
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out.Message
}

// TestActionNeedsTheFormTokenAndTheOrigin: an action is called as the
// session's token only with the session's form token in X-Watch-CSRF and
// from the page's origin; a form post (no header), a wrong token or
// another origin is refused before the API is called.
func TestActionNeedsTheFormTokenAndTheOrigin(t *testing.T) {
	f, fa, c, tokID := actionFixture(t)
	_, page := f.get(t, c, "/watch/nodes/node_x")
	csrf := csrfOf(t, page)
	for _, tc := range []struct{ name, csrf, origin string }{
		{"no header", "", f.srv.URL},
		{"wrong token", "x" + csrf, f.srv.URL},
		{"another origin", csrf, "https://evil.example"},
	} {
		if code, msg := f.act(t, c, "cordon", `{"target":"node_x"}`, tc.csrf, tc.origin); code != http.StatusForbidden || !strings.Contains(msg, "did not come from the page") {
			t.Errorf("%s: %d %q, want 403", tc.name, code, msg)
		}
	}
	if calls := fa.called(); len(calls) != 0 {
		t.Fatalf("refused requests reached the API: %v", calls)
	}
	if code, msg := f.act(t, c, "cordon", `{"target":"node_x"}`, csrf, f.srv.URL); code != http.StatusOK {
		t.Fatalf("the page's own cordon: %d %q", code, msg)
	}
	if calls := fa.called(); len(calls) != 1 || calls[0] != tokID+` nodes.cordon {"id":"node_x"}` {
		t.Fatalf("API calls %q, want nodes.cordon of node_x as token %s", calls, tokID)
	}
	if code, _ := f.act(t, c, "nodes.delete", `{"target":"node_x"}`, csrf, f.srv.URL); code != http.StatusNotFound {
		t.Errorf("an action the page does not have: %d, want 404", code)
	}
}

// TestActionButtonsByRole: an operator's node page offers the actions; a
// viewer's none, saying why; the viewer's forged action is the API's to
// refuse, and is.
func TestActionButtonsByRole(t *testing.T) {
	f, fa, c, _ := actionFixture(t)
	_, page := f.get(t, c, "/watch/nodes/node_x")
	for _, want := range []string{`data-action="cordon"`, `data-action="drain"`, `data-action="reboot"`, `href="/watch/nodes/node_x/shell"`} {
		if !strings.Contains(page, want) {
			t.Errorf("the operator's node page lacks %s", want)
		}
	}
	vc := f.client(t)
	f.login(t, vc, f.viewer)
	_, page = f.get(t, vc, "/watch/nodes/node_x")
	if strings.Contains(page, `class="act`) || strings.Contains(page, "/shell") || !strings.Contains(page, "role, viewer, may only look") {
		t.Fatalf("a viewer's node page offers actions or does not say why not:\n%s", page)
	}
	if code, msg := f.act(t, vc, "cordon", `{"target":"node_x"}`, csrfOf(t, page), f.srv.URL); code != http.StatusForbidden || !strings.Contains(msg, "role viewer") {
		t.Fatalf("a viewer's forged cordon: %d %q", code, msg)
	}
	if calls := fa.called(); len(calls) != 0 {
		t.Fatalf("the viewer's cordon was carried out: %v", calls)
	}
}

// TestPreviewShowsTheBudget: the preview of a drain counts the slot it
// takes, of a cordon none; once the pool's one slot is held, a drain is
// refused, saying so, and the preview of a viewer says the role.
func TestPreviewShowsTheBudget(t *testing.T) {
	f, _, c, _ := actionFixture(t)
	ctx := context.Background()
	preview := func(c *http.Client, action, target string) map[string]any {
		t.Helper()
		resp, body := f.get(t, c, "/watch/actions/"+action+"/preview?target="+target)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("preview %s: %d %s", action, resp.StatusCode, body)
		}
		var p map[string]any
		if err := json.Unmarshal([]byte(body), &p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	slots := func(p map[string]any) (float64, float64) {
		b := p["budget"].(map[string]any)
		return b["before"].(float64), b["after"].(float64)
	}
	if b, a := slots(preview(c, "cordon", "node_x")); b != 0 || a != 0 {
		t.Errorf("cordon preview: %v → %v, want 0 → 0", b, a)
	}
	p := preview(c, "drain", "node_x")
	if b, a := slots(p); b != 0 || a != 1 || p["allowed"] != true {
		t.Errorf("drain preview: %v → %v (%v), want 0 → 1, allowed", b, a, p["allowed"])
	}
	// Another node of the pool takes the one slot.
	n, _ := f.st.NodeGet(ctx, "node_x")
	if _, err := f.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_y", PoolID: n.PoolID, Hostname: "y", MachineID: "my"}); err != nil {
		t.Fatal(err)
	}
	if a, err := f.st.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: "node_y", Reason: store.DisruptionDraining, Owner: "operator"}); err != nil || !a.Admitted {
		t.Fatalf("admit node_y: %+v %v", a, err)
	}
	p = preview(c, "drain", "node_x")
	if b, _ := slots(p); b != 1 || p["allowed"] != false || !strings.Contains(p["why"].(string), "disruption budget") {
		t.Errorf("drain preview in a full pool: %v", p)
	}
	if _, body := f.get(t, c, "/watch/actions/drain/preview?target=node_x%3Cb%3E"); !strings.Contains(body, "INVALID_ARGUMENT") {
		t.Errorf("a bad target: %s", body)
	}
	if p := preview(c, "breaker-reset", "gpu"); p["allowed"] != false || !strings.Contains(p["why"].(string), "closed") {
		t.Errorf("the reset of a closed breaker: %v", p)
	}
	vc := f.client(t)
	f.login(t, vc, f.viewer)
	if p := preview(vc, "cordon", "node_x"); p["allowed"] != false || !strings.Contains(p["why"].(string), "viewer") {
		t.Errorf("a viewer's cordon preview: %v", p)
	}
}

// TestShellPageAndTerminalFiles: the shell page carries the response's
// nonce on the terminal's stylesheet link and loads the vendored xterm.js;
// the library's files and licence are served, nothing else under static.
func TestShellPageAndTerminalFiles(t *testing.T) {
	f, _, c, _ := actionFixture(t)
	resp, page := f.get(t, c, "/watch/nodes/node_x/shell")
	m := regexp.MustCompile(`'nonce-([^']+)'`).FindStringSubmatch(resp.Header.Get("Content-Security-Policy"))
	if m == nil || !strings.Contains(page, `id="xterm-css" nonce="`+m[1]+`"`) || !strings.Contains(page, `src="/watch/static/xterm/xterm.js"`) ||
		!strings.Contains(page, `id="terminal" data-node="node_x"`) {
		t.Fatalf("shell page (CSP %q):\n%s", resp.Header.Get("Content-Security-Policy"), page)
	}
	for path, want := range map[string]string{"/watch/static/xterm/xterm.js": "text/javascript", "/watch/static/xterm/xterm.css": "text/css",
		"/watch/static/xterm/LICENSE": "text/plain", "/watch/static/shell.js": "text/javascript", "/watch/static/actions.js": "text/javascript"} {
		if resp, _ := f.get(t, c, path); resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), want) {
			t.Errorf("%s: %d %s", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
	for _, path := range []string{"/watch/static/node.html", "/watch/static/xterm/xterm.js.map", "/watch/static/xterm/"} {
		if resp, _ := f.get(t, c, path); resp.StatusCode != 404 {
			t.Errorf("%s: %d, want 404", path, resp.StatusCode)
		}
	}
	// The tunnel is the API's (here the fake's), reached with the cookie.
	req, _ := http.NewRequest(http.MethodGet, f.srv.URL+"/watch/tunnels/tun_x.secret", nil)
	req.Header.Set("Origin", f.srv.URL)
	if resp, err := c.Do(req); err != nil || resp.StatusCode != http.StatusTeapot {
		t.Fatalf("tunnel: %v %v", resp, err)
	}
}

// TestCaseActions: an open case of a node offers its return and its
// pause; each previews the node's hold and goes to its API method.
func TestCaseActions(t *testing.T) {
	f, fa, c, tokID := actionFixture(t)
	ctx := context.Background()
	rc, err := f.st.RemediationCreate(ctx, &store.Remediation{NodeID: "node_x", State: store.RemediationQuarantined, Finding: "operator",
		Kind: "operator.order", Action: "reboot", Reason: "test"}, "test")
	if err != nil {
		t.Fatal(err)
	}
	if a, err := f.st.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: "node_x", Reason: store.DisruptionQuarantined, Owner: store.RemediationOwner(rc.ID)}); err != nil || !a.Admitted {
		t.Fatalf("admit: %+v %v", a, err)
	}
	_, page := f.get(t, c, "/watch/nodes/node_x")
	for _, want := range []string{`data-action="return" data-target="` + rc.ID + `"`, `data-action="case-pause" data-target="` + rc.ID + `"`} {
		if !strings.Contains(page, want) {
			t.Errorf("the node page lacks %s", want)
		}
	}
	resp, body := f.get(t, c, "/watch/actions/return/preview?target="+rc.ID)
	var p struct {
		Allowed bool
		Budget  struct{ Before, After int }
	}
	if err := json.Unmarshal([]byte(body), &p); err != nil || resp.StatusCode != 200 || !p.Allowed || p.Budget.Before != 1 || p.Budget.After != 0 {
		t.Fatalf("return preview: %d %s", resp.StatusCode, body)
	}
	if code, msg := f.act(t, c, "case-pause", `{"target":"`+rc.ID+`"}`, csrfOf(t, page), f.srv.URL); code != 200 {
		t.Fatalf("case-pause: %d %s", code, msg)
	}
	if calls := fa.called(); len(calls) != 1 || calls[0] != tokID+` remediation.pause {"id":"`+rc.ID+`"}` {
		t.Fatalf("API calls %q", calls)
	}
}

// TestPowerActions: BMC power from the node page is `bmc on|off|cycle
// --node` (commands.create, kind power.*); power off and cycle are offered
// only for a node already out of service, since a power command is not
// admitted through the disruption budget; power on always.
func TestPowerActions(t *testing.T) {
	f, fa, c, tokID := actionFixture(t)
	ctx := context.Background()
	preview := func(action string) (allowed bool, why string, before, after int) {
		t.Helper()
		resp, body := f.get(t, c, "/watch/actions/"+action+"/preview?target=node_x")
		var p struct {
			Allowed bool
			Why     string
			Budget  struct{ Before, After int }
		}
		if err := json.Unmarshal([]byte(body), &p); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s preview: %d %s", action, resp.StatusCode, body)
		}
		return p.Allowed, p.Why, p.Budget.Before, p.Budget.After
	}
	if ok, why, _, _ := preview("power-cycle"); ok || !strings.Contains(why, "Drain node") || !strings.Contains(why, "disruption budget") {
		t.Errorf("power-cycle of a node in service: allowed %v (%s), want refused until drained", ok, why)
	}
	if ok, _, b, a := preview("power-on"); !ok || b != a {
		t.Errorf("power-on preview: allowed %v, budget %d → %d", ok, b, a)
	}
	if a, err := f.st.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: "node_x", Reason: store.DisruptionDraining, Owner: store.OperatorOwner}); err != nil || !a.Admitted {
		t.Fatalf("drain node_x: %+v %v", a, err)
	}
	if ok, why, b, a := preview("power-off"); !ok || b != 1 || a != 1 {
		t.Errorf("power-off of a drained node: allowed %v (%s), budget %d → %d, want allowed, 1 → 1", ok, why, b, a)
	}
	_, page := f.get(t, c, "/watch/nodes/node_x")
	if !strings.Contains(page, `data-action="power-cycle" data-target="node_x"`) {
		t.Fatal("the node page offers no power cycle to an operator")
	}
	if code, msg := f.act(t, c, "power-cycle", `{"target":"node_x"}`, csrfOf(t, page), f.srv.URL); code != 200 {
		t.Fatalf("power-cycle: %d %s", code, msg)
	}
	want := tokID + ` commands.create {"kind":"power.cycle","nodeIds":["node_x"],"power":{}}`
	if calls := fa.called(); len(calls) != 1 || calls[0] != want {
		t.Fatalf("API calls %q, want %q", calls, want)
	}
}
