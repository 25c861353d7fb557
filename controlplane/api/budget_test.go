package api_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/better-compute/better-compute/controlplane/store"
)

// TestPoolBudgetAndDrain: pools.get shows the budget and its counts,
// pools.setBudget changes it (bad values refused, nothing changed), and an
// operator's drain takes a budget slot: the drain past the budget is
// refused with CONFLICT naming the count, an uncordon frees the slot.
func TestPoolBudgetAndDrain(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	site, err := f.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "ams-1", Region: "eu-1"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := f.st.PoolCreate(ctx, &store.PoolCreateParams{Name: "gpu", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if _, err := f.st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: fmt.Sprintf("node_b%d", i), PoolID: pool.ID,
			Hostname: fmt.Sprintf("b%d", i), MachineID: fmt.Sprintf("m%d", i)}); err != nil {
			t.Fatal(err)
		}
		if err := f.st.NodeSetState(ctx, fmt.Sprintf("node_b%d", i), store.NodeReady); err != nil {
			t.Fatal(err)
		}
	}
	viewer, operator := f.token(store.RoleViewer, 0), f.token(store.RoleOperator, 0)

	r := f.call("pools.get", viewer, `{"pool":"gpu"}`, peer)
	budget, _ := r.Body["budget"].(map[string]any)
	if r.Code != 200 || r.Body["disruptionBudget"] != "10%" || budget["nodes"] != 10.0 || budget["budget"] != 1.0 {
		t.Fatalf("pools.get = %v", r)
	}
	wantCode(t, f.call("pools.get", viewer, `{"pool":"nosuch"}`, peer), 404, "NOT_FOUND", "pool")
	wantCode(t, f.call("pools.setBudget", operator, `{"pool":"gpu","disruptionBudget":"2"}`, peer), 403, "PERMISSION_DENIED", "")
	for body, field := range map[string]string{
		`{"pool":"gpu"}`: "disruptionBudget",
		`{"pool":"gpu","disruptionBudget":"101%"}`:                          "disruptionBudget",
		`{"pool":"gpu","disruptionBudget":"x"}`:                             "disruptionBudget",
		`{"pool":"gpu","disruptionBudget":"99999999999"}`:                   "disruptionBudget",
		`{"pool":"gpu","disruptionBudget":"2","remediationConcurrency":-1}`: "remediationConcurrency",
	} {
		wantCode(t, f.call("pools.setBudget", f.admin, body, peer), 400, "INVALID_ARGUMENT", field)
	}
	r = f.call("pools.setBudget", f.admin, `{"pool":"gpu","disruptionBudget":"20%","remediationConcurrency":3}`, peer)
	budget, _ = r.Body["budget"].(map[string]any)
	if r.Code != 200 || r.Body["disruptionBudget"] != "20%" || r.Body["remediationConcurrency"] != 3.0 || budget["budget"] != 2.0 {
		t.Fatalf("pools.setBudget = %v", r)
	}

	// Budget 2: two drains, the third refused; uncordon frees a slot.
	for _, n := range []string{"node_b0", "node_b1"} {
		if r := f.call("nodes.drain", operator, `{"id":"`+n+`"}`, peer); r.Code != 200 {
			t.Fatalf("drain %s = %v", n, r)
		}
	}
	wantCode(t, f.call("nodes.drain", operator, `{"id":"node_b2"}`, peer), 409, "CONFLICT", "id")
	if n, _ := f.st.NodeGet(ctx, "node_b2"); n.Cordoned || n.State != store.NodeReady {
		t.Fatalf("refused drain changed the node: cordoned %v state %s", n.Cordoned, n.State)
	}
	if r := f.call("nodes.uncordon", operator, `{"id":"node_b0"}`, peer); r.Code != 200 {
		t.Fatalf("uncordon = %v", r)
	}
	if n, _ := f.st.NodeGet(ctx, "node_b0"); n.Cordoned || n.State != store.NodeReady || n.Disruption != "" {
		t.Fatalf("uncordoned node: cordoned %v state %s disruption %q", n.Cordoned, n.State, n.Disruption)
	}
	if r := f.call("nodes.drain", operator, `{"id":"node_b2"}`, peer); r.Code != 200 {
		t.Fatalf("drain after a slot freed = %v", r)
	}
	r = f.call("pools.get", viewer, `{"pool":"gpu"}`, peer)
	if budget, _ := r.Body["budget"].(map[string]any); budget["outOfService"] != 2.0 {
		t.Fatalf("pools.get after drains = %v", r)
	}
}
