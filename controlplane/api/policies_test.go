package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// applyBody is a policies.apply request for document.
func applyBody(t *testing.T, document string) string {
	t.Helper()
	b, err := json.Marshal(map[string]string{"document": document})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestPolicyChangeReachesEveryAPIProcess: two api processes over one
// store, with one clock. A policy applied through one holds there at once
// and on the other once PolicyRefresh has passed (its cached allowed read
// dropped with it), never later: the seeds' "within 10 s".
func TestPolicyChangeReachesEveryAPIProcess(t *testing.T) {
	st := sqlitetest.Open(t)
	var mu sync.Mutex
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	cfg := api.Config{Secret: strings.Repeat("s", 32), Now: clock}
	a := &fixture{t: t, st: st, srv: api.New(cfg, st, nil)}
	b := &fixture{t: t, st: st, srv: api.New(cfg, st, nil)}
	admin := a.token(store.RoleAdmin, 0)
	viewer := a.token(store.RoleViewer, 0)
	tok, err := st.APITokenBySecret(context.Background(), iam.Hash(viewer))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []*fixture{a, b} {
		if r := f.call("nodes.list", viewer, "{}", peer); r.Code != http.StatusOK {
			t.Fatalf("before any policy nodes.list = %d %v", r.Code, r.Body)
		}
	}
	doc := fmt.Sprintf("policies:\n  - name: no-nodes\n    bind: {tokens: [%s]}\n    statements:\n      - {effect: deny, actions: [nodes.list]}\n", tok.ID)
	if r := a.call("policies.apply", admin, applyBody(t, doc), peer); r.Code != http.StatusOK {
		t.Fatalf("policies.apply = %d %v", r.Code, r.Body)
	}
	wantCode(t, a.call("nodes.list", viewer, "{}", peer), http.StatusForbidden, "PERMISSION_DENIED", "")
	// The other process read the policies less than PolicyRefresh ago.
	if r := b.call("nodes.list", viewer, "{}", peer); r.Code != http.StatusOK {
		t.Fatalf("the other process before its refresh: %d %v", r.Code, r.Body)
	}
	advance(api.PolicyRefresh)
	r := b.call("nodes.list", viewer, "{}", peer)
	wantCode(t, r, http.StatusForbidden, "PERMISSION_DENIED", "")
	if msg := r.Body["message"].(string); !strings.Contains(msg, `policy "no-nodes" statement 1`) {
		t.Fatalf("the refusal says %q, want the policy and statement named", msg)
	}
	// Other methods and other tokens keep their built-in roles.
	if r := b.call("nodes.list", admin, "{}", peer); r.Code != http.StatusOK {
		t.Fatalf("the admin's nodes.list = %d %v", r.Code, r.Body)
	}
	if r := b.call("sites.list", viewer, "{}", peer); r.Code != http.StatusOK {
		t.Fatalf("the viewer's sites.list = %d %v", r.Code, r.Body)
	}
}

// TestPolicyApplyRefusals: a document that would leave no live token able
// to change the tenant's policies is CONFLICT, one that does not compile
// or whose own tests fail INVALID_ARGUMENT naming the place or the test,
// and an expected version that no longer holds CONFLICT; none of them
// changes the stored version, and each refusal is audited.
func TestPolicyApplyRefusals(t *testing.T) {
	f := newFixture(t)
	version := func() float64 {
		r := f.call("policies.get", f.admin, "{}", peer)
		v, _ := r.Body["version"].(string) // protojson writes int64 as a string
		var n float64
		fmt.Sscan(v, &n)
		return n
	}
	lockout := "policies:\n  - name: lockout\n    bind: {roles: [admin]}\n    statements:\n      - {effect: deny, actions: [\"policies.*\"]}\n"
	r := f.call("policies.apply", f.admin, applyBody(t, lockout), peer)
	wantCode(t, r, http.StatusConflict, "CONFLICT", "document")
	// A condition true for every real call but not for a check without an
	// address, fields or names locks out all the same: refused.
	for _, cond := range []string{`request.sourceIp != ""`, `has(request.fields.document)`, `resource.tenantName != ""`} {
		doc := "policies:\n  - name: lockout\n    bind: {roles: [admin]}\n    statements:\n      - {effect: deny, actions: [policies.apply], condition: '" + cond + "'}\n"
		wantCode(t, f.call("policies.apply", f.admin, applyBody(t, doc), peer), http.StatusConflict, "CONFLICT", "document")
	}
	bad := "policies:\n  - name: typo\n    bind: {roles: [operator]}\n    statements:\n      - {effect: allow, actions: [nodes.drian]}\n"
	r = f.call("policies.apply", f.admin, applyBody(t, bad), peer)
	wantCode(t, r, http.StatusBadRequest, "INVALID_ARGUMENT", "document")
	if msg := r.Body["message"].(string); !strings.Contains(msg, "policies[0].statements[0].actions") || !strings.Contains(msg, "nodes.drian") {
		t.Fatalf("a misspelt action: %q, want its place and name", msg)
	}
	failing := "policies: []\ntests:\n  - {name: viewers drain, caller: {role: viewer}, action: nodes.drain, expect: allow}\n"
	r = f.call("policies.apply", f.admin, applyBody(t, failing), peer)
	wantCode(t, r, http.StatusBadRequest, "INVALID_ARGUMENT", "document")
	if msg := r.Body["message"].(string); !strings.Contains(msg, `"viewers drain" wants allow, got deny`) {
		t.Fatalf("a failing test: %q", msg)
	}
	if v := version(); v != 0 {
		t.Fatalf("after three refusals the version is %v, want 0", v)
	}
	ok := "policies: []\n"
	if r := f.call("policies.apply", f.admin, `{"document": "policies: []\n", "expectedVersion": "0"}`, peer); r.Code != http.StatusOK {
		t.Fatalf("apply at version 0: %d %v", r.Code, r.Body)
	}
	wantCode(t, f.call("policies.apply", f.admin, `{"document": "policies: []\n", "expectedVersion": "0"}`, peer), http.StatusConflict, "CONFLICT", "expectedVersion")
	if r := f.call("policies.apply", f.admin, applyBody(t, ok), peer); r.Code != http.StatusOK || version() != 2 {
		t.Fatalf("apply without a version: %d %v, version %v", r.Code, r.Body, version())
	}
	rows, err := f.st.AuditQuery(context.Background(), &store.AuditQueryParams{ActionPrefix: "policies.apply", Limit: 10})
	if err != nil || len(rows) != 9 {
		t.Fatalf("audit rows of policies.apply = %d, %v; want 9 (seven refused, two applied)", len(rows), err)
	}
}

// tokenOf makes a token of role in tenant and returns its secret and id.
func tokenOf(t *testing.T, st store.Store, role, tenant string) (string, string) {
	t.Helper()
	secret, tok, err := iam.Create(context.Background(), st, iam.CreateParams{Role: role, TenantID: tenant})
	if err != nil {
		t.Fatal(err)
	}
	return secret, tok.ID
}

// TestPolicyResources: what a call is decided on. A selector naming a
// tenant by name matches a call that names the tenant (tokens.create for
// team-a); a request's fields at their default value are there for a
// condition (asRoot false is false, not a missing key that fails a deny
// closed); another tenant's node is, to a policy, the id asked for and
// nothing else, so a condition cannot tell it from a missing one (both
// NOT_FOUND); the event stream is decided as events.list.
func TestPolicyResources(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	team, err := f.st.TenantCreate(ctx, &store.TenantCreateParams{Name: "team-a", ParentID: store.RootTenant})
	if err != nil {
		t.Fatal(err)
	}
	teamB, err := f.st.TenantCreate(ctx, &store.TenantCreateParams{Name: "team-b", ParentID: store.RootTenant})
	if err != nil {
		t.Fatal(err)
	}
	site, err := f.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := f.st.PoolCreate(ctx, &store.PoolCreateParams{Name: "root-pool", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_root1", PoolID: pool.ID, Hostname: "r1", MachineID: "m-r1"}); err != nil {
		t.Fatal(err)
	}

	// Root: its admins may not make tokens for team-a, named by name.
	admin2, _ := tokenOf(t, f.st, store.RoleAdmin, store.RootTenant)
	rootDoc := "policies:\n  - name: not-team-a\n    bind: {roles: [admin]}\n    statements:\n" +
		"      - {effect: deny, actions: [tokens.create], resources: {tenants: [team-a]}}\n" +
		"      - {effect: deny, actions: [tunnels.create], condition: 'request.fields.asRoot == true'}\n"
	if r := f.call("policies.apply", f.admin, applyBody(t, rootDoc), peer); r.Code != http.StatusOK {
		t.Fatalf("apply root's policies: %d %v", r.Code, r.Body)
	}
	wantCode(t, f.call("tokens.create", admin2, `{"role": "viewer", "tenant": "team-a"}`, peer), http.StatusForbidden, "PERMISSION_DENIED", "")
	wantCode(t, f.call("tokens.create", admin2, `{"role": "viewer", "tenant": "`+team.ID+`"}`, peer), http.StatusForbidden, "PERMISSION_DENIED", "")
	if r := f.call("tokens.create", admin2, `{"role": "viewer", "tenant": "team-b"}`, peer); r.Code != http.StatusOK {
		t.Fatalf("tokens.create for team-b: %d %v", r.Code, r.Body)
	}
	// asRoot false is false: the deny does not apply, the handler answers.
	wantCode(t, f.call("tunnels.create", admin2, `{"node": "node_nosuch", "kind": "shell", "asRoot": false}`, peer), http.StatusNotFound, "NOT_FOUND", "")
	wantCode(t, f.call("tunnels.create", admin2, `{"node": "node_nosuch", "kind": "shell", "asRoot": true}`, peer), http.StatusForbidden, "PERMISSION_DENIED", "")

	// team-b's viewer, bound by a deny on what is not its own tenant's.
	viewerB, viewerBID := tokenOf(t, f.st, store.RoleViewer, teamB.ID)
	adminB, _ := tokenOf(t, f.st, store.RoleAdmin, teamB.ID)
	probe := fmt.Sprintf("policies:\n  - name: probe\n    bind: {tokens: [%s]}\n    statements:\n"+
		"      - {effect: deny, actions: [nodes.get], condition: 'resource.tenant != \"\" && resource.tenant != caller.tenant'}\n"+
		"      - {effect: deny, actions: [events.list]}\n", viewerBID)
	if r := f.call("policies.apply", adminB, applyBody(t, probe), peer); r.Code != http.StatusOK {
		t.Fatalf("apply team-b's policies: %d %v", r.Code, r.Body)
	}
	for _, id := range []string{"node_root1", "node_nosuch"} {
		wantCode(t, f.call("nodes.get", viewerB, `{"id": "`+id+`"}`, peer), http.StatusNotFound, "NOT_FOUND", "")
	}
	r := httptest.NewRequest(http.MethodGet, "/api/events/watch", nil)
	r.RemoteAddr = peer
	r.Header.Set("X-Better-Compute", "1")
	r.Header.Set("Authorization", "Bearer "+viewerB)
	w := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(w, r)
	if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), `policy \"probe\" statement 2`) {
		t.Fatalf("events/watch of a viewer whose policy denies events.list: %d %s", w.Code, w.Body.String())
	}
}
