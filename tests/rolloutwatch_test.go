package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
)

// A rollout watches every node it upgraded until it ends, plus a bake
// (issue 30). Three real bcd under the test's supervision (restarted after
// each exit, as systemd would) and FakeDaemons, on the production shape of
// newRolloutEnv; soaks and bakes compressed.

// watchPool makes pool name with three supervised real bcd and three
// FakeDaemons on A, a budget of 2, and returns the real nodes.
func (e *rolloutEnv) watchPool(t *testing.T, name string) []*supervised {
	t.Helper()
	_, token := e.newPool(t, name, 6)
	var real []*supervised
	for i := range 3 {
		real = append(real, e.superviseNode(t, fmt.Sprintf("%s-bcd-%d", name, i+1), token))
	}
	fakes := e.joinFakes(t, name, token, 3)
	runDaemons(t, fakes)
	eventually(t, 60*time.Second, func() bool {
		for _, d := range fakes {
			if _, err := e.st.SessionGet(context.Background(), d.NodeID()); err != nil {
				return false
			}
		}
		return true
	}, func() string { return "the FakeDaemons are not all connected" })
	if code, stdout, stderr := e.cli(t, "pools", "set-budget", name, "--budget", "2"); code != 0 {
		t.Fatalf("set-budget: %d %s%s", code, stdout, stderr)
	}
	return real
}

