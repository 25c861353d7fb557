package storetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// testTenants: the tree (migration 0024, docs/tenants.md): the root exists
// after migration and owns what is made without a tenant; a subtree's
// lists see only its rows; suspension and deletion stop the whole subtree;
// deletion is refused while nodes stay unless they move; the root can be
// neither suspended nor deleted.
func testTenants(ctx context.Context, t *testing.T, h *Harness) {
	root := must(h.Store.TenantGet(ctx, store.RootTenant))
	if root.Path != "root/" || root.ParentID != "" || root.Depth() != 0 {
		t.Fatalf("root = %+v", root)
	}
	a := must(h.Store.TenantCreate(ctx, &store.TenantCreateParams{Name: "team-a", ParentID: store.RootTenant}))
	a1 := must(h.Store.TenantCreate(ctx, &store.TenantCreateParams{Name: "team-a-ml", ParentID: a.ID}))
	b := must(h.Store.TenantCreate(ctx, &store.TenantCreateParams{Name: "team-b", ParentID: store.RootTenant}))
	if a1.Path != "root/"+a.ID+"/"+a1.ID+"/" || a1.ParentID != a.ID || a1.Depth() != 2 || !a1.Within(a.Path) || b.Within(a.Path) {
		t.Fatalf("child = %+v", a1)
	}
	_, err := h.Store.TenantCreate(ctx, &store.TenantCreateParams{Name: "team-a", ParentID: b.ID})
	wantErr(t, err, store.ErrConflict)
	_, err = h.Store.TenantCreate(ctx, &store.TenantCreateParams{Name: "x", ParentID: "ten_missing"})
	wantErr(t, err, store.ErrNotFound)
	if got := must(h.Store.TenantGet(ctx, "team-a-ml")); got.ID != a1.ID {
		t.Fatalf("get by name = %+v", got)
	}
	ids := func(ts []*store.Tenant) []string {
		var out []string
		for _, x := range ts {
			out = append(out, x.ID)
		}
		slices.Sort(out)
		return out
	}
	if got, want := ids(must(h.Store.TenantList(ctx, &store.ListParams{Within: a.Path}))), ids([]*store.Tenant{a, a1}); !slices.Equal(got, want) {
		t.Fatalf("tenants within a = %v, want %v", got, want)
	}
	if got := must(h.Store.TenantList(ctx, &store.ListParams{})); len(got) != 4 {
		t.Fatalf("every tenant = %d, want 4", len(got))
	}

	// Rows made without a tenant are the root's; lists within a subtree
	// see that subtree's rows only.
	old := fixture(ctx, t, h)
	if old.TenantID != store.RootTenant {
		t.Fatalf("pool without a tenant = %+v", old)
	}
	sa := must(h.Store.SiteCreate(ctx, &store.SiteCreateParams{Name: "site-a", Region: "eu-1", TenantID: a1.ID}))
	pa := must(h.Store.PoolCreate(ctx, &store.PoolCreateParams{Name: "pool-a", SiteID: sa.ID, TenantID: a1.ID}))
	if sa.TenantID != a1.ID || pa.TenantID != a1.ID || must(h.Store.SiteGet(ctx, sa.ID)).TenantID != a1.ID {
		t.Fatalf("site %+v, pool %+v", sa, pa)
	}
	if got := must(h.Store.PoolList(ctx, &store.ListParams{Within: a.Path})); len(got) != 1 || got[0].ID != pa.ID {
		t.Fatalf("pools within a = %+v", got)
	}
	if got := must(h.Store.SiteList(ctx, &store.ListParams{Within: b.Path})); len(got) != 0 {
		t.Fatalf("sites within b = %+v", got)
	}
	if got := must(h.Store.PoolList(ctx, &store.ListParams{Within: root.Path})); len(got) != 2 {
		t.Fatalf("pools within root = %d, want 2", len(got))
	}
	tok := &store.APIToken{ID: store.NewID("tok"), Role: store.RoleViewer, TenantID: a1.ID}
	check(t, h.Store.APITokenCreate(ctx, tok, []byte("tenant-token-hash-0123456789abcd")))
	if got := must(h.Store.APITokenBySecret(ctx, []byte("tenant-token-hash-0123456789abcd"))); got.TenantID != a1.ID {
		t.Fatalf("token tenant = %q", got.TenantID)
	}
	if got := must(h.Store.APITokenGet(ctx, tok.ID)); got.TenantID != a1.ID || got.Role != store.RoleViewer {
		t.Fatalf("token by id = %+v", got)
	}
	_, err = h.Store.APITokenGet(ctx, "tok_missing")
	wantErr(t, err, store.ErrNotFound)
	if got := must(h.Store.APITokenList(ctx, &store.ListParams{Within: b.Path})); len(got) != 0 {
		t.Fatalf("tokens within b = %+v", got)
	}
	must(h.Store.AuditInsert(ctx, &store.AuditEntry{Actor: "token:" + tok.ID, Action: "pools.get", Outcome: "ok", TenantID: a1.ID}))
	must(h.Store.AuditInsert(ctx, &store.AuditEntry{Actor: "token:x", Action: "pools.get", Outcome: "ok"}))
	if got := must(h.Store.AuditQuery(ctx, &store.AuditQueryParams{Within: a.Path})); len(got) != 1 || got[0].TenantID != a1.ID {
		t.Fatalf("audit within a = %+v", got)
	}

	// Suspension stops the subtree, resume restores it; the root refuses.
	_, err = h.Store.TenantSetSuspended(ctx, store.RootTenant, true)
	wantErr(t, err, store.ErrTenantRoot)
	_, err = h.Store.TenantDelete(ctx, &store.TenantDeleteParams{ID: store.RootTenant})
	wantErr(t, err, store.ErrTenantRoot)
	if got := must(h.Store.TenantSetSuspended(ctx, a.ID, true)); got.SuspendedAt == nil {
		t.Fatalf("suspended = %+v", got)
	}
	if got, want := must(h.Store.TenantsStopped(ctx)), ids([]*store.Tenant{a, a1}); !slices.Equal(got, want) {
		t.Fatalf("stopped = %v, want %v", got, want)
	}
	must(h.Store.TenantSetSuspended(ctx, a.ID, false))
	if got := must(h.Store.TenantsStopped(ctx)); len(got) != 0 {
		t.Fatalf("stopped after resume = %v", got)
	}

	// Deletion: refused while the subtree's pools hold nodes, unless
	// they move; the moved pool keeps its nodes.
	addNode(ctx, t, h, pa, "node-tenant-a")
	addNode(ctx, t, h, old, "node-root")
	must(h.Store.JoinTokenCreate(ctx, &store.JoinTokenCreateParams{ID: store.NewID("jt"), SecretHash: []byte("jt-a"), PoolID: pa.ID, MaxUses: 1, ExpiresAt: time.Now().Add(time.Hour)}))
	must(h.Store.JoinTokenCreate(ctx, &store.JoinTokenCreateParams{ID: store.NewID("jt"), SecretHash: []byte("jt-root"), PoolID: old.ID, MaxUses: 1, ExpiresAt: time.Now().Add(time.Hour)}))
	must(h.Store.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{"node-tenant-a", "node-root"}, Kind: "reboot", Timeout: time.Minute}))
	if got := must(h.Store.NodeList(ctx, &store.NodeListParams{ListParams: store.ListParams{Within: a.Path}})); len(got) != 1 || got[0].ID != "node-tenant-a" {
		t.Fatalf("nodes within a = %+v", got)
	}
	if got := must(h.Store.NodeList(ctx, &store.NodeListParams{})); len(got) != 2 {
		t.Fatalf("every node = %d, want 2", len(got))
	}
	if got := must(h.Store.CommandList(ctx, &store.CommandListParams{ListParams: store.ListParams{Within: a.Path}})); len(got) != 1 || got[0].NodeID != "node-tenant-a" {
		t.Fatalf("commands within a = %+v", got)
	}
	if got := must(h.Store.JoinTokenList(ctx, &store.ListParams{Within: a.Path})); len(got) != 1 || got[0].PoolID != pa.ID {
		t.Fatalf("join tokens within a = %+v", got)
	}
	if got := must(h.Store.JoinTokenList(ctx, &store.ListParams{Within: b.Path})); len(got) != 0 {
		t.Fatalf("join tokens within b = %+v", got)
	}
	_, err = h.Store.TenantDelete(ctx, &store.TenantDeleteParams{ID: a.ID})
	wantErr(t, err, store.ErrTenantHasNodes)
	_, err = h.Store.TenantDelete(ctx, &store.TenantDeleteParams{ID: a.ID, MoveNodesTo: a1.ID})
	wantErr(t, err, store.ErrConflict)
	del := must(h.Store.TenantDelete(ctx, &store.TenantDeleteParams{ID: a.ID, MoveNodesTo: b.ID}))
	if del.DeletedAt == nil {
		t.Fatalf("deleted = %+v", del)
	}
	if got := must(h.Store.PoolGet(ctx, pa.ID)); got.TenantID != b.ID {
		t.Fatalf("moved pool = %+v", got)
	}
	if got, want := must(h.Store.TenantsStopped(ctx)), ids([]*store.Tenant{a, a1}); !slices.Equal(got, want) {
		t.Fatalf("stopped after delete = %v, want %v", got, want)
	}
	_, err = h.Store.TenantGet(ctx, "team-a")
	wantErr(t, err, store.ErrNotFound)
	if got := must(h.Store.TenantGet(ctx, a.ID)); got.DeletedAt == nil {
		t.Fatalf("deleted by id = %+v", got)
	}
	_, err = h.Store.TenantSetSuspended(ctx, a1.ID, true)
	wantErr(t, err, store.ErrNotFound)
	_, err = h.Store.TenantCreate(ctx, &store.TenantCreateParams{Name: "under-deleted", ParentID: a1.ID})
	wantErr(t, err, store.ErrNotFound)
	// A deleted tenant's name is free again.
	must(h.Store.TenantCreate(ctx, &store.TenantCreateParams{Name: "team-a", ParentID: store.RootTenant}))

	// PoolMove moves a pool to a live tenant only.
	if got := must(h.Store.PoolMove(ctx, pa.ID, store.RootTenant)); got.TenantID != store.RootTenant {
		t.Fatalf("moved = %+v", got)
	}
	_, err = h.Store.PoolMove(ctx, pa.ID, a.ID)
	wantErr(t, err, store.ErrNotFound)
	_, err = h.Store.PoolMove(ctx, "pool_missing", b.ID)
	wantErr(t, err, store.ErrNotFound)
}

