package watch_test

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/clocktest"
	"github.com/better-compute/better-compute/controlplane/pkg/feed"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/watch"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// fixture is a page on a real SQLite store with a site, a pool, a node
// whose hostname is markup, and a viewer token.
type fixture struct {
	st     store.Store
	srv    *httptest.Server
	viewer string
	clock  *clocktest.Clock // the handler's clock; safe to advance while its goroutines read it
}

func newFixture(t *testing.T, cfg watch.Config) *fixture {
	t.Helper()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "eu-<b>1</b>", Region: "eu"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "gpu", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_x", PoolID: pool.ID, Hostname: "<script>alert(1)</script>", MachineID: "m"}); err != nil {
		t.Fatal(err)
	}
	viewer, _, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleViewer})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{st: st, viewer: viewer, clock: clocktest.New(time.Now())}
	cfg.Auth = iam.NewAuthenticator(iam.Config{}, st)
	cfg.CallerAddr = func(context.Context) netip.Addr { return netip.MustParseAddr("127.0.0.1") }
	cfg.Now = f.clock.Now
	cfg.PollInterval = cmp.Or(cfg.PollInterval, 20*time.Millisecond)
	// The process's event feed, as the api runs it: woken by every outbox
	// write of the store, never by its poll (an hour).
	cfg.Feed = feed.New(feed.Config{Poll: time.Hour}, st, nil)
	written, unsubscribe := st.OutboxWritten()
	feedCtx, stopFeed := context.WithCancel(ctx)
	feedDone := make(chan struct{})
	go func() { defer close(feedDone); _ = cfg.Feed.Run(feedCtx, written) }()
	t.Cleanup(func() { stopFeed(); <-feedDone; unsubscribe() })
	h, err := watch.New(cfg, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	h.Register(mux)
	mux.HandleFunc("POST /api/{group}/{method}", func(w http.ResponseWriter, r *http.Request) {
		// Stands for the API: bearer tokens only.
		if !strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
			http.Error(w, "unauthenticated", http.StatusUnauthorized)
		}
	})
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

