package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/internal/clocktest"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// TestTunnelTickets: tunnels.create's checks and roles, and the refusals
// of GET {basePath}/tunnels/{ticket} before any upgrade: no token, a viewer,
// another token, the header missing, a ticket past its 30 s (an injected
// clock), and a deployment that relays no tunnels.
func TestTunnelTickets(t *testing.T) {
	ctx := context.Background()
	st := sqlitetest.Open(t)
	clock := clocktest.New(time.Now())
	srv := api.New(api.Config{Secret: strings.Repeat("s", 32), Now: clock.Now}, st, nil)
	tok := func(role string) string {
		s, _, err := iam.Create(ctx, st, iam.CreateParams{Role: role})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	admin, operator, other, viewer := tok(store.RoleAdmin), tok(store.RoleOperator), tok(store.RoleOperator), tok(store.RoleViewer)
	site, _ := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "default"})
	pool, _ := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_t", PoolID: pool.ID, Hostname: "t", MachineID: "m"}); err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, st: st, srv: srv}
	create := func(token, body string) (int, map[string]any) {
		r := f.call("tunnels.create", token, body, peer)
		return r.Code, r.Body
	}
	for body, wantStatus := range map[string]int{
		`{"node":"node_t","kind":"telnet"}`:               400,
		`{"node":"node_t","kind":"port","port":0}`:        400,
		`{"node":"node_t","kind":"port","port":70000}`:    400,
		`{"node":"node_t","kind":"shell","port":22}`:      400,
		`{"node":"node_none","kind":"shell"}`:             404,
		`{"node":"node_t","kind":"shell","asRoot":true}`:  403, // an operator
		`{"node":"node_t","kind":"port","port":8080}`:     200,
		`{"node":"node_t","kind":"shell","asRoot":false}`: 200,
	} {
		if code, b := create(operator, body); code != wantStatus {
			t.Errorf("tunnels.create %s as operator = %d %v, want %d", body, code, b, wantStatus)
		}
	}
	if code, _ := create(viewer, `{"node":"node_t","kind":"shell"}`); code != 403 {
		t.Errorf("tunnels.create as viewer = %d, want 403", code)
	}
	if code, _ := create(admin, `{"node":"node_t","kind":"shell","asRoot":true}`); code != 200 {
		t.Errorf("root shell ticket as admin = %d, want 200", code)
	}

	open := func(path, token string, csrf bool) (int, string) {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		r.RemoteAddr = peer
		if csrf {
			r.Header.Set("X-Better-Compute", "1")
		}
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		w := httptest.NewRecorder()
		srv.Handler().ServeHTTP(w, r)
		var b struct{ Code, Message string }
		_ = json.Unmarshal(w.Body.Bytes(), &b)
		return w.Code, b.Message
	}
	_, b := create(operator, `{"node":"node_t","kind":"shell"}`)
	path := b["path"].(string)
	if !strings.HasPrefix(path, "/api/tunnels/tun_") {
		t.Fatalf("ticket path %q", path)
	}
	for name, c := range map[string]struct {
		token string
		csrf  bool
		want  int
	}{
		"no token":       {"", true, 401},
		"a viewer":       {viewer, true, 403},
		"another token":  {other, true, 403},
		"no CSRF header": {operator, false, 403},
	} {
		if code, msg := open(path, c.token, c.csrf); code != c.want {
			t.Errorf("%s: GET ticket = %d %q, want %d", name, code, msg, c.want)
		}
	}
	if code, _ := open("/api/tunnels/tun_nosuch.secret", operator, true); code != 404 {
		t.Errorf("unknown ticket = %d, want 404", code)
	}
	// 30 s later the ticket opens nothing; none of the refusals above used it.
	clock.Advance(api.TunnelTicketTTL)
	if code, msg := open(path, operator, true); code != 403 || !strings.Contains(msg, "expired") {
		t.Errorf("ticket after 30 s = %d %q, want 403 expired", code, msg)
	}
	// A fresh ticket, used: this server relays no tunnels (503); used again:
	// refused as used.
	_, b = create(operator, `{"node":"node_t","kind":"shell"}`)
	if code, msg := open(b["path"].(string), operator, true); code != 503 {
		t.Errorf("ticket without a relay = %d %q, want 503", code, msg)
	}
	if code, msg := open(b["path"].(string), operator, true); code != 403 || !strings.Contains(msg, "used already") {
		t.Errorf("ticket used twice = %d %q, want 403 used", code, msg)
	}
	// Refusals and the end are audited.
	entries, err := st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "tunnels.", Limit: 50})
	if err != nil {
		t.Fatal(err)
	}
	actions := map[string]int{}
	for _, e := range entries {
		actions[e.Action+" "+e.Outcome]++
	}
	if actions["tunnels.open denied"] < 4 || actions["tunnels.close ok"] != 1 || actions["tunnels.create ok"] < 3 {
		t.Errorf("audit rows = %v", actions)
	}
}
