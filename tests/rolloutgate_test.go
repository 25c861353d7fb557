package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/shard"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// Health-gated waves (issue 30, item 3) and a kill -9 during a fleet-wide
// rollback, on the production shape of newRolloutEnv (one api, one
// gateway, two workers on PostgreSQL) with FakeDaemons.

// TestRolloutHealthGateHaltsTheCanaryOnXIDs: after release "sick" the
// simulator raises XID 13 (RESTART_APP: the GPU stays healthy, no
// remediation acts, the soak's own checks see nothing) on its node's GPU 0
// five times a second. The canary's new GPU findings per GPU-hour, against
// the five nodes of the pool not yet upgraded that raise none, halt the
// rollout at the canary; rollouts get -o json has both groups' figures
// and the verdict, and no node outside the canary was touched.
// rollouts.healthGate.minNodeHours is lowered to fit the test's seconds
// (the comparison group is watched for 5 nodes x a few seconds).
func TestRolloutHealthGateHaltsTheCanaryOnXIDs(t *testing.T) {
	t.Parallel()
	e := newRolloutEnvWith(t, "  healthGate:\n    minNodeHours: 0.001\n")
	_, token := e.newPool(t, "gate", 6)
	ds := e.joinFakesWith(t, "gate", token, 6, true)
	for _, d := range ds {
		d.SetRelease(relSick, sim.Release{XIDEvery: 200 * time.Millisecond})
	}
	runDaemons(t, ds)
	ctx := context.Background()
	eventually(t, 60*time.Second, func() bool {
		for _, d := range ds {
			if n, err := e.st.NodeGet(ctx, d.NodeID()); err != nil || len(n.Inventory) == 0 {
				return false
			}
			if _, err := e.st.SessionGet(ctx, d.NodeID()); err != nil {
				return false
			}
		}
		return true
	}, func() string { return "the FakeDaemons are not all connected with their inventory" })
	id := e.rollout(t, "--version", relSick, "--pool", "gate", "--canary", "1", "--wave", "2", "--soak", "5s", "--timeout", "60s")
	ro := e.await(t, id, store.RolloutHalted)
	t.Logf("halted: %s", ro.Reason)

	code, stdout, stderr := e.cli(t, "rollouts", "get", id, "-o", "json")
	if code != 0 {
		t.Fatalf("rollouts get -o json: exit %d\n%s%s", code, stdout, stderr)
	}
	var r apiv1.RolloutResponse
	if err := protojson.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("rollouts get -o json: %v\n%s", err, stdout)
	}
	got := r.GetRollout()
	if got.GetCurrentWave() != 1 || len(got.GetHealthGates()) != 1 {
		t.Fatalf("halted at wave %d with gates %v, want the canary's gate", got.GetCurrentWave(), got.GetHealthGates())
	}
	g := got.GetHealthGates()[0]
	if g.GetVerdict() != "halt" || g.GetComparison() != "not-upgraded" || g.GetUpgradedNodes() != 1 || g.GetComparisonNodes() != 5 ||
		g.GetUpgradedNodeHours() <= 0 || g.GetComparisonNodeHours() <= 0 || g.GetStartTime() == nil || g.GetEndTime() == nil {
		t.Errorf("canary's gate %v: want halt, 1 upgraded node against 5 not upgraded, with their node-hours", g)
	}
	var findings *apiv1.RolloutHealthMeasure
	for _, m := range g.GetMeasures() {
		if m.GetName() == "findings" {
			findings = m
		}
	}
	if findings == nil || !findings.GetWorse() || findings.GetUnit() != "GPU-hour" || findings.GetUpgradedCount() < 3 ||
		findings.GetComparisonCount() != 0 || findings.GetUpgradedExposure() <= 0 || findings.GetComparisonExposure() <= 0 ||
		findings.GetPValue() >= 0.01 {
		t.Errorf("findings measure %v: want worse, the canary's XIDs over its GPU-hours against none over the others'", findings)
	}
	if !strings.Contains(got.GetReason(), "health gate of wave 1") || !strings.Contains(got.GetReason(), "findings") {
		t.Errorf("reason %q, want the health gate and its measure named", got.GetReason())
	}
	// The table names the gate too.
	if code, stdout, _ := e.cli(t, "rollouts", "get", id); code != 0 || !strings.Contains(stdout, "health gate, wave 1: halt") ||
		!strings.Contains(stdout, "WORSE") {
		t.Errorf("rollouts get: exit %d\n%s", code, stdout)
	}
	upgraded := 0
	for _, d := range ds {
		if d.Upgrades() > 0 {
			upgraded++
			if d.Version() != relA || d.Rollbacks() != 1 {
				t.Errorf("canary %s on %s after %d rollbacks, want back on %s", d.Name(), d.Version(), d.Rollbacks(), relA)
			}
		}
	}
	if upgraded != 1 {
		t.Errorf("%d nodes upgraded, want the canary only", upgraded)
	}
}

