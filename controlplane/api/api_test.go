package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

type fixture struct {
	t     testing.TB
	st    store.Store
	srv   *api.Server
	admin string
}

func newFixture(t testing.TB, trusted ...string) *fixture {
	t.Helper()
	st := sqlitetest.Open(t)
	var proxies []netip.Prefix
	for _, p := range trusted {
		proxies = append(proxies, netip.MustParsePrefix(p))
	}
	srv := api.New(api.Config{TrustedProxies: proxies, Secret: strings.Repeat("s", 32), Sinks: []string{"alerts", "archive", "quiet"}}, st, nil)
	f := &fixture{t: t, st: st, srv: srv}
	f.admin = f.token(store.RoleAdmin, 0)
	return f
}

func (f *fixture) token(role string, ttl time.Duration) string {
	f.t.Helper()
	secret, _, err := iam.Create(context.Background(), f.st, iam.CreateParams{Role: role, TTL: ttl})
	if err != nil {
		f.t.Fatal(err)
	}
	return secret
}

type result struct {
	Code int
	Body map[string]any
}

// call posts body to /api/<method> from peer with extra headers.
func (f *fixture) call(method, token, body, peer string, headers ...string) result {
	f.t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/api/"+strings.ReplaceAll(method, ".", "/"), strings.NewReader(body))
	r.RemoteAddr = peer
	r.Header.Set("X-Better-Compute", "1")
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Set(headers[i], headers[i+1])
	}
	w := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(w, r)
	out := result{Code: w.Code, Body: map[string]any{}}
	if err := json.Unmarshal(w.Body.Bytes(), &out.Body); err != nil {
		f.t.Fatalf("%s: body %q is not JSON", method, w.Body.String())
	}
	return out
}

const peer = "192.0.2.10:40000"

func wantCode(t *testing.T, r result, status int, code, field string) {
	t.Helper()
	if r.Code != status || r.Body["code"] != code || (field != "" && r.Body["field"] != field) {
		t.Fatalf("got %d %v, want %d %s field %q", r.Code, r.Body, status, code, field)
	}
	if msg, _ := r.Body["message"].(string); msg == "" || strings.Contains(msg, "goroutine") {
		t.Fatalf("error message %q", msg)
	}
}

func TestCSRFHeaderRequired(t *testing.T) {
	f := newFixture(t)
	r := httptest.NewRequest(http.MethodPost, "/api/sites/list", strings.NewReader("{}"))
	r.Header.Set("Authorization", "Bearer "+f.admin)
	w := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(w, r)
	if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "X-Better-Compute") {
		t.Fatalf("request without the header: %d %s", w.Code, w.Body.String())
	}
}

func TestAuthentication(t *testing.T) {
	f := newFixture(t)
	wantCode(t, f.call("sites.list", "", "{}", peer), 401, apiv1.CodeUnauthenticated, "")
	wantCode(t, f.call("sites.list", "bcat_nope", "{}", peer), 401, apiv1.CodeUnauthenticated, "")
	expired := f.token(store.RoleAdmin, time.Millisecond)
	time.Sleep(5 * time.Millisecond)
	wantCode(t, f.call("sites.list", expired, "{}", peer), 401, apiv1.CodeUnauthenticated, "")
	if r := f.call("sites.list", f.admin, "{}", peer); r.Code != 200 {
		t.Fatalf("admin sites.list = %v", r)
	}
	// A revoked token stops working at once in this process.
	victim := f.token(store.RoleViewer, 0)
	if r := f.call("sites.list", victim, "{}", peer); r.Code != 200 {
		t.Fatalf("viewer = %v", r)
	}
	toks, _ := f.st.APITokenList(context.Background(), &store.ListParams{})
	for _, tok := range toks {
		if tok.Role == store.RoleViewer {
			if r := f.call("tokens.revoke", f.admin, `{"id":"`+tok.ID+`"}`, peer); r.Code != 200 {
				t.Fatalf("revoke = %v", r)
			}
		}
	}
	wantCode(t, f.call("sites.list", victim, "{}", peer), 401, apiv1.CodeUnauthenticated, "")
}

func TestAuthorisationByRole(t *testing.T) {
	f := newFixture(t)
	viewer := f.token(store.RoleViewer, 0)
	operator := f.token(store.RoleOperator, 0)
	if r := f.call("sites.create", f.admin, `{"name":"ams-1","region":"eu-1"}`, peer); r.Code != 200 {
		t.Fatalf("create site = %v", r)
	}
	if r := f.call("pools.create", f.admin, `{"name":"default","site":"ams-1"}`, peer); r.Code != 200 {
		t.Fatalf("create pool = %v", r)
	}
	wantCode(t, f.call("commands.create", viewer, `{"pool":"default","kind":"exec","exec":{"argv":["true"]}}`, peer), 403, apiv1.CodePermissionDenied, "")
	wantCode(t, f.call("sites.create", operator, `{"name":"x","region":"y"}`, peer), 403, apiv1.CodePermissionDenied, "")
	wantCode(t, f.call("tokens.create", operator, `{"role":"admin"}`, peer), 403, apiv1.CodePermissionDenied, "")
	// The operator passes authorisation; the pool simply has no node yet.
	wantCode(t, f.call("commands.create", operator, `{"pool":"default","kind":"exec","exec":{"argv":["true"]}}`, peer), 404, apiv1.CodeNotFound, "pool")
	if r := f.call("pools.list", viewer, `{}`, peer); r.Code != 200 {
		t.Fatalf("viewer pools.list = %v", r)
	}
}

