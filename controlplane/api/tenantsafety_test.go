package api

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// tenantPair is a store with two tenants a and b, each with a pool at one
// site and a node in it, and an admin and an operator of each.
type tenantPair struct {
	st             store.Store
	exec           func(ctx context.Context, sql string) error
	s              *Server
	a, b           *store.Tenant
	poolA, poolB   *store.Pool
	adminA, adminB *iam.Principal
	opA, opB       *iam.Principal
	root           *iam.Principal
}

func newTenantPair(t *testing.T) *tenantPair {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	st, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	x := &tenantPair{st: st, exec: sqlitetest.Exec(path), s: &Server{store: st}}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	x.a, err = st.TenantCreate(ctx, &store.TenantCreateParams{Name: "team-a", ParentID: store.RootTenant})
	must(err)
	x.b, err = st.TenantCreate(ctx, &store.TenantCreateParams{Name: "team-b", ParentID: store.RootTenant})
	must(err)
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s1", Region: "eu-1"})
	must(err)
	x.poolA, err = st.PoolCreate(ctx, &store.PoolCreateParams{Name: "gpu-a", SiteID: site.ID, TenantID: x.a.ID})
	must(err)
	x.poolB, err = st.PoolCreate(ctx, &store.PoolCreateParams{Name: "gpu-b", SiteID: site.ID, TenantID: x.b.ID})
	must(err)
	for id, pool := range map[string]*store.Pool{"node_a1": x.poolA, "node_b1": x.poolB} {
		_, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: pool.ID, Hostname: id, MachineID: "m-" + id})
		must(err)
	}
	x.adminA = &iam.Principal{TokenID: "tok_aa", Role: store.RoleAdmin, TenantID: x.a.ID, TenantPath: x.a.Path}
	x.adminB = &iam.Principal{TokenID: "tok_ba", Role: store.RoleAdmin, TenantID: x.b.ID, TenantPath: x.b.Path}
	x.opA = &iam.Principal{TokenID: "tok_ao", Role: store.RoleOperator, TenantID: x.a.ID, TenantPath: x.a.Path}
	x.opB = &iam.Principal{TokenID: "tok_bo", Role: store.RoleOperator, TenantID: x.b.ID, TenantPath: x.b.Path}
	x.root = &iam.Principal{TokenID: "tok_r", Role: store.RoleAdmin, TenantID: store.RootTenant, TenantPath: store.RootTenant + "/"}
	return x
}

// wantCode fails t unless err is an *Error with code (and field, when
// given) whose message holds each of parts.
func wantCode(t *testing.T, what string, err error, code, field string, parts ...string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) || e.Code != code || field != "" && e.Field != field {
		t.Fatalf("%s: error = %v, want %s on %q", what, err, code, field)
	}
	for _, p := range parts {
		if !strings.Contains(e.Message, p) {
			t.Fatalf("%s: message %q does not name %q", what, e.Message, p)
		}
	}
}