// client returns a browser-like client: a cookie jar, no redirects
// followed, and the page's origin on every post.
func (f *fixture) client(t *testing.T) *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func (f *fixture) post(t *testing.T, c *http.Client, path string, form url.Values, origin string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func (f *fixture) get(t *testing.T, c *http.Client, path string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(f.srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func (f *fixture) login(t *testing.T, c *http.Client, token string) *http.Response {
	return f.post(t, c, "/watch/login", url.Values{"token": {token}}, f.srv.URL)
}

func TestLoginPageLogout(t *testing.T) {
	f := newFixture(t, watch.Config{})
	c := f.client(t)
	resp, body := f.get(t, c, "/watch")
	if resp.StatusCode != 200 || !strings.Contains(body, `action="/watch/login"`) || strings.Contains(body, "node_x") {
		t.Fatalf("GET /watch without a session: %d\n%s", resp.StatusCode, body)
	}
	if got := resp.Header.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("X-Content-Type-Options = %q, want nosniff", got)
	}
	// A nonce of its own on every response, in a policy that is otherwise
	// ContentSecurityPolicy's.
	csp := resp.Header.Get("Content-Security-Policy")
	m := regexp.MustCompile(`'nonce-([A-Za-z0-9_-]{22})'`).FindStringSubmatch(csp)
	if m == nil || csp != watch.ContentSecurityPolicy(m[1]) || !strings.Contains(csp, "script-src 'self';") {
		t.Errorf("Content-Security-Policy = %q, want ContentSecurityPolicy with a 128-bit nonce", csp)
	}
	if resp2, _ := f.get(t, c, "/watch"); m != nil && strings.Contains(resp2.Header.Get("Content-Security-Policy"), m[1]) {
		t.Errorf("two responses share the nonce %s", m[1])
	}

	resp = f.login(t, c, f.viewer)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/watch" {
		t.Fatalf("login: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	cookies := resp.Cookies()
	if len(cookies) != 1 || cookies[0].Name != watch.CookieName || !cookies[0].HttpOnly || cookies[0].SameSite != http.SameSiteStrictMode ||
		cookies[0].Path != "/watch" || cookies[0].Secure || len(cookies[0].Value) < 40 || strings.Contains(cookies[0].Value, f.viewer) {
		t.Fatalf("login cookie = %+v", cookies)
	}
	if strings.Contains(resp.Header.Get("Location"), "token") {
		t.Fatalf("the token in a URL: %s", resp.Header.Get("Location"))
	}

	resp, body = f.get(t, c, "/watch")
	if resp.StatusCode != 200 || !strings.Contains(body, "node_x") {
		t.Fatalf("page after login: %d\n%s", resp.StatusCode, body)
	}
	// Markup from a node and from a site name is text.
	if strings.Contains(body, "<script>alert(1)</script>") || !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") ||
		strings.Contains(body, "<b>1</b>") {
		t.Fatalf("node data not escaped:\n%s", body)
	}
	if strings.Contains(body, "<script>") || strings.Contains(body, "style=") {
		t.Fatalf("inline script or style on the page:\n%s", body)
	}
	resp, frag := f.get(t, c, "/watch/fragment?state=joined")
	if resp.StatusCode != 200 || !strings.HasPrefix(frag, `<main id="fleet"`) || !strings.Contains(frag, "node_x") {
		t.Fatalf("fragment: %d\n%s", resp.StatusCode, frag)
	}
	if resp, _ := f.get(t, c, "/watch/fragment?state=ready"); resp.StatusCode != 200 {
		t.Fatalf("fragment ready: %d", resp.StatusCode)
	}
	if resp, _ := f.get(t, c, "/watch/fragment?state=<x>"); resp.StatusCode != 400 {
		t.Fatalf("fragment with a bad state: %d, want 400", resp.StatusCode)
	}

	// The page cookie is not a credential of the API.
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+"/api/nodes/list", strings.NewReader("{}"))
	if resp, err := c.Do(req); err != nil || resp.StatusCode != 401 {
		t.Fatalf("API with the page cookie: %v %v", resp, err)
	}

	// Logout needs the form token.
	if resp := f.post(t, c, "/watch/logout", url.Values{"csrf": {"wrong"}}, f.srv.URL); resp.StatusCode != 403 {
		t.Fatalf("logout with a wrong form token: %d, want 403", resp.StatusCode)
	}
	csrf := between(body, `name="csrf" value="`, `"`)
	if resp := f.post(t, c, "/watch/logout", url.Values{"csrf": {csrf}}, f.srv.URL); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("logout: %d", resp.StatusCode)
	}
	// The old cookie no longer opens the page, even when replayed.
	old := &http.Client{}
	req, _ = http.NewRequest(http.MethodGet, f.srv.URL+"/watch/fragment", nil)
	req.AddCookie(cookies[0])
	if resp, err := old.Do(req); err != nil || resp.StatusCode != 401 {
		t.Fatalf("fragment after logout: %v %v", resp, err)
	}
}

func between(s, a, b string) string {
	_, rest, _ := strings.Cut(s, a)
	v, _, _ := strings.Cut(rest, b)
	return v
}

func TestLoginRefusals(t *testing.T) {
	f := newFixture(t, watch.Config{})
	c := f.client(t)
	for _, tc := range []struct {
		name, token, origin string
		code                int
	}{
		{"wrong token", iam.NewToken(), f.srv.URL, 401},
		{"not a token", "hunter2", f.srv.URL, 401},
		{"empty", "", f.srv.URL, 401},
		{"other origin", f.viewer, "https://evil.example", 403},
		{"no origin", f.viewer, "", 403},
		{"null origin", f.viewer, "null", 403},
	} {
		resp := f.post(t, c, "/watch/login", url.Values{"token": {tc.token}}, tc.origin)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != tc.code || len(resp.Cookies()) != 0 || !strings.Contains(string(b), `class="error"`) || strings.Contains(string(b), "node_x") {
			t.Errorf("%s: %d cookies %v\n%s", tc.name, resp.StatusCode, resp.Cookies(), b)
		}
	}
}

func TestSessionLifetimes(t *testing.T) {
	f := newFixture(t, watch.Config{IdleTimeout: time.Minute, MaxLifetime: 3 * time.Minute, TokenRecheck: time.Hour})
	c := f.client(t)
	f.login(t, c, f.viewer)
	for range 3 { // used every 50 s: idle never passes, the absolute life does
		f.clock.Advance(50 * time.Second)
		if resp, _ := f.get(t, c, "/watch/fragment"); resp.StatusCode != 200 {
			t.Fatalf("fragment at %v: %d", f.clock.Now(), resp.StatusCode)
		}
	}
	f.clock.Advance(50 * time.Second)
	if resp, _ := f.get(t, c, "/watch/fragment"); resp.StatusCode != 401 {
		t.Fatalf("fragment past the absolute lifetime: %d, want 401", resp.StatusCode)
	}
	f.login(t, c, f.viewer)
	f.clock.Advance(61 * time.Second)
	if resp, _ := f.get(t, c, "/watch/fragment"); resp.StatusCode != 401 {
		t.Fatalf("fragment past the idle timeout: %d, want 401", resp.StatusCode)
	}
}

func TestRevokedTokenEndsSession(t *testing.T) {
	f := newFixture(t, watch.Config{TokenRecheck: time.Second})
	c := f.client(t)
	f.login(t, c, f.viewer)
	toks, err := f.st.APITokenList(context.Background(), &store.ListParams{})
	if err != nil || len(toks) != 1 {
		t.Fatal(toks, err)
	}
	if err := f.st.APITokenRevoke(context.Background(), toks[0].ID); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(2 * time.Second)
	if resp, _ := f.get(t, c, "/watch/fragment"); resp.StatusCode != 401 {
		t.Fatalf("fragment after the token's revocation: %d, want 401", resp.StatusCode)
	}
}

// The stream: refused without a session; a change event after a node
// changes state, carried by the event feed (the counts poll is an hour
// apart) with the id of the event the change wrote.
func TestEventStream(t *testing.T) {
	f := newFixture(t, watch.Config{PollInterval: time.Hour})
	if resp, _ := f.get(t, &http.Client{}, "/watch/events"); resp.StatusCode != 401 {
		t.Fatalf("stream without a session: %d", resp.StatusCode)
	}
	c := f.client(t)
	f.login(t, c, f.viewer)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.srv.URL+"/watch/events", nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("stream: %d %s", resp.StatusCode, ct)
	}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	// The hub's first read counts as a change; then a node's move does.
	waitLine(t, lines, "event: change")
	if err := f.st.NodeSetState(context.Background(), "node_x", store.NodeReady); err != nil {
		t.Fatal(err)
	}
	newest, err := f.st.OutboxMaxID(context.Background())
	if err != nil || newest == 0 {
		t.Fatalf("the node's move wrote no event: %d, %v", newest, err)
	}
	waitLine(t, lines, fmt.Sprintf("id: %d", newest))
	waitLine(t, lines, "event: change")
}

func waitLine(t *testing.T, lines <-chan string, want string) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case l := <-lines:
			if l == want {
				return
			}
		case <-timeout:
			t.Fatalf("no %q on the stream", want)
		}
	}
}

func TestStaticAssets(t *testing.T) {
	f := newFixture(t, watch.Config{})
	for path, ct := range map[string]string{"/watch/static/watch.js": "text/javascript; charset=utf-8", "/watch/static/watch.css": "text/css; charset=utf-8"} {
		resp, body := f.get(t, &http.Client{}, path)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != ct || len(body) < 100 {
			t.Errorf("%s: %d %s", path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
	}
	if resp, _ := f.get(t, &http.Client{}, "/watch/static/page.html"); resp.StatusCode != 404 {
		t.Errorf("a template served as a file: %d", resp.StatusCode)
	}
}