// testNodeMove: NodeMove puts a node into another tenant's pool, and so
// under that tenant's lists; a missing node or pool is ErrNotFound; a node
// out of service for an owner or holding a reservation slot that has not
// ended is ErrNodeHeld (an ErrConflict) and stays where it was.
func testNodeMove(ctx context.Context, t *testing.T, h *Harness) {
	st := h.Store
	a := must(st.TenantCreate(ctx, &store.TenantCreateParams{Name: "move-a", ParentID: store.RootTenant}))
	from := fixture(ctx, t, h)
	to := must(st.PoolCreate(ctx, &store.PoolCreateParams{Name: "pool-" + store.NewID("x"), SiteID: from.SiteID, TenantID: a.ID}))
	n := addNode(ctx, t, h, from, "node_move1")
	held := addNode(ctx, t, h, from, "node_move2")
	reserved := addNode(ctx, t, h, from, "node_move3")

	if got := must(st.NodeMove(ctx, n.ID, to.ID)); got.PoolID != to.ID {
		t.Fatalf("moved node = %+v", got)
	}
	if got := must(st.NodeList(ctx, &store.NodeListParams{ListParams: store.ListParams{Within: a.Path}})); len(got) != 1 || got[0].ID != n.ID {
		t.Fatalf("nodes within the new tenant = %+v", got)
	}
	_, err := st.NodeMove(ctx, "node_missing", to.ID)
	wantErr(t, err, store.ErrNotFound)
	_, err = st.NodeMove(ctx, n.ID, "pool_missing")
	wantErr(t, err, store.ErrNotFound)

	must(st.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: held.ID, Reason: store.DisruptionDraining, Owner: "operator:test"}))
	_, err = st.NodeMove(ctx, held.ID, to.ID)
	wantErr(t, err, store.ErrNodeHeld)
	wantErr(t, err, store.ErrConflict)
	check(t, st.DisruptionRelease(ctx, held.ID, "operator:test"))
	if got := must(st.NodeMove(ctx, held.ID, to.ID)); got.PoolID != to.ID {
		t.Fatalf("released node moved = %+v", got)
	}

	// A slot in the future holds the node too; a cancelled one does not.
	start := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	r := must(st.ReservationCreate(ctx, &store.ReservationCreateParams{PoolID: from.ID, GPUs: 1, Start: start, End: start.Add(time.Hour), Owner: "x"}))
	must(st.ReservationPlace(ctx, &store.ReservationPlaceParams{ID: r.ID, Slots: gpuSlots(reserved.ID, 0)}))
	_, err = st.NodeMove(ctx, reserved.ID, to.ID)
	wantErr(t, err, store.ErrNodeHeld)
	if got := must(st.NodeGet(ctx, reserved.ID)); got.PoolID != from.ID {
		t.Fatalf("held node moved anyway: %+v", got)
	}
	must(st.ReservationCancel(ctx, &store.ReservationCancelParams{ID: r.ID, Reason: "test"}))
	if got := must(st.NodeMove(ctx, reserved.ID, to.ID)); got.PoolID != to.ID {
		t.Fatalf("node of a cancelled reservation moved = %+v", got)
	}

	// An open remediation case holds the node, though it holds no
	// disruption (detected, or held by a tripped breaker): the case stays
	// its pool's, so the old tenant would act on a node now another's. The
	// error names the case; once it is closed the node moves.
	sick := addNode(ctx, t, h, from, "node_move4")
	c := must(st.RemediationCreate(ctx, &store.Remediation{NodeID: sick.ID, State: store.RemediationDetected, Finding: "xid",
		Resolution: "REBOOT", XID: 79, GPUUUID: "GPU-move4", Action: "reboot"}, "remediation:test"))
	_, err = st.NodeMove(ctx, sick.ID, to.ID)
	wantErr(t, err, store.ErrNodeHeld)
	wantErr(t, err, store.ErrConflict)
	var rem *store.NodeRemediatingError
	if !errors.As(err, &rem) || rem.CaseID != c.ID || rem.NodeID != sick.ID || rem.State != store.RemediationDetected {
		t.Fatalf("move of a node with an open case: %v, want a NodeRemediatingError naming %s", err, c.ID)
	}
	if got := must(st.NodeGet(ctx, sick.ID)); got.PoolID != from.ID {
		t.Fatalf("node with an open case moved anyway: %+v", got)
	}
	must(st.RemediationMove(ctx, &store.RemediationMoveParams{ID: c.ID, To: store.RemediationHeld, Actor: "remediation:test"}))
	_, err = st.NodeMove(ctx, sick.ID, to.ID)
	if !errors.As(err, &rem) || rem.CaseID != c.ID || rem.State != store.RemediationHeld {
		t.Fatalf("move of a node with a held case: %v, want a NodeRemediatingError naming %s", err, c.ID)
	}
	must(st.RemediationMove(ctx, &store.RemediationMoveParams{ID: c.ID, To: store.RemediationReturned, Actor: "remediation:test"}))
	if got := must(st.NodeMove(ctx, sick.ID, to.ID)); got.PoolID != to.ID {
		t.Fatalf("node whose case closed moved = %+v", got)
	}
}

