package api_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// accessDoc makes root shells on pool a requestable by operators for up
// to 4 hours, approved by admins.
const accessDoc = `policies:
  - name: root-shell-pool-a
    description: root shells on pool a, on request
    request:
      requesters: {roles: [operator]}
      approvers: {roles: [admin]}
      maxDuration: 4h
    statements:
      - effect: allow
        actions: [nodes.shell, nodes.shellAsRoot]
        resources: {pools: [a]}
tests:
  - name: granted, a root shell on a
    caller: {role: operator, granted: [root-shell-pool-a]}
    action: nodes.shellAsRoot
    resource: {pool: a}
    expect: allow
`

// TestAccessRequestAcrossProcesses: two api processes over one store and
// one clock. An operator's request for a requestable policy is checked
// (policy, duration, reason, resource, who may ask); neither the requester
// nor an operator may approve it; an admin's approval through one process
// allows the operator's root shell there at once and on the other within
// PolicyRefresh, on pool a only, and its end holds on both at once; of two
// admins approving at once one wins and the other gets CONFLICT; a
// revocation through one process holds there at once and on the other
// within PolicyRefresh; another tenant's admin sees NOT_FOUND; every step
// is an audit row and an event.
func TestAccessRequestAcrossProcesses(t *testing.T) {
	ctx := context.Background()
	st := sqlitetest.Open(t)
	var mu sync.Mutex
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	cfg := api.Config{Secret: strings.Repeat("s", 32), Now: clock}
	a := &fixture{t: t, st: st, srv: api.New(cfg, st, nil)}
	b := &fixture{t: t, st: st, srv: api.New(cfg, st, nil)}
	admin, admin2 := a.token(store.RoleAdmin, 0), a.token(store.RoleAdmin, 0)
	op, op2, viewer := a.token(store.RoleOperator, 0), a.token(store.RoleOperator, 0), a.token(store.RoleViewer, 0)
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s1", Region: "eu-1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "c"} {
		pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: name, SiteID: site.ID})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_" + name, PoolID: pool.ID, Hostname: name, MachineID: "m-" + name}); err != nil {
			t.Fatal(err)
		}
	}
	if r := a.call("policies.apply", admin, applyBody(t, accessDoc), peer); r.Code != http.StatusOK {
		t.Fatalf("policies.apply = %d %v", r.Code, r.Body)
	}
	rootShell := func(f *fixture, node string) result {
		return f.call("tunnels.create", op, fmt.Sprintf(`{"node": %q, "kind": "shell", "asRoot": true}`, node), peer)
	}
	for _, f := range []*fixture{a, b} {
		wantCode(t, rootShell(f, "node_a"), http.StatusForbidden, "PERMISSION_DENIED", "")
	}

	request := func(token, body string) result { return a.call("access.request", token, body, peer) }
	good := `{"policy": "root-shell-pool-a", "resource": "pool:a", "duration": "120s", "reason": "a driver wedged a GPU"}`
	for _, c := range []struct {
		body, code, field, says string
	}{
		{`{"duration": "120s", "reason": "x"}`, "INVALID_ARGUMENT", "policy", "is required"},
		{`{"policy": "nope", "duration": "120s", "reason": "x"}`, "INVALID_ARGUMENT", "policy", `no requestable policy "nope"`},
		{`{"policy": "root-shell-pool-a", "reason": "x"}`, "INVALID_ARGUMENT", "duration", "is required"},
		{`{"policy": "root-shell-pool-a", "duration": "30s", "reason": "x"}`, "INVALID_ARGUMENT", "duration", "at least 1m0s"},
		{`{"policy": "root-shell-pool-a", "duration": "18000s", "reason": "x"}`, "INVALID_ARGUMENT", "duration", "maxDuration, 4h0m0s"},
		{`{"policy": "root-shell-pool-a", "duration": "120s", "reason": "  "}`, "INVALID_ARGUMENT", "reason", "is required"},
		{`{"policy": "root-shell-pool-a", "duration": "120s", "reason": "` + strings.Repeat("x", 1025) + `"}`, "INVALID_ARGUMENT", "reason", "at most 1024"},
		{`{"policy": "root-shell-pool-a", "duration": "120s", "reason": "ok\u001b[1A\u001b[2K hidden"}`, "INVALID_ARGUMENT", "reason", "control character"},
		{`{"policy": "root-shell-pool-a", "duration": "120s", "reason": "x", "resource": "a"}`, "INVALID_ARGUMENT", "resource", "KIND:NAME_OR_ID"},
		{`{"policy": "root-shell-pool-a", "duration": "120s", "reason": "x", "resource": "rack:a"}`, "INVALID_ARGUMENT", "resource", "want pool, site, node or tenant"},
		{`{"policy": "root-shell-pool-a", "duration": "120s", "reason": "x", "resource": "pool:zzz"}`, "NOT_FOUND", "resource", "no pool zzz"},
	} {
		r := request(op, c.body)
		if r.Body["code"] != c.code || r.Body["field"] != c.field || !strings.Contains(fmt.Sprint(r.Body["message"]), c.says) {
			t.Errorf("access.request %.80s: %d %v, want %s on %s saying %q", c.body, r.Code, r.Body, c.code, c.field, c.says)
		}
	}
	// The policy's requesters bind operators: a viewer may call the
	// method, but not ask for this policy.
	r := request(viewer, good)
	wantCode(t, r, http.StatusForbidden, "PERMISSION_DENIED", "policy")
	if !strings.Contains(r.Body["message"].(string), "request.requesters do not bind you") {
		t.Fatalf("a viewer's request: %v", r.Body)
	}

	r = request(op, good)
	if r.Code != http.StatusOK || r.Body["state"] != "pending" || r.Body["resource"] == "" || r.Body["requesterRole"] != "operator" {
		t.Fatalf("access.request = %d %v", r.Code, r.Body)
	}
	id := r.Body["id"].(string)
	decide := func(f *fixture, method, token, id string) result {
		return f.call(method, token, fmt.Sprintf(`{"id": %q}`, id), peer)
	}
	// The requester cannot approve its own request; another operator is no
	// approver.
	r = decide(a, "access.approve", op, id)
	wantCode(t, r, http.StatusForbidden, "PERMISSION_DENIED", "id")
	if !strings.Contains(r.Body["message"].(string), "may not approve its own request") {
		t.Fatalf("self-approval: %v", r.Body)
	}
	r = decide(b, "access.approve", op2, id)
	wantCode(t, r, http.StatusForbidden, "PERMISSION_DENIED", "id")
	if !strings.Contains(r.Body["message"].(string), "request.approvers do not bind you") {
		t.Fatalf("an operator's approval: %v", r.Body)
	}
	wantCode(t, rootShell(a, "node_a"), http.StatusForbidden, "PERMISSION_DENIED", "")

	// Approved through a: a root shell on pool a there at once, on b
	// within PolicyRefresh; never on pool c.
	if r := decide(a, "access.approve", admin, id); r.Code != http.StatusOK || r.Body["state"] != "approved" {
		t.Fatalf("the admin's approval: %d %v", r.Code, r.Body)
	}
	approvedAt := clock()
	if r := rootShell(a, "node_a"); r.Code != http.StatusOK {
		t.Fatalf("the operator's root shell after the approval, same process: %d %v", r.Code, r.Body)
	}
	// The other process read the grants less than PolicyRefresh ago.
	wantCode(t, rootShell(b, "node_a"), http.StatusForbidden, "PERMISSION_DENIED", "")
	advance(api.PolicyRefresh)
	if r := rootShell(b, "node_a"); r.Code != http.StatusOK {
		t.Fatalf("the operator's root shell on the other process after PolicyRefresh: %d %v", r.Code, r.Body)
	}
	for _, f := range []*fixture{a, b} {
		wantCode(t, rootShell(f, "node_c"), http.StatusForbidden, "PERMISSION_DENIED", "")
	}
	// Approving it again is CONFLICT, naming who decided.
	r = decide(b, "access.approve", admin2, id)
	wantCode(t, r, http.StatusConflict, "CONFLICT", "id")
	if !strings.Contains(r.Body["message"].(string), "is approved by token:") {
		t.Fatalf("a second approval: %v", r.Body)
	}
	// Its end holds on both at once.
	mu.Lock()
	now = approvedAt.Add(2*time.Minute - time.Second)
	mu.Unlock()
	for _, f := range []*fixture{a, b} {
		if r := rootShell(f, "node_a"); r.Code != http.StatusOK {
			t.Fatalf("a second before the end: %d %v", r.Code, r.Body)
		}
	}
	advance(time.Second)
	for _, f := range []*fixture{a, b} {
		r := rootShell(f, "node_a")
		wantCode(t, r, http.StatusForbidden, "PERMISSION_DENIED", "")
	}

	// Two admins approve one request at once: one wins.
	r = request(op, good)
	id2 := r.Body["id"].(string)
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i, f := range []*fixture{a, b} {
		wg.Go(func() { codes[i] = decide(f, "access.approve", []string{admin, admin2}[i], id2).Code })
	}
	wg.Wait()
	slices.Sort(codes)
	if !slices.Equal(codes, []int{http.StatusOK, http.StatusConflict}) {
		t.Fatalf("two admins approving at once: %v, want one 200 and one 409", codes)
	}
	advance(api.PolicyRefresh)
	for _, f := range []*fixture{a, b} {
		if r := rootShell(f, "node_a"); r.Code != http.StatusOK {
			t.Fatalf("after the race's approval: %d %v", r.Code, r.Body)
		}
	}
	// The requester gives it up through a: refused there at once, on b
	// within PolicyRefresh.
	if r := a.call("access.revoke", op, fmt.Sprintf(`{"id": %q, "reason": "done"}`, id2), peer); r.Code != http.StatusOK || r.Body["state"] != "revoked" {
		t.Fatalf("the requester's revoke: %d %v", r.Code, r.Body)
	}
	wantCode(t, rootShell(a, "node_a"), http.StatusForbidden, "PERMISSION_DENIED", "")
	advance(api.PolicyRefresh)
	wantCode(t, rootShell(b, "node_a"), http.StatusForbidden, "PERMISSION_DENIED", "")
	// An operator that is neither requester nor approver cannot revoke.
	r = request(op, good)
	id3 := r.Body["id"].(string)
	wantCode(t, b.call("access.revoke", op2, fmt.Sprintf(`{"id": %q}`, id3), peer), http.StatusForbidden, "PERMISSION_DENIED", "id")
	if r := b.call("access.deny", admin, fmt.Sprintf(`{"id": %q, "reason": "use the runbook"}`, id3), peer); r.Code != http.StatusOK ||
		r.Body["state"] != "denied" || r.Body["note"] != "use the runbook" {
		t.Fatalf("deny: %d %v", r.Code, r.Body)
	}

	// Another tenant's admin sees none of it.
	team, err := st.TenantCreate(ctx, &store.TenantCreateParams{Name: "team-x", ParentID: store.RootTenant})
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleAdmin, TenantID: team.ID})
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, decide(a, "access.approve", other, id3), http.StatusNotFound, "NOT_FOUND", "id")
	if r := a.call("access.list", other, `{}`, peer); r.Code != http.StatusOK || r.Body["requests"] != nil {
		t.Fatalf("another tenant's list: %d %v", r.Code, r.Body)
	}
	r = a.call("access.list", viewer, `{"state": "denied"}`, peer)
	if l, _ := r.Body["requests"].([]any); len(l) != 1 {
		t.Fatalf("the denied requests: %v", r.Body)
	}
	r = a.call("access.list", op, `{"mine": true}`, peer)
	if l, _ := r.Body["requests"].([]any); len(l) != 3 {
		t.Fatalf("the operator's own requests: %v", r.Body)
	}
	wantCode(t, a.call("access.list", op, `{"state": "gone"}`, peer), http.StatusBadRequest, "INVALID_ARGUMENT", "state")

	// Every step is an audit row and an event.
	for _, action := range []string{"access.request", "access.approve", "access.revoke", "access.deny"} {
		rows, err := st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: action, Outcome: "ok"})
		if err != nil || len(rows) == 0 {
			t.Errorf("no %s audit row: %v", action, err)
		}
	}
	entries, err := st.OutboxList(ctx, 0, store.MaxListLimit)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, e := range entries {
		seen[e.Topic] = true
	}
	for _, typ := range []string{events.AccessRequested, events.AccessApproved, events.AccessDenied, events.AccessRevoked} {
		if !seen[typ] {
			t.Errorf("no %s event", typ)
		}
	}
}

