package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/watch"
	"github.com/better-compute/better-compute/controlplane/store"
)

// pageSession logs the fleet page in with token and returns its cookie and
// form token.
func (f *fixture) pageSession(t *testing.T, token string) (cookie *http.Cookie, csrf string) {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, watch.Path+"/login", strings.NewReader(url.Values{"token": {token}}.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Origin", "http://example.com")
	r.RemoteAddr = peer
	w := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(w, r)
	cs := w.Result().Cookies()
	if w.Code != http.StatusSeeOther || len(cs) != 1 {
		t.Fatalf("page login: %d %s", w.Code, w.Body.String())
	}
	r = httptest.NewRequest(http.MethodGet, watch.Path, nil)
	r.AddCookie(cs[0])
	r.RemoteAddr = peer
	w = httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(w, r)
	m := regexp.MustCompile(`name="csrf" value="([^"]+)"`).FindStringSubmatch(w.Body.String())
	if m == nil {
		t.Fatalf("no form token on the page: %d", w.Code)
	}
	return cs[0], m[1]
}

func (f *fixture) pageAct(t *testing.T, cookie *http.Cookie, csrf, action, body string) (int, string) {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, watch.Path+"/actions/"+action, strings.NewReader(body))
	r.AddCookie(cookie)
	r.Header.Set("Origin", "http://example.com")
	r.Header.Set(watch.HeaderCSRF, csrf)
	r.RemoteAddr = peer
	w := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(w, r)
	return w.Code, w.Body.String()
}

// TestPageActionsAreAPICalls: the fleet page's cordon is nodes.cordon
// called as the page session's token: done, and audited under that token;
// a viewer's is refused by the API's role check and audited as denied; a
// token revoked since the login acts no more.
func TestPageActionsAreAPICalls(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	site, err := f.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := f.st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_a", PoolID: pool.ID, Hostname: "a", MachineID: "ma"}); err != nil {
		t.Fatal(err)
	}
	op, opTok, err := iam.Create(ctx, f.st, iam.CreateParams{Role: store.RoleOperator})
	if err != nil {
		t.Fatal(err)
	}
	cookie, csrf := f.pageSession(t, op)
	if code, body := f.pageAct(t, cookie, csrf, "cordon", `{"target":"node_a"}`); code != http.StatusOK {
		t.Fatalf("the page's cordon: %d %s", code, body)
	}
	if n, _ := f.st.NodeGet(ctx, "node_a"); !n.Cordoned {
		t.Fatal("the node is not cordoned")
	}
	rows, err := f.st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "nodes.cordon"})
	if err != nil || len(rows) != 1 || rows[0].Actor != "token:"+opTok.ID || rows[0].Outcome != "ok" || rows[0].Resource != "node_a" {
		t.Fatalf("audit rows %+v %v, want one ok under token:%s", rows, err, opTok.ID)
	}

	viewer := f.token(store.RoleViewer, 0)
	vc, vcsrf := f.pageSession(t, viewer)
	if code, body := f.pageAct(t, vc, vcsrf, "uncordon", `{"target":"node_a"}`); code != http.StatusForbidden || !strings.Contains(body, "role viewer may not call nodes.uncordon") {
		t.Fatalf("a viewer's uncordon: %d %s", code, body)
	}
	if rows, _ := f.st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "nodes.uncordon"}); len(rows) != 1 || rows[0].Outcome != "denied" {
		t.Fatalf("audit of the viewer's uncordon: %+v", rows)
	}

	// A drain in a pool whose one slot is free: admitted by the API's
	// budget, as from the CLI.
	if code, body := f.pageAct(t, cookie, csrf, "drain", `{"target":"node_a"}`); code != http.StatusOK {
		t.Fatalf("the page's drain: %d %s", code, body)
	}
	if b, _ := f.st.PoolBudget(ctx, pool.ID); b.OutOfService != 1 {
		t.Fatalf("budget after the drain: %+v", b)
	}

	// BMC power from the page is commands.create of kind power.cycle for
	// the node (as `bmc cycle --node`), audited under the token.
	if code, body := f.pageAct(t, cookie, csrf, "power-cycle", `{"target":"node_a"}`); code != http.StatusOK {
		t.Fatalf("the page's power cycle: %d %s", code, body)
	}
	cmds, err := f.st.CommandList(ctx, &store.CommandListParams{NodeID: "node_a"})
	if err != nil || len(cmds) != 1 || cmds[0].Kind != "power.cycle" || cmds[0].CreatedBy != "token:"+opTok.ID {
		t.Fatalf("commands after the page's power cycle: %+v %v", cmds, err)
	}

	if err := f.st.APITokenRevoke(ctx, opTok.ID); err != nil {
		t.Fatal(err)
	}
	if code, body := f.pageAct(t, cookie, csrf, "uncordon", `{"target":"node_a"}`); code != http.StatusUnauthorized {
		t.Fatalf("an action after the token's revocation: %d %s", code, body)
	}
}
