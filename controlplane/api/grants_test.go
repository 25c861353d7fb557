package api

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// TestReservationAccessGrant: a reservation granting shell to tenant A
// gives A's operator (and an operator of A's parent) a shell on exactly
// its node for exactly its window: not before the start, not after the
// end, not on another node, not port-forward, nothing to a viewer of A
// or to an operator of another tenant; a cancel ends it at once and an
// extend moves its end. nodeFor finds the node through the grant, and
// only then.
func TestReservationAccessGrant(t *testing.T) {
	ctx := context.Background()
	st := sqlitetest.Open(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s1", Region: "eu-1"})
	must(err)
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "gpu", SiteID: site.ID})
	must(err)
	for _, id := range []string{"node_r", "node_u"} {
		_, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: pool.ID, Hostname: id, MachineID: "m-" + id})
		must(err)
	}
	parent, err := st.TenantCreate(ctx, &store.TenantCreateParams{Name: "parent", ParentID: store.RootTenant})
	must(err)
	a, err := st.TenantCreate(ctx, &store.TenantCreateParams{Name: "team-a", ParentID: parent.ID})
	must(err)
	b, err := st.TenantCreate(ctx, &store.TenantCreateParams{Name: "team-b", ParentID: store.RootTenant})
	must(err)
	t0 := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	res, err := st.ReservationCreate(ctx, &store.ReservationCreateParams{PoolID: pool.ID, GPUs: 1, Start: t0, End: t0.Add(time.Hour),
		Owner: "team-a", TenantID: a.ID, Grants: []string{store.GrantShell}, CreatedBy: "token:t"})
	must(err)
	_, err = st.ReservationPlace(ctx, &store.ReservationPlaceParams{ID: res.ID,
		Slots: []*store.ReservationSlot{{NodeID: "node_r", GPU: 0, GPUUUID: "GPU-0"}}})
	must(err)

	var now time.Time
	s := &Server{store: st, cfg: Config{Now: func() time.Time { return now }}}
	opA := &iam.Principal{TokenID: "tok_a", Role: store.RoleOperator, TenantID: a.ID, TenantPath: a.Path}
	adminA := &iam.Principal{TokenID: "tok_aa", Role: store.RoleAdmin, TenantID: a.ID, TenantPath: a.Path}
	opParent := &iam.Principal{TokenID: "tok_p", Role: store.RoleOperator, TenantID: parent.ID, TenantPath: parent.Path}
	viewerA := &iam.Principal{TokenID: "tok_v", Role: store.RoleViewer, TenantID: a.ID, TenantPath: a.Path}
	opB := &iam.Principal{TokenID: "tok_b", Role: store.RoleOperator, TenantID: b.ID, TenantPath: b.Path}

	during := t0.Add(30 * time.Minute)
	for _, c := range []struct {
		name  string
		p     *iam.Principal
		node  string
		right string
		at    time.Time
		want  bool
	}{
		{"before the start", opA, "node_r", store.GrantShell, t0.Add(-time.Second), false},
		{"at the start", opA, "node_r", store.GrantShell, t0, true},
		{"during", opA, "node_r", store.GrantShell, during, true},
		{"an admin of the holder", adminA, "node_r", store.GrantShell, during, true},
		{"an operator of the holder's parent", opParent, "node_r", store.GrantShell, during, true},
		{"at the end", opA, "node_r", store.GrantShell, t0.Add(time.Hour), false},
		{"after the end", opA, "node_r", store.GrantShell, t0.Add(2 * time.Hour), false},
		{"another node", opA, "node_u", store.GrantShell, during, false},
		{"a right not granted", opA, "node_r", store.GrantPortForward, during, false},
		{"a viewer of the holder", viewerA, "node_r", store.GrantShell, during, false},
		{"another tenant's operator", opB, "node_r", store.GrantShell, during, false},
	} {
		g, err := s.granted(ctx, c.p, c.node, c.right, c.at)
		must(err)
		if (g != nil) != c.want {
			t.Errorf("%s: granted = %+v, want %v", c.name, g, c.want)
		}
		if g != nil && (g.ReservationID != res.ID || !g.End.Equal(t0.Add(time.Hour))) {
			t.Errorf("%s: grant %+v, want reservation %s ending %v", c.name, g, res.ID, t0.Add(time.Hour))
		}
		// nodeFor: the node through the grant, else NOT_FOUND as before.
		now = c.at
		n, g2, err := s.nodeFor(ctx, c.p, c.node, c.right)
		switch {
		case c.want && (err != nil || n == nil || g2 == nil):
			t.Errorf("%s: nodeFor = %v, %+v, %v; want the node through the grant", c.name, n, g2, err)
		case !c.want && !isNotFound(err):
			t.Errorf("%s: nodeFor err = %v, want NOT_FOUND", c.name, err)
		}
	}

	// Extended: the rights last to the new end.
	_, err = st.ReservationExtend(ctx, &store.ReservationExtendParams{ID: res.ID, End: t0.Add(2 * time.Hour)})
	must(err)
	if g, err := s.granted(ctx, opA, "node_r", store.GrantShell, t0.Add(90*time.Minute)); err != nil || g == nil || !g.End.Equal(t0.Add(2*time.Hour)) {
		t.Fatalf("after extend: granted = %+v, %v; want the grant to the new end", g, err)
	}
	// Cancelled during the window: the rights end at the cancel.
	cancelAt := t0.Add(10 * time.Minute)
	_, err = st.ReservationCancel(ctx, &store.ReservationCancelParams{ID: res.ID, Now: &cancelAt})
	must(err)
	if g, err := s.granted(ctx, opA, "node_r", store.GrantShell, t0.Add(11*time.Minute)); err != nil || g != nil {
		t.Fatalf("after cancel: granted = %+v, %v; want none", g, err)
	}
}