// TestRolloutKill9DuringFleetWideRollback: every node of the pool is
// upgraded to a release that restarts its bcd 40 s after each start; the
// first restart, in the bake, halts the rollout, which rolls back all 9
// nodes in waves of 2 (the pool's budget). The worker driving that
// rollback is killed with SIGKILL while nodes are rolling back; the other
// worker takes the shard over and finishes it: the rollout halts, every
// node is back on A, each ran exactly one rollback (one rollback command,
// one rollout.node-rolling-back event), and nothing is left out of
// service.
func TestRolloutKill9DuringFleetWideRollback(t *testing.T) {
	t.Parallel()
	e := newRolloutEnv(t)
	ctx := context.Background()
	pool, token := e.newPool(t, "rbkill", 9)
	ds := e.joinFakes(t, "rbkill", token, 9)
	for _, d := range ds {
		d.SetRelease(relSick, sim.Release{UnhealthyAfter: 40 * time.Second, DownFor: 200 * time.Millisecond})
	}
	runDaemons(t, ds)
	eventually(t, 60*time.Second, func() bool {
		for _, d := range ds {
			if _, err := e.st.SessionGet(ctx, d.NodeID()); err != nil {
				return false
			}
		}
		return true
	}, func() string { return "the FakeDaemons are not all connected" })
	if code, _, stderr := e.cli(t, "pools", "set-budget", "rbkill", "--budget", "2"); code != 0 {
		t.Fatalf("set-budget: %s", stderr)
	}
	id := e.rollout(t, "--version", relSick, "--pool", "rbkill", "--canary", "1", "--wave", "4", "--max-unavailable", "2",
		"--soak", "1s", "--bake", "3m", "--timeout", "60s")
	// Mid-rollback: a node rolling back, and another still to go.
	eventually(t, 3*rolloutDur, func() bool {
		nodes, err := e.st.RolloutNodes(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		rolling, left := 0, 0
		for _, n := range nodes {
			switch n.State {
			case store.RolloutNodeRollingBack:
				rolling++
			case store.RolloutNodeUpgraded:
				left++
			}
		}
		return rolling > 0 && left > 0
	}, func() string {
		ro, _ := e.st.RolloutGet(ctx, id)
		return fmt.Sprintf("the rollout is not rolling back with nodes left: %s wave %d %q", ro.State, ro.CurrentWave, ro.Reason)
	})
	l, err := e.st.LeaseGet(ctx, shard.LeaseName(store.ShardOf(id)))
	if err != nil {
		t.Fatal(err)
	}
	victim := e.worker(l.Holder)
	victim.p.Kill()
	t.Logf("kill -9 of %s, the holder of %s, mid-rollback", victim.name, l.Name)
	ro := e.await(t, id, store.RolloutHalted)
	t.Logf("halted: %s", ro.Reason)
	if l2, _ := e.st.LeaseGet(ctx, l.Name); l2.Holder == l.Holder || l2.Epoch <= l.Epoch {
		t.Errorf("lease %s still %s at epoch %d", l.Name, l2.Holder, l2.Epoch)
	}
	rollingBack := map[string]int{}
	entries, err := e.st.OutboxQuery(ctx, &store.OutboxQueryParams{Key: id, TopicPrefix: events.RolloutNodeRollingBack, Limit: store.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range entries {
		env, err := events.Parse(en.Payload)
		if err != nil {
			t.Fatal(err)
		}
		var d events.RolloutNodeData
		if err := json.Unmarshal(env.Data, &d); err != nil {
			t.Fatal(err)
		}
		rollingBack[d.NodeID]++
	}
	upgraded := 0
	for _, d := range ds {
		cmds, err := e.st.CommandList(ctx, &store.CommandListParams{NodeID: d.NodeID()})
		if err != nil {
			t.Fatal(err)
		}
		rollbacks := 0
		for _, c := range cmds {
			if c.Kind == "rollback" {
				rollbacks++
			}
		}
		want := min(d.Upgrades(), 1) // a node the halt came before was never upgraded: nothing to roll back
		if want == 1 {
			upgraded++
		}
		if d.Upgrades() > 1 || d.Rollbacks() != want || rollbacks != want || rollingBack[d.NodeID()] != want || d.Version() != relA {
			t.Errorf("%s: %d upgrade(s), %d rollback(s) run, %d rollback command(s), %d rollout.node-rolling-back event(s), on %s; want %d of each, on %s",
				d.Name(), d.Upgrades(), d.Rollbacks(), rollbacks, rollingBack[d.NodeID()], d.Version(), want, relA)
		}
	}
	if upgraded < 5 {
		t.Errorf("%d node(s) upgraded before the halt, want the canary and more than one wave (fleet-wide)", upgraded)
	}
	if b, err := e.st.PoolBudget(ctx, pool.ID); err != nil || b.OutOfService != 0 {
		t.Errorf("pool budget after the rollback: %+v %v, want nothing out of service", b, err)
	}
}
