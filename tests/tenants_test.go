package tests

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// Issue 45, "Tenants": real processes on PostgreSQL.

// tenantStopWithin is how soon a suspension must reach every api process
// (issue 45; docs/tenants.md).
const tenantStopWithin = 10 * time.Second

// TestTenantSuspensionEndsChildCalls: on split roles (PostgreSQL) with two
// api processes, a pool moved into a child tenant (pools.move, audited)
// is the child's operator's to see and act on through api 2, and another
// tenant's operator is told NOT_FOUND for it. Suspending the child's
// parent through api 1 ends the child token's event stream and port
// forward (a tunnel, as a shell is) held by api 2 within 10 s, each CLI
// with one line naming the tenant, closes the forwarded connection, and
// refuses the child's token on api 2 within 10 s although api 2 cached it;
// resume restores the token. The node keeps its session throughout.
func TestTenantSuspensionEndsChildCalls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newSplitDeploymentWith(t, 1, 0, internalAPIConfig(t))
	api2 := "http://" + d.start("api-2", "api").WaitLine(`msg="API listening" addr=(\S+)`, 60*time.Second)[1]
	m, nodeID := d.joinMachine("tenant-calls", d.gateways[0])
	bcd := m.node()
	d.waitSession(nodeID, d.gateways[0])
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bcd's output:\n%s", bcd.Output())
		}
	})

	parent, err := d.admin.TenantsCreate(ctx, &apiv1.CreateTenantRequest{Name: "parent"})
	if err != nil {
		t.Fatal(err)
	}
	child, err := d.admin.TenantsCreate(ctx, &apiv1.CreateTenantRequest{Name: "child", Parent: parent.Id})
	if err != nil {
		t.Fatal(err)
	}
	other, err := d.admin.TenantsCreate(ctx, &apiv1.CreateTenantRequest{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	if child.ParentId != parent.Id || other.ParentId != store.RootTenant {
		t.Fatalf("child %+v, other %+v", child, other)
	}
	n, err := d.st.NodeGet(ctx, nodeID)
	if err != nil {
		t.Fatal(err)
	}
	moved, err := d.admin.PoolsMove(ctx, &apiv1.MovePoolRequest{Pool: n.PoolID, Tenant: "child"})
	if err != nil || moved.TenantId != child.Id {
		t.Fatalf("pools.move = %+v, %v", moved, err)
	}
	if rows, err := d.st.AuditQuery(ctx, &store.AuditQueryParams{ActionPrefix: "pools.move", Resource: n.PoolID}); err != nil || len(rows) != 1 || rows[0].Outcome != "ok" {
		t.Fatalf("pools.move audit rows = %+v, %v", rows, err)
	}
	tokenOf := func(tenant string) (*client.Client, string) {
		resp, err := d.admin.TokensCreate(ctx, &apiv1.CreateAPITokenRequest{Role: store.RoleOperator, Tenant: tenant, Description: "tenant " + tenant})
		if err != nil {
			t.Fatal(err)
		}
		if resp.ApiToken.TenantId != tenant {
			t.Fatalf("token of %s = %+v", tenant, resp.ApiToken)
		}
		return &client.Client{BaseURL: api2 + "/api", Token: resp.Token}, resp.ApiToken.Id
	}
	childAPI, childTokID := tokenOf(child.Id)
	// A second token of the child, with nothing open: api 2 has its
	// decision cached (30 s), and only the stopped-tenant check ends it.
	childIdle, _ := tokenOf(child.Id)
	otherAPI, _ := tokenOf(other.Id)
	for _, c := range []*client.Client{childAPI, childIdle} {
		if _, err := c.NodesGet(ctx, &apiv1.NodeRequest{Id: nodeID}); err != nil {
			t.Fatalf("the child's operator reads its node through api 2: %v", err)
		}
	}
	_, err = otherAPI.NodesGet(ctx, &apiv1.NodeRequest{Id: nodeID})
	if ae := (*client.Error)(nil); !errors.As(err, &ae) || ae.Code != apiv1.CodeNotFound {
		t.Fatalf("another tenant's operator reads the node: %v, want NOT_FOUND", err)
	}
	pools, err := otherAPI.PoolsList(ctx, &apiv1.ListPoolsRequest{})
	if err != nil || len(pools.Pools) != 0 {
		t.Fatalf("another tenant's pools.list = %+v, %v; want none", pools, err)
	}
	// A command of the child's operator: the other tenant neither lists,
	// reads nor cancels it, nor runs one on the child's node.
	cmds, err := childAPI.CommandsCreate(ctx, &apiv1.CreateCommandsRequest{NodeIds: []string{nodeID}, Kind: "exec", Exec: &apiv1.ExecSpec{Argv: []string{"true"}}})
	if err != nil || len(cmds.Commands) != 1 {
		t.Fatalf("the child's commands.create = %+v, %v", cmds, err)
	}
	if list, err := childAPI.CommandsList(ctx, &apiv1.ListCommandsRequest{}); err != nil || len(list.Commands) != 1 {
		t.Fatalf("the child's commands.list = %+v, %v; want its one command", list, err)
	}
	if list, err := otherAPI.CommandsList(ctx, &apiv1.ListCommandsRequest{}); err != nil || len(list.Commands) != 0 {
		t.Fatalf("another tenant's commands.list = %+v, %v; want none", list, err)
	}
	if list, err := otherAPI.NodesList(ctx, &apiv1.ListNodesRequest{}); err != nil || len(list.Nodes) != 0 {
		t.Fatalf("another tenant's nodes.list = %+v, %v; want none", list, err)
	}
	for what, call := range map[string]func() error{
		"commands.get": func() error {
			_, err := otherAPI.CommandsGet(ctx, &apiv1.GetCommandRequest{Id: cmds.Commands[0].Id})
			return err
		},
		"commands.cancel": func() error {
			_, err := otherAPI.CommandsCancel(ctx, &apiv1.CancelCommandRequest{Id: cmds.Commands[0].Id})
			return err
		},
		"commands.create": func() error {
			_, err := otherAPI.CommandsCreate(ctx, &apiv1.CreateCommandsRequest{NodeIds: []string{nodeID}, Kind: "exec", Exec: &apiv1.ExecSpec{Argv: []string{"true"}}})
			return err
		},
		"nodes.cordon": func() error { _, err := otherAPI.NodesCordon(ctx, &apiv1.NodeRequest{Id: nodeID}); return err },
		"tunnels.create": func() error {
			_, err := otherAPI.TunnelsCreate(ctx, &apiv1.CreateTunnelRequest{Node: nodeID, Kind: "shell"})
			return err
		},
		"pools.get": func() error { _, err := otherAPI.PoolsGet(ctx, &apiv1.PoolRequest{Pool: n.PoolID}); return err },
	} {
		err := call()
		if ae := (*client.Error)(nil); !errors.As(err, &ae) || ae.Code != apiv1.CodeNotFound {
			t.Errorf("another tenant's %s of the child's resource: %v, want NOT_FOUND", what, err)
		}
	}

	env := []string{"BETTER_COMPUTE_URL=" + api2, "BETTER_COMPUTE_TOKEN=" + childAPI.Token}
	watch := testenv.Start(t, env, d.bin, "events", "watch")
	eventually(t, 30*time.Second, func() bool {
		for _, m := range []string{"nodes.cordon", "nodes.uncordon"} {
			if err := d.admin.Call(ctx, m, &apiv1.NodeRequest{Id: nodeID}, &apiv1.NodeResponse{}); err != nil {
				t.Fatal(err)
			}
		}
		_, err := watch.Await(regexp.QuoteMeta(nodeID), time.Second)
		return err == nil
	}, func() string { return "events watch never printed an event of the node:\n" + watch.Output() })
	echo := echoServer(t)
	pf := testenv.Start(t, env, d.bin, "nodes", "port-forward", nodeID, fmt.Sprintf("0:%d", echo))
	conn := forwardedEcho(t, pf.WaitLine(`Forwarding (127\.0\.0\.1:\d+) ->`, 30*time.Second)[1])

	start := time.Now()
	if _, err := d.admin.TenantsSuspend(ctx, &apiv1.TenantRequest{Tenant: parent.Id}); err != nil {
		t.Fatal(err)
	}
	want := "credential revoked: the tenant of API token " + childTokID + " is suspended or deleted"
	wantEndedWithin(t, "events watch", watch, start, want, tenantStopWithin)
	wantEndedWithin(t, "nodes port-forward", pf, start, want, tenantStopWithin)
	conn.SetReadDeadline(start.Add(2 * tenantStopWithin))
	if _, err := conn.Read(make([]byte, 1)); err == nil || time.Since(start) > tenantStopWithin {
		t.Fatalf("the forwarded connection: read %v after %v, want closed within %v", err, time.Since(start), tenantStopWithin)
	}
	for _, c := range []*client.Client{childAPI, childIdle} {
		refusedAt := waitTenantToken(t, c, nodeID, false)
		if took := refusedAt.Sub(start); took > tenantStopWithin {
			t.Fatalf("the child's token was refused on api 2 %v after the suspension, want within %v", took, tenantStopWithin)
		} else {
			t.Logf("a child's token refused on api 2 %v after the parent's suspension", took.Round(time.Millisecond))
		}
	}
	got, err := d.admin.TenantsGet(ctx, &apiv1.TenantRequest{Tenant: child.Id})
	if err != nil || !got.Suspended || got.SuspendTime != nil {
		t.Fatalf("the child under a suspended parent = %+v, %v; want suspended (from above)", got, err)
	}
	if _, err := d.st.SessionGet(ctx, nodeID); err != nil {
		t.Fatalf("the node's session after the suspension: %v", err)
	}

	start = time.Now()
	if _, err := d.admin.TenantsResume(ctx, &apiv1.TenantRequest{Tenant: parent.Id}); err != nil {
		t.Fatal(err)
	}
	if took := waitTenantToken(t, childAPI, nodeID, true).Sub(start); took > tenantStopWithin {
		t.Fatalf("the child's token worked again on api 2 %v after resume, want within %v", took, tenantStopWithin)
	}
	// A tenant that owns nodes is deleted only with its nodes moved.
	_, err = d.admin.TenantsDelete(ctx, &apiv1.DeleteTenantRequest{Tenant: parent.Id})
	if ae := (*client.Error)(nil); !errors.As(err, &ae) || ae.Code != apiv1.CodeConflict {
		t.Fatalf("deleting a tenant that owns nodes: %v, want CONFLICT", err)
	}
	if _, err := d.admin.TenantsDelete(ctx, &apiv1.DeleteTenantRequest{Tenant: parent.Id, MoveNodesTo: store.RootTenant}); err != nil {
		t.Fatal(err)
	}
	if p, err := d.st.PoolGet(ctx, n.PoolID); err != nil || p.TenantID != store.RootTenant {
		t.Fatalf("the pool after its tenant's deletion = %+v, %v", p, err)
	}
}

// waitTenantToken calls nodes.get with c until it works (ok) or is refused
// UNAUTHENTICATED (!ok), and returns when it first did.
func waitTenantToken(t *testing.T, c *client.Client, nodeID string, ok bool) time.Time {
	t.Helper()
	var at time.Time
	eventually(t, 3*tenantStopWithin, func() bool {
		_, err := c.NodesGet(context.Background(), &apiv1.NodeRequest{Id: nodeID})
		var ae *client.Error
		if (ok && err == nil) || (!ok && errors.As(err, &ae) && ae.Code == apiv1.CodeUnauthenticated) {
			at = time.Now()
			return true
		}
		return false
	}, func() string { return fmt.Sprintf("the child's token never turned ok=%v", ok) })
	return at
}

// wantEndedWithin checks that p exits 1 within limit of start with
// exactly one line holding want.
func wantEndedWithin(t *testing.T, what string, p *testenv.Proc, start time.Time, want string, limit time.Duration) {
	t.Helper()
	code := p.Wait(3 * limit)
	took := time.Since(start)
	t.Logf("%s ended %v after the suspension (exit %d)", what, took.Round(time.Millisecond), code)
	if n := strings.Count(p.Output(), want); code != 1 || n != 1 || took > limit {
		t.Fatalf("%s: exit %d after %v, %d lines holding %q; want exit 1 within %v, one such line:\n%s", what, code, took, n, want, limit, p.Output())
	}
}
