package api_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// auditRows returns every audit row the store holds, oldest first.
func (f *fixture) auditRows() []*store.AuditEntry {
	f.t.Helper()
	return f.auditRowsAfter(0)
}

// auditRowsAfter returns the audit rows after the row id, oldest first,
// page after page: AuditList answers at most store.MaxListLimit rows (a
// count from one page stops growing there).
func (f *fixture) auditRowsAfter(id int64) []*store.AuditEntry {
	f.t.Helper()
	var all []*store.AuditEntry
	for {
		rows, err := f.st.AuditList(context.Background(), id, store.MaxListLimit)
		if err != nil {
			f.t.Fatal(err)
		}
		all = append(all, rows...)
		if len(rows) < store.MaxListLimit {
			return all
		}
		id = rows[len(rows)-1].ID
	}
}

// A NUL or bad UTF-8 in any string field is INVALID_ARGUMENT naming the
// field, never a 500, and the refused mutating call is audited once.
func TestTextRefusedNamingField(t *testing.T) {
	f := newFixture(t)
	for _, c := range []struct{ method, body, field string }{
		{"nodes.get", `{"id":"node_\u0000"}`, "id"},
		{"commands.get", `{"id":"\u0000"}`, "id"},
		{"nodes.list", `{"pool":"a\u0000b"}`, "pool"},
		{"commands.create", `{"pool":"default","selector":{"k":"v\u0000"},"kind":"exec","exec":{"argv":["ls"]}}`, `selector["k"]`},
		{"commands.create", `{"nodeIds":["n1"],"kind":"exec","exec":{"argv":["ls","\u0000"]}}`, "exec.argv[1]"},
		{"tokens.create", `{"role":"viewer","description":"a\u0000"}`, "description"},
		{"joinTokens.create", `{"pool":"default","description":"\u0000"}`, "description"},
		{"pools.create", `{"name":"p\u0000","site":"s"}`, "name"},
	} {
		before := len(f.auditRows())
		r := f.call(c.method, f.admin, c.body, peer)
		if r.Code != 400 || r.Body["code"] != "INVALID_ARGUMENT" || r.Body["field"] != c.field {
			t.Errorf("%s %s: %d %v, want 400 INVALID_ARGUMENT field %s", c.method, c.body, r.Code, r.Body, c.field)
			continue
		}
		rows := f.auditRows()
		mutating := !strings.HasSuffix(c.method, ".get") && !strings.HasSuffix(c.method, ".list")
		want := before
		if mutating {
			want++
		}
		if len(rows) != want {
			t.Errorf("%s: %d audit rows after the refusal, want %d", c.method, len(rows)-before, want-before)
		} else if mutating && (rows[len(rows)-1].Action != c.method || rows[len(rows)-1].Outcome != "INVALID_ARGUMENT") {
			t.Errorf("%s: audit row %+v", c.method, rows[len(rows)-1])
		}
	}
}

// Malformed bodies and a missing header on mutating calls are audited
// under the caller's token.
func TestRefusedMutatingCallsAudited(t *testing.T) {
	f := newFixture(t)
	before := len(f.auditRows())
	r := f.call("sites.create", f.admin, `{"name":`, peer)
	wantCode(t, r, 400, "INVALID_ARGUMENT", "")
	r = f.call("sites.create", f.admin, `{"nmae":"x"}`, peer)
	wantCode(t, r, 400, "INVALID_ARGUMENT", "nmae")
	rows := f.auditRows()[before:]
	if len(rows) != 2 || rows[0].Outcome != "INVALID_ARGUMENT" || rows[1].Outcome != "INVALID_ARGUMENT" ||
		!strings.HasPrefix(rows[0].Actor, "token:") {
		t.Fatalf("audit rows for two malformed calls: %+v", rows)
	}
	// Without the CSRF header: refused and audited as denied.
	req := httptest.NewRequest(http.MethodPost, "/api/sites/create", strings.NewReader(`{"name":"x","region":"r"}`))
	req.RemoteAddr = peer
	req.Header.Set("Authorization", "Bearer "+f.admin)
	w := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(w, req)
	if w.Code != 403 {
		t.Fatalf("no %s header: %d", api.HeaderCSRF, w.Code)
	}
	if rows := f.auditRows(); rows[len(rows)-1].Outcome != "denied" || rows[len(rows)-1].Action != "sites.create" {
		t.Fatalf("last audit row %+v", rows[len(rows)-1])
	}
}

// Another HTTP method on an API method's path is 405 with Allow: POST; an
// unknown path stays 404.
func TestMethodNotAllowed(t *testing.T) {
	f := newFixture(t)
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		w := httptest.NewRecorder()
		f.srv.Handler().ServeHTTP(w, httptest.NewRequest(m, "/api/nodes/list", nil))
		if w.Code != 405 || w.Header().Get("Allow") != "POST" || !strings.Contains(w.Body.String(), "METHOD_NOT_ALLOWED") {
			t.Fatalf("%s /api/nodes/list: %d Allow=%q %s", m, w.Code, w.Header().Get("Allow"), w.Body.String())
		}
	}
	w := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/api/nodes/nosuch", nil))
	if w.Code != 404 {
		t.Fatalf("GET /api/nodes/nosuch: %d", w.Code)
	}
	// A GET route called with POST.
	w = httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/api/health", nil))
	if w.Code != 405 || w.Header().Get("Allow") != "GET, HEAD" {
		t.Fatalf("POST /api/health: %d Allow=%q", w.Code, w.Header().Get("Allow"))
	}
}

type countRefusals struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *countRefusals) APIUnauthenticated(reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[reason]++
}

// Unauthenticated refusals are counted, and summarised in the audit log at
// most once a minute, so a flood of them cannot fill it.
func TestUnauthenticatedSummarised(t *testing.T) {
	st := sqlitetest.Open(t)
	var mu sync.Mutex
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	counter := &countRefusals{n: map[string]int{}}
	srv := api.New(api.Config{Secret: strings.Repeat("s", 32), Refusals: counter, Now: clock}, st, nil)
	f := &fixture{t: t, st: st, srv: srv}
	for range 500 {
		if r := f.call("sites.create", "bct_nosuchtoken", `{"name":"x"}`, peer); r.Code != 401 {
			t.Fatalf("unknown token: %d", r.Code)
		}
	}
	f.call("sites.create", "", `{}`, peer)
	rows := f.auditRows()
	if len(rows) != 1 || rows[0].Action != api.ActionUnauthenticated || rows[0].Actor != "anonymous" {
		t.Fatalf("after 501 refusals in a minute: %d audit rows %+v", len(rows), rows)
	}
	mu.Lock()
	now = now.Add(api.UnauthenticatedSummaryEvery)
	mu.Unlock()
	f.call("nodes.list", "", `{}`, peer)
	rows = f.auditRows()
	if len(rows) != 2 || !strings.Contains(string(rows[1].Details), `"refusals":501`) {
		t.Fatalf("a minute later: %d rows, last %s", len(rows), rows[len(rows)-1].Details)
	}
	if counter.n["unknown_token"] != 500 || counter.n["no_token"] != 2 {
		t.Fatalf("counted %v", counter.n)
	}
}