func TestBadRequests(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		method, body, field string
	}{
		{"sites.create", `{"name":`, ""},
		{"sites.create", `{"name":"a","region":"b","colour":"red"}`, "colour"},
		{"sites.create", `{"name":"Bad Name!","region":"b"}`, "name"},
		{"sites.create", `{"name":42}`, "name"},
		{"pools.create", `{"name":"p","site":""}`, "site"},
		{"nodes.get", `{"id":"../../etc"}`, "id"},
		{"nodes.get", `{"id":""}`, "id"},
		{"sites.list", `{"page":{"limit":5000}}`, "page.limit"},
		{"commands.create", `{"nodeIds":["n"],"kind":"format-disk"}`, "kind"},
		{"commands.create", `{"nodeIds":["n"],"kind":"exec","exec":{"argv":[]}}`, "exec.argv"},
		{"commands.create", `{"nodeIds":["n"],"kind":"exec","exec":{"argv":["x"]},"timeout":"90000s"}`, "timeout"},
		{"joinTokens.create", `{"pool":""}`, "pool"},
		{"tokens.create", `{"role":"root"}`, "role"},
		{"pki.revoke", `{}`, "nodeId"},
	} {
		wantCode(t, f.call(tc.method, f.admin, tc.body, peer), 400, apiv1.CodeInvalidArgument, tc.field)
	}
	big := `{"name":"` + strings.Repeat("a", api.MaxBodyBytes) + `"}`
	wantCode(t, f.call("sites.create", f.admin, big, peer), 400, apiv1.CodeInvalidArgument, "")
	wantCode(t, f.call("nope.nothing", f.admin, `{}`, peer), 404, apiv1.CodeNotFound, "")
	wantCode(t, f.call("nodes.get", f.admin, `{"id":"node_missing"}`, peer), 404, apiv1.CodeNotFound, "id")
	if r := f.call("sites.create", f.admin, `{"name":"dup","region":"r"}`, peer); r.Code != 200 {
		t.Fatal(r)
	}
	wantCode(t, f.call("sites.create", f.admin, `{"name":"dup","region":"r"}`, peer), 409, apiv1.CodeConflict, "name")
}

// lastAuditIP returns the source address of the newest audit row.
func lastAuditIP(t *testing.T, st store.Store) string {
	t.Helper()
	rows, err := st.AuditList(context.Background(), 0, 1000)
	if err != nil || len(rows) == 0 {
		t.Fatalf("audit rows: %v %v", len(rows), err)
	}
	return rows[len(rows)-1].SourceIP
}

func TestCallerAddress(t *testing.T) {
	f := newFixture(t, "10.0.0.0/8")
	create := func(name, peer string, headers ...string) {
		t.Helper()
		if r := f.call("sites.create", f.admin, `{"name":"`+name+`","region":"r"}`, peer, headers...); r.Code != 200 {
			t.Fatal(r)
		}
	}
	// An untrusted peer cannot name its own address.
	create("a", "192.0.2.10:1", "X-Forwarded-For", "203.0.113.9", "X-Real-IP", "203.0.113.8", "Forwarded", "for=203.0.113.7")
	if ip := lastAuditIP(t, f.st); ip != "192.0.2.10" {
		t.Fatalf("untrusted peer with XFF: audit address %s, want 192.0.2.10", ip)
	}
	// A trusted proxy: the right-most untrusted hop is the caller.
	create("b", "10.1.2.3:1", "X-Forwarded-For", "203.0.113.9, 198.51.100.4, 10.9.9.9")
	if ip := lastAuditIP(t, f.st); ip != "198.51.100.4" {
		t.Fatalf("trusted proxy: audit address %s, want 198.51.100.4", ip)
	}
	// IPv4-mapped IPv6 peers compare as IPv4.
	create("c", "[::ffff:10.0.0.1]:1", "X-Forwarded-For", "198.51.100.5")
	if ip := lastAuditIP(t, f.st); ip != "198.51.100.5" {
		t.Fatalf("mapped trusted proxy: audit address %s, want 198.51.100.5", ip)
	}
}

