package storetest

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/better-compute/better-compute/controlplane/store"
)

// testDisruptionBudget walks the disruption budget's rules (DESIGN.md,
// "The disruption budget (one definition)"): the default budget, a set
// one, involuntary quarantine past it, holds by another owner, the
// remediation concurrency, release, and nodes out by their state counting.
func testDisruptionBudget(ctx context.Context, t *testing.T, h *Harness) {
	st := h.Store
	pool := fixture(ctx, t, h)
	for i := range 10 {
		addNode(ctx, t, h, pool, fmt.Sprintf("node_db%02d", i))
	}
	admit := func(node, reason, owner string) *store.DisruptionAdmission {
		t.Helper()
		return must(st.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: node, Reason: reason, Owner: owner}))
	}
	b := must(st.PoolBudget(ctx, pool.ID))
	if b.Spec != store.DefaultDisruptionBudget || b.Budget != 1 || b.Nodes != 10 || b.OutOfService != 0 ||
		b.RemediationConcurrency != store.DefaultRemediationConcurrency {
		t.Fatalf("a new pool's budget: %+v, want 10%% of 10 = 1, concurrency 2", b)
	}
	check(t, st.PoolSetBudget(ctx, &store.PoolSetBudgetParams{PoolID: pool.ID, Spec: "3"}))

	// Two quarantined nodes: involuntary, admitted whatever the count.
	for _, n := range []string{"node_db00", "node_db01"} {
		if a := admit(n, store.DisruptionQuarantined, "remediation:"+n); !a.Admitted {
			t.Fatalf("quarantine of %s refused: %+v", n, a)
		}
	}
	// One slot left: the first upgrade takes it, the second waits.
	if a := admit("node_db02", store.DisruptionUpgrading, "rollout:r1"); !a.Admitted || a.Budget.OutOfService != 3 {
		t.Fatalf("upgrade with 2 of 3 out: %+v, want admitted and 3 out", a)
	}
	if a := admit("node_db03", store.DisruptionUpgrading, "rollout:r1"); a.Admitted || a.Refusal != store.RefusalBudget {
		t.Fatalf("upgrade with 3 of 3 out: %+v, want refused for the budget", a)
	}
	// Failed hardware is quarantined past the budget, and takes over a
	// rollout's hold.
	if a := admit("node_db04", store.DisruptionQuarantined, "remediation:node_db04"); !a.Admitted || a.Budget.OutOfService != 4 {
		t.Fatalf("quarantine past the budget: %+v, want admitted, 4 out", a)
	}
	if a := admit("node_db02", store.DisruptionQuarantined, "remediation:node_db02"); !a.Admitted {
		t.Fatalf("quarantine of a node being upgraded: %+v, want admitted", a)
	}
	if n := must(st.NodeGet(ctx, "node_db02")); n.Disruption != store.DisruptionQuarantined || n.DisruptionOwner != "remediation:node_db02" ||
		n.DisruptionSince == nil {
		t.Fatalf("node taken over by quarantine: %q %q %v", n.Disruption, n.DisruptionOwner, n.DisruptionSince)
	}
	// A hold of another owner refuses a voluntary reason.
	if a := admit("node_db00", store.DisruptionUpgrading, "rollout:r1"); a.Admitted || a.Refusal != store.RefusalHeld ||
		a.Holder != "remediation:node_db00" {
		t.Fatalf("upgrade of a quarantined node: %+v, want refused, held by remediation", a)
	}
	// Remediation actions: at most the concurrency at once, no budget slot.
	for i, n := range []string{"node_db00", "node_db01", "node_db04"} {
		a := admit(n, store.DisruptionRemediating, "remediation:"+n)
		if want := i < 2; a.Admitted != want || (!want && a.Refusal != store.RefusalConcurrency) {
			t.Fatalf("remediation %d (%s): %+v, want admitted %v", i+1, n, a, want)
		}
	}
	if a := admit("node_db05", store.DisruptionRemediating, "remediation:node_db05"); a.Admitted {
		t.Fatalf("remediation of a node in service: %+v, want refused", a)
	}
	// Release: only by the owner; then the slot is free again.
	check(t, st.DisruptionRelease(ctx, "node_db02", "rollout:r1")) // not its owner any more: a no-op
	if b := must(st.PoolBudget(ctx, pool.ID)); b.OutOfService != 4 || b.Remediating != 2 {
		t.Fatalf("after a release by a former owner: %+v, want 4 out, 2 remediating", b)
	}
	for _, n := range []string{"node_db00", "node_db01", "node_db02", "node_db04"} {
		check(t, st.DisruptionRelease(ctx, n, "remediation:"+n))
	}
	if n := must(st.NodeGet(ctx, "node_db00")); n.Disruption != "" || n.DisruptionOwner != "" || n.DisruptionSince != nil {
		t.Fatalf("released node: %q %q %v", n.Disruption, n.DisruptionOwner, n.DisruptionSince)
	}
	// A node out by its state counts; its own admission takes no second slot.
	check(t, st.NodeSetState(ctx, "node_db06", store.NodeUnreachable))
	check(t, st.NodeSetState(ctx, "node_db07", store.NodeUnreachable))
	check(t, st.NodeSetState(ctx, "node_db08", store.NodeUnreachable))
	if a := admit("node_db09", store.DisruptionUpgrading, "rollout:r2"); a.Admitted || a.Budget.OutOfService != 3 {
		t.Fatalf("upgrade with 3 unreachable and a budget of 3: %+v, want refused", a)
	}
	if a := admit("node_db06", store.DisruptionQuarantined, "remediation:node_db06"); !a.Admitted || a.Budget.OutOfService != 3 {
		t.Fatalf("quarantine of an unreachable node: %+v, want admitted and still 3 out", a)
	}

	// Bad input is refused and changes nothing.
	for _, p := range []*store.DisruptionAdmitParams{
		{NodeID: "node_db09", Reason: "holiday", Owner: "x"},
		{NodeID: "node_db09", Reason: store.DisruptionUpgrading},
	} {
		if _, err := st.DisruptionAdmit(ctx, p); err == nil {
			t.Errorf("DisruptionAdmit(%+v): no error", p)
		}
	}
	if _, err := st.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: "node_nosuch", Reason: store.DisruptionUpgrading, Owner: "x"}); err == nil {
		t.Error("DisruptionAdmit of an unknown node: no error")
	} else {
		wantErr(t, err, store.ErrNotFound)
	}
	for _, spec := range []string{"", "x", "-1", "0%", "101%", "5.5", "1000001", "4294967296", "99999999999"} {
		if err := st.PoolSetBudget(ctx, &store.PoolSetBudgetParams{PoolID: pool.ID, Spec: spec, RemediationConcurrency: -1}); err == nil {
			t.Errorf("PoolSetBudget(%q, -1): no error", spec)
		}
	}
	wantErr(t, st.PoolSetBudget(ctx, &store.PoolSetBudgetParams{PoolID: "pool_nosuch", Spec: "1"}), store.ErrNotFound)
	if p := must(st.PoolGet(ctx, pool.ID)); p.DisruptionBudget != "3" || p.RemediationConcurrency != 2 {
		t.Fatalf("pool after refused changes: budget %q concurrency %d", p.DisruptionBudget, p.RemediationConcurrency)
	}
}

// testDisruptionConcurrentAdmissions races 20 upgrades of 20 nodes against a
// budget of 3: the pool's row lock admits exactly 3, never more.
func testDisruptionConcurrentAdmissions(ctx context.Context, t *testing.T, h *Harness) {
	st := h.Store
	pool := fixture(ctx, t, h)
	const nodes = 20
	for i := range nodes {
		addNode(ctx, t, h, pool, fmt.Sprintf("node_dc%02d", i))
	}
	check(t, st.PoolSetBudget(ctx, &store.PoolSetBudgetParams{PoolID: pool.ID, Spec: "15%"}))
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		admitted int
		errs     []error
	)
	for i := range nodes {
		wg.Go(func() {
			a, err := st.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: fmt.Sprintf("node_dc%02d", i),
				Reason: store.DisruptionUpgrading, Owner: "rollout:race"})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			} else if a.Admitted {
				admitted++
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("concurrent admissions failed: %v", errs)
	}
	if b := must(st.PoolBudget(ctx, pool.ID)); admitted != 3 || b.OutOfService != 3 || b.Budget != 3 {
		t.Fatalf("%d admitted, pool %+v: want exactly 3 (15%% of 20)", admitted, b)
	}
}