// TestNameShapedLikeIDRefused: pools.create, sites.create and
// tenants.create refuse a name shaped like an id (a tenant admin naming
// its pool after another tenant's pool id would otherwise make that id
// ambiguous), INVALID_ARGUMENT naming the rule; the victim's pool stays
// the one its id finds.
func TestNameShapedLikeIDRefused(t *testing.T) {
	ctx := context.Background()
	x := newTenantPair(t)
	if _, err := x.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "site-a", Region: "eu-1", TenantID: x.a.ID}); err != nil {
		t.Fatal(err)
	}
	_, err := x.s.poolsCreate(ctx, x.adminA, &apiv1.CreatePoolRequest{Name: x.poolB.ID, Site: "site-a"})
	wantCode(t, "pools.create named like another tenant's pool id", err, apiv1.CodeInvalidArgument, "name", "shaped like an id")
	if got, err := x.st.PoolGet(ctx, x.poolB.ID); err != nil || got.ID != x.poolB.ID {
		t.Fatalf("PoolGet(victim id) = %+v, %v", got, err)
	}
	_, err = x.s.poolsCreate(ctx, x.root, &apiv1.CreatePoolRequest{Name: store.NewID("pool"), Site: "s1"})
	wantCode(t, "pools.create by root with an id-shaped name", err, apiv1.CodeInvalidArgument, "name", "shaped like an id")
	_, err = x.s.sitesCreate(ctx, x.adminA, &apiv1.CreateSiteRequest{Name: store.NewID("site"), Region: "eu-1"})
	wantCode(t, "sites.create with an id-shaped name", err, apiv1.CodeInvalidArgument, "name", "shaped like an id")
	_, err = x.s.tenantsCreate(ctx, x.adminA, &apiv1.CreateTenantRequest{Name: x.b.ID})
	wantCode(t, "tenants.create with an id-shaped name", err, apiv1.CodeInvalidArgument, "name", "shaped like an id")
	// Names as before still work.
	if _, err := x.s.poolsCreate(ctx, x.adminA, &apiv1.CreatePoolRequest{Name: "gpu-a2", Site: "site-a"}); err != nil {
		t.Fatalf("pools.create gpu-a2: %v", err)
	}
}

// TestNodeMoveOpenRemediation: nodes.move of a node with an open
// remediation case (detected: no disruption yet) is CONFLICT naming the
// case and how to close it, and the node stays; once the case is
// returned it moves.
func TestNodeMoveOpenRemediation(t *testing.T) {
	ctx := context.Background()
	x := newTenantPair(t)
	c, err := x.st.RemediationCreate(ctx, &store.Remediation{NodeID: "node_a1", State: store.RemediationDetected, Finding: "xid",
		Resolution: "REBOOT", XID: 79, Action: "reboot"}, "remediation:test")
	if err != nil {
		t.Fatal(err)
	}
	_, err = x.s.nodesMove(ctx, x.root, &apiv1.MoveNodeRequest{Id: "node_a1", Tenant: "team-b"})
	wantCode(t, "nodes.move with an open case", err, apiv1.CodeConflict, "id", c.ID, "remediation return "+c.ID, "detected")
	if n, err := x.st.NodeGet(ctx, "node_a1"); err != nil || n.PoolID != x.poolA.ID {
		t.Fatalf("node after a refused move = %+v, %v", n, err)
	}
	if _, err := x.st.RemediationMove(ctx, &store.RemediationMoveParams{ID: c.ID, To: store.RemediationReturned, Actor: "t"}); err != nil {
		t.Fatal(err)
	}
	if r, err := x.s.nodesMove(ctx, x.root, &apiv1.MoveNodeRequest{Id: "node_a1", Tenant: "team-b"}); err != nil ||
		r.GetNode().GetPoolId() != x.poolB.ID {
		t.Fatalf("nodes.move once the case closed = %+v, %v", r, err)
	}
}