// TestAccessRequestBounds: one identity holds at most 20 pending requests
// (RESOURCE_EXHAUSTED), a policy whose request block is removed has no
// approvers (CONFLICT), and a grant's statements stop with it.
func TestAccessRequestBounds(t *testing.T) {
	f := newFixture(t)
	op := f.token(store.RoleOperator, 0)
	if r := f.call("policies.apply", f.admin, applyBody(t, accessDoc), peer); r.Code != http.StatusOK {
		t.Fatalf("policies.apply = %d %v", r.Code, r.Body)
	}
	body := `{"policy": "root-shell-pool-a", "duration": "600s", "reason": "x"}`
	var last string
	for range store.MaxPendingAccessRequests {
		r := f.call("access.request", op, body, peer)
		if r.Code != http.StatusOK {
			t.Fatalf("access.request = %d %v", r.Code, r.Body)
		}
		last = r.Body["id"].(string)
	}
	r := f.call("access.request", op, body, peer)
	wantCode(t, r, http.StatusTooManyRequests, "RESOURCE_EXHAUSTED", "")
	if !strings.Contains(r.Body["message"].(string), "20 access requests pending") {
		t.Fatalf("the 21st: %v", r.Body)
	}
	plain := "policies:\n  - name: root-shell-pool-a\n    bind: {roles: [viewer]}\n    statements: [{effect: allow, actions: [nodes.get]}]\n"
	if r := f.call("policies.apply", f.admin, applyBody(t, plain), peer); r.Code != http.StatusOK {
		t.Fatalf("policies.apply = %d %v", r.Code, r.Body)
	}
	wantCode(t, f.call("access.approve", f.admin, fmt.Sprintf(`{"id": %q}`, last), peer), http.StatusConflict, "CONFLICT", "id")
	// Its requester may still give it up.
	if r := f.call("access.revoke", op, fmt.Sprintf(`{"id": %q}`, last), peer); r.Code != http.StatusOK {
		t.Fatalf("revoke by the requester: %d %v", r.Code, r.Body)
	}
}