// TestCheckGrants: grants are a bounded set of shell, port-forward and
// exec, each at most once; anything else is INVALID_ARGUMENT naming the
// field.
func TestCheckGrants(t *testing.T) {
	if got, err := checkGrants([]string{"shell", "exec"}); err != nil || len(got) != 2 || got[0] != "exec" {
		t.Fatalf("checkGrants(shell, exec) = %v, %v", got, err)
	}
	for _, bad := range [][]string{{"root"}, {"shell", "shell"}, {"", "shell"}, {"shell", "exec", "port-forward", "x"}} {
		_, err := checkGrants(bad)
		if e, ok := err.(*Error); !ok || e.Field != "grants" {
			t.Errorf("checkGrants(%q) = %v, want INVALID_ARGUMENT on grants", bad, err)
		}
	}
}

// TestSubtreeLeftEndsTunnel: a tunnel a tenant's operator opened on a node
// of its own pool holds while the pool is the tenant's, and ends (with the
// reason checkLive closes it with) once the pool is moved to another
// tenant.
func TestSubtreeLeftEndsTunnel(t *testing.T) {
	ctx := context.Background()
	st := sqlitetest.Open(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	a, err := st.TenantCreate(ctx, &store.TenantCreateParams{Name: "team-a", ParentID: store.RootTenant})
	must(err)
	b, err := st.TenantCreate(ctx, &store.TenantCreateParams{Name: "team-b", ParentID: store.RootTenant})
	must(err)
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s1", Region: "eu-1"})
	must(err)
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "gpu-a", SiteID: site.ID, TenantID: a.ID})
	must(err)
	_, err = st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node_a", PoolID: pool.ID, Hostname: "a", MachineID: "m-a"})
	must(err)
	s := &Server{store: st}
	opA := &iam.Principal{TokenID: "tok_a", Role: store.RoleOperator, TenantID: a.ID, TenantPath: a.Path}
	c := &liveCall{caller: opA, nodeID: "node_a"}
	if why := s.subtreeLeft(ctx, c); why != "" {
		t.Fatalf("the tenant's own node: %q, want it to hold", why)
	}
	_, err = st.PoolMove(ctx, pool.ID, b.ID)
	must(err)
	if why := s.subtreeLeft(ctx, c); !strings.Contains(why, "no longer in tenant "+a.ID) {
		t.Fatalf("after the pool moved to another tenant: %q, want the access ended", why)
	}
}