// testIDWinsOverName: SiteGet, PoolGet and TenantGet take an id or a
// name; a row whose name is another row's id (made before the API refused
// such names, apiv1.CheckName) never stands in for that row, whatever
// plan the database picks: the shadowing row is written first, so that a
// sequential scan meets it first, and the tables are analyzed (on
// PostgreSQL a tiny analyzed table is scanned sequentially).
func testIDWinsOverName(ctx context.Context, t *testing.T, h *Harness) {
	st := h.Store
	mallory := must(st.TenantCreate(ctx, &store.TenantCreateParams{Name: "mallory", ParentID: store.RootTenant}))
	victimTenantID, victimSiteID, victimPoolID := store.NewID("ten"), store.NewID("site"), store.NewID("pool")

	shadowTenant := must(st.TenantCreate(ctx, &store.TenantCreateParams{Name: victimTenantID, ParentID: mallory.ID}))
	shadowSite := must(st.SiteCreate(ctx, &store.SiteCreateParams{Name: victimSiteID, Region: "eu-1", TenantID: mallory.ID}))
	shadowPool := must(st.PoolCreate(ctx, &store.PoolCreateParams{Name: victimPoolID, SiteID: shadowSite.ID, TenantID: mallory.ID}))

	victimTenant := must(st.TenantCreate(ctx, &store.TenantCreateParams{ID: victimTenantID, Name: "victim", ParentID: store.RootTenant}))
	victimSite := must(st.SiteCreate(ctx, &store.SiteCreateParams{ID: victimSiteID, Name: "victim-site", Region: "eu-1",
		TenantID: victimTenant.ID}))
	victimPool := must(st.PoolCreate(ctx, &store.PoolCreateParams{ID: victimPoolID, Name: "victim-pool", SiteID: victimSite.ID,
		TenantID: victimTenant.ID}))
	check(t, h.Exec(ctx, "ANALYZE tenants"))
	check(t, h.Exec(ctx, "ANALYZE sites"))
	check(t, h.Exec(ctx, "ANALYZE pools"))

	for range 3 { // on a fresh connection and on cached plans alike
		if got := must(st.PoolGet(ctx, victimPoolID)); got.ID != victimPool.ID || got.TenantID != victimTenant.ID {
			t.Fatalf("PoolGet(%s) = pool %s of tenant %s (named %q), want the victim's pool", victimPoolID, got.ID, got.TenantID, got.Name)
		}
		if got := must(st.SiteGet(ctx, victimSiteID)); got.ID != victimSite.ID || got.TenantID != victimTenant.ID {
			t.Fatalf("SiteGet(%s) = site %s of tenant %s (named %q), want the victim's site", victimSiteID, got.ID, got.TenantID, got.Name)
		}
		if got := must(st.TenantGet(ctx, victimTenantID)); got.ID != victimTenant.ID {
			t.Fatalf("TenantGet(%s) = tenant %s (named %q), want the victim", victimTenantID, got.ID, got.Name)
		}
	}
	// Each row is still found by its own id and by a name no id equals.
	if got := must(st.PoolGet(ctx, shadowPool.ID)); got.ID != shadowPool.ID {
		t.Fatalf("PoolGet(shadow's id) = %+v", got)
	}
	if got := must(st.PoolGet(ctx, "victim-pool")); got.ID != victimPool.ID {
		t.Fatalf("PoolGet(victim-pool) = %+v", got)
	}
	if got := must(st.SiteGet(ctx, shadowSite.ID)); got.ID != shadowSite.ID {
		t.Fatalf("SiteGet(shadow's id) = %+v", got)
	}
	if got := must(st.TenantGet(ctx, shadowTenant.ID)); got.ID != shadowTenant.ID {
		t.Fatalf("TenantGet(shadow's id) = %+v", got)
	}
}
