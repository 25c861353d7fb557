package remediation

import (
	"context"
	"testing"

	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	"github.com/better-compute/better-compute/proto/bmcsecret"
)

// TestBMCAgentTenant: the BMC agent of a silent node, which is granted the
// node's BMC credentials, is a node of the node's own tenant or of the
// root's at its site, never another tenant's, even when another tenant's
// node is the only one, or the first by id, that runs bcx-ipmi
// (docs/tenants.md, "BMC agents").
func TestBMCAgentTenant(t *testing.T) {
	ctx := context.Background()
	st := sqlitetest.Open(t)
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	pools := map[string]string{} // tenant name: pool id
	for _, name := range []string{"team-a", "team-b", "team-a-child"} {
		parent := store.RootTenant
		if name == "team-a-child" {
			a, err := st.TenantGet(ctx, "team-a")
			if err != nil {
				t.Fatal(err)
			}
			parent = a.ID
		}
		ten, err := st.TenantCreate(ctx, &store.TenantCreateParams{Name: name, ParentID: parent})
		if err != nil {
			t.Fatal(err)
		}
		p, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p-" + name, SiteID: site.ID, TenantID: ten.ID})
		if err != nil {
			t.Fatal(err)
		}
		pools[name] = p.ID
	}
	rootPool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p-root", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	pools["root"] = rootPool.ID
	add := func(id, tenant string, agent bool) {
		t.Helper()
		if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: pools[tenant], Hostname: id, MachineID: id}); err != nil {
			t.Fatal(err)
		}
		if err := st.NodeSetState(ctx, id, store.NodeReady); err != nil {
			t.Fatal(err)
		}
		if agent {
			if err := st.NodeSetInventory(ctx, id, []byte(`{"plugins":[{"name":"ipmi","healthy":true}]}`), "d"); err != nil {
				t.Fatal(err)
			}
		}
	}
	add("node_target", "team-a", false)
	if err := st.SecretPut(ctx, &store.Secret{Name: bmcsecret.Name("node_target"), NodeID: "node_target", Sealed: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	want := func(step, agent string) {
		t.Helper()
		got, why, err := bmcAgent(ctx, st, "node_target")
		if err != nil || got != agent || (agent == "" && why == "") {
			t.Errorf("%s: agent %q (%q, %v), want %q", step, got, why, err, agent)
		}
	}
	add("node_1b", "team-b", true)
	want("only another tenant's node runs bcx-ipmi", "")
	add("node_2child", "team-a-child", true)
	want("and a child tenant's", "")
	add("node_5root", "root", true)
	want("a root node runs bcx-ipmi", "node_5root")
	add("node_3a", "team-a", true)
	want("a node of the target's own tenant too", "node_3a")
}