func TestTokenAllowCIDR(t *testing.T) {
	f := newFixture(t)
	secret, _, err := iam.Create(context.Background(), f.st, iam.CreateParams{Role: store.RoleViewer, AllowCIDRs: []string{"192.0.2.0/24"}})
	if err != nil {
		t.Fatal(err)
	}
	if r := f.call("sites.list", secret, `{}`, "192.0.2.77:1"); r.Code != 200 {
		t.Fatalf("allowed address: %v", r)
	}
	wantCode(t, f.call("sites.list", secret, `{}`, "198.51.100.1:1"), 401, apiv1.CodeUnauthenticated, "")
}

func TestMutatingCallsAudited(t *testing.T) {
	f := newFixture(t)
	before, _ := f.st.AuditList(context.Background(), 0, 1000)
	f.call("sites.create", f.admin, `{"name":"x","region":"r"}`, peer)
	f.call("sites.list", f.admin, `{}`, peer)
	after, _ := f.st.AuditList(context.Background(), 0, 1000)
	if len(after) != len(before)+1 || after[len(after)-1].Action != "sites.create" || after[len(after)-1].Outcome != "ok" {
		t.Fatalf("audit rows %d -> %d: %+v", len(before), len(after), after[len(after)-1])
	}
}

// FuzzRequestDecoding sends arbitrary bodies to every method (and an
// unknown one): never a 500, and every mutating call, allowed or refused,
// leaves exactly one audit row; a read leaves none.
func FuzzRequestDecoding(f *testing.F) {
	shared := newFixture(f)
	methods, mutating := api.MethodsForTest(shared.srv)
	methods = append(methods, "no.such")
	for i := range methods {
		for _, s := range []string{`{}`, `{"name":"a","region":"b"}`, `{"page":{"limit":3,"cursor":"x"}}`,
			`{"nodeIds":["a"],"kind":"exec","exec":{"argv":["ls"],"env":{"A":"1"}},"timeout":"3s"}`, `[`, `null`,
			`{"id":"\u0000"}`, "{\"name\":\"\xff\"}", `{"pool":"default","ttl":"1h"}`} {
			f.Add(uint8(i), s)
		}
	}
	// last is the newest audit row seen by this process's inputs, which
	// run one after another: each input counts the rows after it, so the
	// count stays right (and cheap) however long the log grows.
	var last int64
	f.Fuzz(func(t *testing.T, m uint8, body string) {
		fx := *shared
		fx.t = t
		method := methods[int(m)%len(methods)]
		if rows := fx.auditRowsAfter(last); len(rows) > 0 {
			last = rows[len(rows)-1].ID
		}
		r := fx.call(method, fx.admin, body, peer)
		if r.Code >= 500 || r.Body["code"] == nil && r.Code != 200 {
			t.Fatalf("%s %q: %d %v", method, body, r.Code, r.Body)
		}
		want := 0
		if mutating[method] {
			want = 1
		}
		rows := fx.auditRowsAfter(last)
		if len(rows) > 0 {
			last = rows[len(rows)-1].ID
		}
		if got := len(rows); got != want {
			t.Fatalf("%s %q (%d %v): %d audit rows, want %d", method, body, r.Code, r.Body, got, want)
		}
	})
}

func TestBearerScheme(t *testing.T) {
	f := newFixture(t)
	for _, h := range []string{"bearer " + f.admin, "BEARER  " + f.admin} {
		r := httptest.NewRequest(http.MethodPost, "/api/sites/list", strings.NewReader("{}"))
		r.RemoteAddr = peer
		r.Header.Set("X-Better-Compute", "1")
		r.Header.Set("Authorization", h)
		w := httptest.NewRecorder()
		f.srv.Handler().ServeHTTP(w, r)
		if w.Code != 200 {
			t.Fatalf("Authorization %q: %d %s", h[:8], w.Code, w.Body.String())
		}
	}
	for _, h := range []string{f.admin, "Basic " + f.admin, "Token " + f.admin} {
		r := httptest.NewRequest(http.MethodPost, "/api/sites/list", strings.NewReader("{}"))
		r.RemoteAddr = peer
		r.Header.Set("X-Better-Compute", "1")
		r.Header.Set("Authorization", h)
		w := httptest.NewRecorder()
		f.srv.Handler().ServeHTTP(w, r)
		if w.Code != 401 {
			t.Fatalf("Authorization without the Bearer scheme: %d", w.Code)
		}
	}
}

func TestWellKnown(t *testing.T) {
	f := newFixture(t)
	b, err := pki.Init(pki.InitOptions{TrustDomain: "wk.test"})
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := b.SealBundle(strings.Repeat("s", 32))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.st.PKIBundleCreate(context.Background(), &store.PKIBundle{TrustDomain: "wk.test", Sealed: sealed}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second answer comes from the cached pin
		w := httptest.NewRecorder()
		f.srv.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/.well-known/better-compute", nil))
		var got struct{ TrustDomain, GatewayCaPin, BasePath string }
		if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || got.TrustDomain != "wk.test" || got.GatewayCaPin != b.GatewayPin() || got.BasePath != "/api" {
			t.Fatalf("well-known = %d %s", w.Code, w.Body.String())
		}
	}
}