// TestRemediationSeenNodesCurrentPool: a case whose node now sits in
// another tenant's pool (a case opened while its node moved, or left from
// a build that moved nodes with open cases) is NOT_FOUND to the old
// tenant's operator for pause, resume and return: a return with reboot
// would reboot the other tenant's node. The root may still act on it.
func TestRemediationSeenNodesCurrentPool(t *testing.T) {
	ctx := context.Background()
	x := newTenantPair(t)
	c, err := x.st.RemediationCreate(ctx, &store.Remediation{NodeID: "node_a1", State: store.RemediationDetected, Finding: "xid",
		Resolution: "REBOOT", XID: 79, Action: "reboot"}, "remediation:test")
	if err != nil {
		t.Fatal(err)
	}
	// Before the node left, A's operator sees its case.
	if err := x.s.remediationSeen(ctx, x.opA, c.ID); err != nil {
		t.Fatalf("remediationSeen by A before the move: %v", err)
	}
	if err := x.exec(ctx, `UPDATE nodes SET pool_id = '`+x.poolB.ID+`' WHERE id = 'node_a1'`); err != nil {
		t.Fatal(err)
	}
	for _, op := range []struct {
		name string
		call func(p *iam.Principal) error
	}{
		{"remediation.pause", func(p *iam.Principal) error {
			_, err := x.s.remediationPause(true)(ctx, p, &apiv1.RemediationRequest{Id: c.ID})
			return err
		}},
		{"remediation.resume", func(p *iam.Principal) error {
			_, err := x.s.remediationPause(false)(ctx, p, &apiv1.RemediationRequest{Id: c.ID})
			return err
		}},
		{"remediation.return --reboot", func(p *iam.Principal) error {
			_, err := x.s.remediationReturn(ctx, p, &apiv1.ReturnRemediationRequest{Id: c.ID, Reboot: true})
			return err
		}},
	} {
		for who, p := range map[string]*iam.Principal{"A's operator (the case's pool)": x.opA, "B's operator (the node's pool)": x.opB} {
			wantCode(t, op.name+" by "+who, op.call(p), apiv1.CodeNotFound, "id", "no open remediation "+c.ID)
		}
	}
	if got, err := x.st.RemediationGet(ctx, c.ID); err != nil || got.Paused || got.State != store.RemediationDetected {
		t.Fatalf("case after the refused calls = %+v, %v", got, err)
	}
	if _, err := x.s.remediationPause(true)(ctx, x.root, &apiv1.RemediationRequest{Id: c.ID}); err != nil {
		t.Fatalf("remediation.pause by root: %v", err)
	}
}

// TestCommandsCreateOtherTenantsNode: commands.create naming a node of
// another tenant answers exactly as for a node that does not exist: one
// NOT_FOUND naming the two together, whatever else the list holds, so
// that it tells nothing of which ids exist elsewhere.
func TestCommandsCreateOtherTenantsNode(t *testing.T) {
	ctx := context.Background()
	x := newTenantPair(t)
	for _, kind := range []string{sessionv1.KindExec, sessionv1.KindReboot} {
		req := func(ids ...string) *apiv1.CreateCommandsRequest {
			r := &apiv1.CreateCommandsRequest{NodeIds: ids, Kind: kind}
			if kind == sessionv1.KindExec {
				r.Exec = &apiv1.ExecSpec{Argv: []string{"true"}}
			}
			return r
		}
		_, err := x.s.targets(ctx, x.opA, req("node_a1", "node_b1", "node_nope"))
		wantCode(t, kind+": own, other's and missing", err, apiv1.CodeNotFound, "nodeIds", "no node node_b1, node_nope")
		_, err = x.s.targets(ctx, x.opA, req("node_b1", "node_a1"))
		wantCode(t, kind+": own and other's", err, apiv1.CodeNotFound, "nodeIds", "no node node_b1")
		_, errOther := x.s.targets(ctx, x.opA, req("node_a1", "node_b1"))
		_, errMissing := x.s.targets(ctx, x.opA, req("node_a1", "node_b2"))
		if errOther == nil || errMissing == nil ||
			errOther.Error() != strings.Replace(errMissing.Error(), "node_b2", "node_b1", 1) {
			t.Fatalf("%s: another tenant's node answered %v, a missing one %v: they must read alike", kind, errOther, errMissing)
		}
		if ids, err := x.s.targets(ctx, x.opA, req("node_a1")); err != nil || len(ids) != 1 {
			t.Fatalf("%s: own node = %v, %v", kind, ids, err)
		}
		// The root sees both nodes and names the missing one only.
		_, err = x.s.targets(ctx, x.root, req("node_a1", "node_b1", "node_nope"))
		wantCode(t, kind+": root", err, apiv1.CodeNotFound, "nodeIds", "no node node_nope")
	}
}