// TestAccessApprovalHeldToThePolicyNow: a request asked under a policy
// whose maxDuration has since shrunk cannot be approved (CONFLICT): an
// approval never grants more than the policy allows now.
func TestAccessApprovalHeldToThePolicyNow(t *testing.T) {
	st := sqlitetest.Open(t)
	a := &fixture{t: t, st: st, srv: api.New(api.Config{Secret: strings.Repeat("s", 32)}, st, nil)}
	admin, op := a.token(store.RoleAdmin, 0), a.token(store.RoleOperator, 0)
	if r := a.call("policies.apply", admin, applyBody(t, accessDoc), peer); r.Code != http.StatusOK {
		t.Fatalf("policies.apply = %d %v", r.Code, r.Body)
	}
	r := a.call("access.request", op, `{"policy": "root-shell-pool-a", "duration": "14400s", "reason": "four hours"}`, peer)
	if r.Code != http.StatusOK {
		t.Fatalf("access.request = %d %v", r.Code, r.Body)
	}
	id := r.Body["id"].(string)
	shorter := strings.Replace(accessDoc, "maxDuration: 4h", "maxDuration: 1h", 1)
	if r := a.call("policies.apply", admin, applyBody(t, shorter), peer); r.Code != http.StatusOK {
		t.Fatalf("policies.apply (1h) = %d %v", r.Code, r.Body)
	}
	r = a.call("access.approve", admin, fmt.Sprintf(`{"id": %q}`, id), peer)
	wantCode(t, r, http.StatusConflict, "CONFLICT", "id")
	if !strings.Contains(fmt.Sprint(r.Body["message"]), "more than policy") {
		t.Fatalf("approving a 4 h request under a 1 h policy: %v", r.Body)
	}
}
