package rollouts_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/healthgate"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/reconcilers/rollouts"
	"github.com/better-compute/better-compute/controlplane/store"
)

// The waves' health gate (issue 30, item 3).

// gateWorker is e.worker whose reconciler has the health gate's
// thresholds gate.
func (e *env) gateWorker(holder string, ro *store.Rollout, gate healthgate.Params) *worker {
	e.t.Helper()
	w := e.worker(holder, ro, nil)
	w.r = rollouts.New(rollouts.Config{Gate: gate, MinExtension: testMinExtension}, e.st, slog.New(slog.NewTextHandler(e.t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo})))
	return w
}

// waveCompleted returns the rollout.wave-completed events' data, by wave.
func (e *env) waveCompleted(ro *store.Rollout) map[int]events.RolloutWaveData {
	e.t.Helper()
	out := map[int]events.RolloutWaveData{}
	for _, en := range mustV(e.st.OutboxQuery(context.Background(), &store.OutboxQueryParams{Key: ro.ID, TopicPrefix: events.RolloutWaveCompleted})) {
		var d events.RolloutWaveData
		if err := json.Unmarshal(mustV(events.Parse(en.Payload)).Data, &d); err != nil {
			e.t.Fatal(err)
		}
		out[d.Wave] = d
	}
	return out
}

// TestRolloutHealthGateInconclusiveExtendsOnce: with the default
// thresholds (1 node-hour for a pass) a soak of a second decides nothing:
// each wave's gate is inconclusive, its soak is extended once (by the
// soak), and the wave then advances; the last wave, with no node left
// that is not upgraded, is compared with its own nodes before their
// upgrade. Both groups' figures are in the rollout and in each
// rollout.wave-completed event.
func TestRolloutHealthGateInconclusiveExtendsOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	const soak = 300 * time.Millisecond
	ro := e.create(store.RolloutCreateParams{Canary: 1, Wave: "2", Soak: soak})
	w := e.gateWorker("w1", ro, healthgate.Params{})
	pending := e.until(w, ro, "extended", func(r *store.Rollout) bool { return len(r.Gates) == 1 })
	g := pending.Gates[0]
	if g.Wave != 1 || g.Verdict != healthgate.Inconclusive || !g.Pending || g.ExtendedUntil == nil || pending.CurrentWave != 1 {
		t.Fatalf("canary's gate %+v (rollout at wave %d), want inconclusive, pending, extended", g, pending.CurrentWave)
	}
	ro = e.until(w, ro, "completed", state(store.RolloutCompleted))
	if len(ro.Gates) != 2 {
		t.Fatalf("gates %+v, want one per wave", ro.Gates)
	}
	waves := e.waveCompleted(ro)
	for i, g := range ro.Gates {
		want := healthgate.ComparisonNotUpgraded
		if i == 1 {
			want = healthgate.ComparisonBeforeUpgrade // no node left not upgraded
		}
		if g.Wave != i+1 || g.Verdict != healthgate.Inconclusive || g.Pending || g.ExtendedUntil == nil || g.Comparison != want {
			t.Errorf("wave %d's gate: %+v; want inconclusive after its extension, comparison %s", i+1, g, want)
		}
		if g.To.Sub(g.From) < 2*soak || g.UpgradedNodeHours <= 0 || g.ComparisonNodeHours <= 0 || len(g.Measures) != 4 {
			t.Errorf("wave %d's gate window %v to %v, node-hours %v and %v, %d measures: want the soak and its extension, both groups, 4 measures",
				g.Wave, g.From, g.To, g.UpgradedNodeHours, g.ComparisonNodeHours, len(g.Measures))
		}
		ev, ok := waves[g.Wave]
		if !ok || ev.HealthGate == nil || ev.HealthGate.Verdict != g.Verdict || ev.HealthGate.ComparisonNodes != g.ComparisonNodes {
			t.Errorf("rollout.wave-completed of wave %d: %+v, want its gate", g.Wave, ev)
		}
	}
	if g := ro.Gates[0]; g.UpgradedNodes != 1 || g.ComparisonNodes != 2 {
		t.Errorf("canary's gate compares %d node(s) with %d, want 1 with the 2 not upgraded", g.UpgradedNodes, g.ComparisonNodes)
	}
}

// TestRolloutHealthGateRequireEvidence: the same rollout with
// --require-evidence halts at the canary once its extended soak is still
// inconclusive, and rolls the canary back.
func TestRolloutHealthGateRequireEvidence(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	ro := e.create(store.RolloutCreateParams{Canary: 1, Wave: "2", Soak: 500 * time.Millisecond, RequireEvidence: true})
	w := e.gateWorker("w1", ro, healthgate.Params{})
	ro = e.until(w, ro, "halted", state(store.RolloutHalted))
	if ro.CurrentWave != 1 || !strings.Contains(ro.Reason, "requires evidence") || len(ro.Gates) != 1 || ro.Gates[0].Verdict != healthgate.Inconclusive {
		t.Fatalf("halted at wave %d: %q, gates %+v; want the canary's inconclusive gate", ro.CurrentWave, ro.Reason, ro.Gates)
	}
	for _, n := range mustV(e.st.RolloutNodes(context.Background(), ro.ID)) {
		if n.Wave == 1 && (n.State != store.RolloutNodeRolledBack || n.BCDVersion != versionA) {
			t.Errorf("canary %s: %s on %s, want rolled back to A", n.NodeID, n.State, n.BCDVersion)
		}
		if n.Wave != 1 && e.daemons[n.NodeID].Upgrades() != 0 {
			t.Errorf("node %s of no wave was upgraded", n.NodeID)
		}
	}
}

// TestRolloutHealthGateHaltsOnXIDs: release B makes the canary raise XID
// 13 (RESTART_APP: the GPU stays healthy, so only the gate can see it)
// several times a second; against five nodes on A that raise none, the
// canary's findings per GPU-hour halt the rollout at the canary.
func TestRolloutHealthGateHaltsOnXIDs(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, 6, true)
	for _, d := range e.daemons {
		d.SetRelease(versionB, sim.Release{XIDEvery: 150 * time.Millisecond})
	}
	ro := e.create(store.RolloutCreateParams{Canary: 1, Wave: "2", Soak: 1500 * time.Millisecond})
	w := e.gateWorker("w1", ro, healthgate.Params{MinNodeHours: 0.0005})
	ro = e.until(w, ro, "halted", state(store.RolloutHalted))
	t.Logf("halted: %s", ro.Reason)
	if ro.CurrentWave != 1 || len(ro.Gates) != 1 || ro.Gates[0].Verdict != healthgate.Halt || !strings.Contains(ro.Reason, "findings") {
		t.Fatalf("halted at wave %d: %q, gates %+v; want the canary's gate halting on findings", ro.CurrentWave, ro.Reason, ro.Gates)
	}
	for _, m := range ro.Gates[0].Measures {
		if m.Name == "findings" && (!m.Worse || m.Upgraded.Count < 3 || m.Comparison.Count != 0 || m.Upgraded.Exposure <= 0 || m.Comparison.Exposure <= 0) {
			t.Errorf("findings: %+v, want worse, the canary's XIDs against none", m)
		}
	}
}