// haltedData is the rollout.halted event of rollout id.
func (e *rolloutEnv) haltedData(t *testing.T, id string) events.RolloutData {
	t.Helper()
	entries, err := e.st.OutboxQuery(context.Background(), &store.OutboxQueryParams{Key: id, TopicPrefix: events.RolloutHalted})
	if err != nil || len(entries) != 1 {
		t.Fatalf("rollout.halted events of %s: %d %v", id, len(entries), err)
	}
	env, err := events.Parse(entries[0].Payload)
	if err != nil {
		t.Fatal(err)
	}
	var d events.RolloutData
	if err := json.Unmarshal(env.Data, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestRolloutLateCrashRollsBackEveryWave: release B (the crashafter build)
// passes its trial and soak and exits 25 s after each start. The rollout
// (soak 3 s, bake 2 min) is already past the crashed nodes' waves when they
// restart; it halts, and every node it upgraded, of every wave, ends back on
// A, with nothing cordoned and no budget slot held; rollouts get and the
// rollout.halted event name each node and why.
func TestRolloutLateCrashRollsBackEveryWave(t *testing.T) {
	t.Parallel()
	e := newRolloutEnv(t)
	ctx := context.Background()
	e.release(t, relCrash, crashingBcd(t, relCrash, 25*time.Second))
	e.watchPool(t, "late")
	start := time.Now()
	id := e.rollout(t, "--version", relCrash, "--pool", "late", "--canary", "1", "--wave", "2", "--max-unavailable", "2",
		"--soak", "3s", "--bake", "2m", "--timeout", "60s")
	ro := e.await(t, id, store.RolloutHalted)
	t.Logf("halted %v after the start: %s", time.Since(start).Round(time.Second), ro.Reason)
	if !strings.Contains(ro.Reason, "bcd restarted") && !strings.Contains(ro.Reason, "rolled itself back") {
		t.Errorf("reason %q, want a late restart named", ro.Reason)
	}
	nodes, err := e.st.RolloutNodes(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	waves := map[int]int{}
	for _, n := range nodes {
		if n.UpgradeCommandID == "" {
			if n.State != store.RolloutNodePending {
				t.Errorf("%s (%s): %s without an upgrade", n.NodeID, n.Hostname, n.State)
			}
			continue
		}
		waves[n.Wave]++
		t.Logf("wave %d %s (%s): %s %q", n.Wave, n.NodeID, n.Hostname, n.State, n.Reason)
		if n.State != store.RolloutNodeRolledBack && n.State != store.RolloutNodeFailed || n.Reason == "" {
			t.Errorf("%s (wave %d): %s %q, want rolled back (or failed after rolling itself back), saying why", n.NodeID, n.Wave, n.State, n.Reason)
		}
	}
	if len(waves) < 2 {
		t.Errorf("upgraded nodes by wave %v: want more than one wave upgraded before the halt", waves)
	}
	// Every upgraded node ends back on A (each real bcd by the rollback
	// command, or by itself); nothing cordoned, no slot held.
	eventually(t, 2*time.Minute, func() bool {
		for _, n := range nodes {
			if n.UpgradeCommandID == "" {
				continue
			}
			cur, err := e.st.NodeGet(ctx, n.NodeID)
			if err != nil || cur.BCDVersion != relA {
				return false
			}
		}
		return true
	}, func() string { return "not every upgraded node is back on " + relA })
	for _, n := range nodes {
		if cur, _ := e.st.NodeGet(ctx, n.NodeID); cur.Cordoned {
			t.Errorf("%s is left cordoned", n.NodeID)
		}
	}
	pool, _ := e.st.PoolGet(ctx, "late")
	if b, err := e.st.PoolBudget(ctx, pool.ID); err != nil || b.OutOfService != 0 {
		t.Errorf("pool budget %+v %v: want nothing out of service", b, err)
	}
	d := e.haltedData(t, id)
	if len(d.Nodes) != waves[1]+waves[2]+waves[3]+waves[4] {
		t.Errorf("rollout.halted names %d nodes, want every upgraded one (%v)", len(d.Nodes), waves)
	}
	for _, n := range d.Nodes {
		if n.Reason == "" {
			t.Errorf("rollout.halted node %+v: no reason", n)
		}
	}
	code, stdout, stderr := e.cli(t, "rollouts", "get", id)
	t.Logf("rollouts get: exit %d\n%s%s", code, stdout, stderr)
	if code != 0 || !strings.Contains(stdout, "halted") || !strings.Contains(stdout, "rolled-back") {
		t.Errorf("rollouts get does not show the halt and the rolled-back nodes")
	}
}

// TestRolloutBakeSurvivesGatewayRestart: a good release, soak 2 s, bake
// 40 s. During the bake (rollouts get shows it) the gateway restarts: every
// node reconnects after its drain delay, which is no drop, and the rollout
// completes with every node on B.
func TestRolloutBakeSurvivesGatewayRestart(t *testing.T) {
	t.Parallel()
	e := newRolloutEnv(t)
	ctx := context.Background()
	e.watchPool(t, "bake")
	id := e.rollout(t, "--version", relB, "--pool", "bake", "--canary", "1", "--wave", "2", "--max-unavailable", "2",
		"--soak", "2s", "--bake", "40s", "--timeout", "60s")
	var ro *store.Rollout
	eventually(t, 2*time.Minute, func() bool {
		var err error
		ro, err = e.st.RolloutGet(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if ro.State == store.RolloutHalted || ro.State == store.RolloutFailed {
			t.Fatalf("rollout %s: %s", ro.State, ro.Reason)
		}
		return ro.Baking()
	}, func() string { return "the rollout did not reach its bake" })
	code, stdout, stderr := e.cli(t, "rollouts", "get", id)
	if code != 0 || !strings.Contains(stdout, "phase: bake") {
		t.Fatalf("rollouts get during the bake: exit %d\n%s%s", code, stdout, stderr)
	}
	t.Logf("rollouts get during the bake:\n%s", stdout)
	bakeStarted := time.Now()
	e.restartGateway(e.gateways[0])
	t.Logf("gateway restarted %v into the bake", time.Since(bakeStarted).Round(time.Second))
	ro = e.await(t, id, store.RolloutCompleted)
	nodes, err := e.st.RolloutNodes(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.State != store.RolloutNodeUpgraded || n.BCDVersion != relB || n.Drops != 0 {
			t.Errorf("%s (%s): %s on %s, %d drops; want upgraded on %s with no drop", n.NodeID, n.Hostname, n.State, n.BCDVersion, n.Drops, relB)
		}
	}
	if ro.BakeElapsed < 40*time.Second {
		t.Errorf("completed after %v of bake, want 40s", ro.BakeElapsed)
	}
	t.Logf("completed after a bake of %v", ro.BakeElapsed.Round(time.Millisecond))
}
