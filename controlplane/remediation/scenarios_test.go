package remediation_test

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/remediation"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/bmcsecret"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// TestXIDResolutions: XID 13 (RESTART_APP) is only its event; XID 95
// (RESET_GPU) resets the GPU and returns the node; XID 48 (the catalogue's
// WORKFLOW_XID_48, sent as ESCALATE) is quarantined and escalated; XID 79
// (RESTART_BM) is quarantined, drained, rebooted, verified and returned.
func TestXIDResolutions(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, st store.Store) {
		f := newFixture(t, st, 5, config.Remediation{})
		f.xid("node_00", 13, "GRAPHICS_ENGINE_EXCEPTION", "RESTART_APP")
		f.xid("node_01", 95, "UNCONTAINED_ECC_ERROR", "RESET_GPU")
		f.xid("node_02", 48, "DBE_ECC_ERROR", "ESCALATE")
		f.xid("node_03", 79, "GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM")
		f.round()
		// One round after the XID, every node that needs it is out.
		for _, id := range []string{"node_01", "node_02", "node_03"} {
			if n := f.node(id); !n.Cordoned || n.Disruption == "" {
				t.Errorf("%s one round after its XID: cordoned %v, disruption %q", id, n.Cordoned, n.Disruption)
			}
		}
		f.until(20, "returned", func() bool {
			a, b := f.caseOf("node_01"), f.caseOf("node_03")
			return a.State == store.RemediationReturned && b.State == store.RemediationReturned
		})
		if c := f.caseOf("node_00"); c != nil {
			t.Errorf("XID 13 opened a case: %+v", c)
		}
		if cmds := f.commandsOf("node_00"); len(cmds) != 0 {
			t.Errorf("XID 13 made commands: %v", cmds)
		}
		if n := f.node("node_00"); n.Cordoned || n.Disruption != "" {
			t.Errorf("XID 13's node was touched: cordoned %v, disruption %q", n.Cordoned, n.Disruption)
		}
		full := []string{"detected", "quarantined", "draining", "remediating", "verifying", "returned"}
		if got := f.steps("node_01"); !slices.Equal(got, full) {
			t.Errorf("XID 95 steps %v, want %v", got, full)
		}
		if got := f.commandsOf("node_01"); got[sessionv1.KindGPUReset] != 1 || len(got) != 1 {
			t.Errorf("XID 95 commands %v, want one gpu.reset", got)
		}
		if got := f.steps("node_03"); !slices.Equal(got, full) {
			t.Errorf("XID 79 steps %v, want %v", got, full)
		}
		if got := f.commandsOf("node_03"); got[sessionv1.KindReboot] != 1 || len(got) != 1 {
			t.Errorf("XID 79 commands %v, want one reboot", got)
		}
		for _, id := range []string{"node_01", "node_03"} {
			if n := f.node(id); n.Cordoned || n.Disruption != "" {
				t.Errorf("%s returned but cordoned %v, disruption %q", id, n.Cordoned, n.Disruption)
			}
		}
		c := f.caseOf("node_02")
		if c.State != store.RemediationEscalated {
			t.Fatalf("XID 48: state %s", c.State)
		}
		if got := f.steps("node_02"); !slices.Equal(got, []string{"detected", "quarantined", "escalated"}) {
			t.Errorf("XID 48 steps %v", got)
		}
		if n := f.node("node_02"); !n.Cordoned || n.Disruption != store.DisruptionQuarantined {
			t.Errorf("XID 48's node: cordoned %v, disruption %q", n.Cordoned, n.Disruption)
		}
		if cmds := f.commandsOf("node_02"); len(cmds) != 0 {
			t.Errorf("XID 48 made commands: %v", cmds)
		}
		// Each move was audited.
		audit, err := st.AuditQuery(f.ctx, &store.AuditQueryParams{Resource: "remediation/" + f.caseOf("node_03").ID, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		if len(audit) != len(full) {
			t.Errorf("%d audit rows for XID 79's case, want %d", len(audit), len(full))
		}
	})
}

// TestLadderToPowerCycle: a reboot whose node does not come back is
// followed by a BMC power cycle through the site's agent (the other node
// of the site running bcx-ipmi, granted the node's sealed BMC secret for
// that command); the node reconnects, is verified and returned.
func TestLadderToPowerCycle(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, st store.Store) {
		f := newFixture(t, st, 3, config.Remediation{VerifyTimeout: config.Duration{Duration: 20 * time.Second}})
		agent := "node_02"
		if err := st.NodeSetInventory(f.ctx, agent, []byte(`{"plugins":[{"name":"ipmi","version":"1.0.0","healthy":true}]}`), "d"); err != nil {
			t.Fatal(err)
		}
		if err := st.SecretPut(f.ctx, &store.Secret{Name: bmcsecret.Name("node_00"), NodeID: "node_00", Sealed: []byte("sealed")}); err != nil {
			t.Fatal(err)
		}
		f.answers["node_00 "+sessionv1.KindReboot] = stayDown
		f.xid("node_00", 79, "GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM")
		var granted bool
		f.until(80, "returned", func() bool {
			if !granted {
				if cmds, _ := st.CommandList(f.ctx, &store.CommandListParams{NodeID: agent, State: store.CommandQueued}); len(cmds) > 0 {
					// The agent may open the node's secret once, for this command.
					ok, err := st.SecretGrantTake(f.ctx, bmcsecret.Name("node_00"), agent, nil)
					if err != nil || !ok {
						t.Fatalf("no grant for the agent: %v", err)
					}
					granted = true
				}
			}
			c := f.caseOf("node_00")
			return c != nil && c.State == store.RemediationReturned
		})
		want := []string{"detected", "quarantined", "draining", "remediating", "draining", "remediating", "verifying", "returned"}
		if got := f.steps("node_00"); !slices.Equal(got, want) {
			t.Errorf("steps %v, want %v", got, want)
		}
		if got := f.commandsOf(agent); got[sessionv1.KindPowerCycle] != 1 {
			t.Errorf("agent's commands %v, want one power.cycle", got)
		}
		if ok, _ := st.SecretGrantTake(f.ctx, bmcsecret.Name("node_00"), "node_01", nil); ok {
			t.Error("a node without a grant opened the secret")
		}
		c := f.caseOf("node_00")
		if c.Attempts != 2 || len(c.CommandIDs) != 2 {
			t.Errorf("attempts %d, commands %v", c.Attempts, c.CommandIDs)
		}
	})
}

// TestRebootVerifiedByBootID: after a reboot, verification wants the node
// back with another boot id than the one recorded at the action. node_00's
// "reboot" only restarts its bcd (a new session, the same boot id): it is
// not verified, stays verifying until verifyTimeout and is then power
// cycled (the policy's next step), which gives it a new boot id and
// returns it. node_01 comes back with a new boot id and is returned after
// its one reboot. node_02's bcd is an older one that reports no boot id:
// its new session suffices.
func TestRebootVerifiedByBootID(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, st store.Store) {
		const verifyTimeout = 20 * time.Second
		f := newFixture(t, st, 4, config.Remediation{VerifyTimeout: config.Duration{Duration: verifyTimeout}})
		agent := "node_03"
		if err := st.NodeSetInventory(f.ctx, agent, []byte(`{"plugins":[{"name":"ipmi","version":"1.0.0","healthy":true}]}`), "d"); err != nil {
			t.Fatal(err)
		}
		if err := st.SecretPut(f.ctx, &store.Secret{Name: bmcsecret.Name("node_00"), NodeID: "node_00", Sealed: []byte("sealed")}); err != nil {
			t.Fatal(err)
		}
		f.answers["node_00 "+sessionv1.KindReboot] = restartOnly
		f.boot["node_02"] = "" // an older bcd: no boot id in its Hello
		f.connect("node_02")
		for _, id := range []string{"node_00", "node_01", "node_02"} {
			f.xid(id, 79, "GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM")
		}
		// The boot id is recorded when the reboot is sent.
		f.until(20, "node_00 rebooting", func() bool {
			c := f.caseOf("node_00")
			return c != nil && c.Action == config.ActionReboot && c.State == store.RemediationVerifying
		})
		if c := f.caseOf("node_00"); !strings.HasPrefix(c.BootID, "boot-node_00-1|") {
			t.Errorf("node_00's case recorded boot %q at the reboot, want its boot id boot-node_00-1", c.BootID)
		}
		if n := f.node("node_00"); n.BootID != "boot-node_00-1" || f.sess["node_00"] != 2 {
			t.Fatalf("node_00 after its bcd restarted: boot id %q, session %d", n.BootID, f.sess["node_00"])
		}
		// The same boot id in a new session: not verified, for as long as
		// verifyTimeout.
		since := f.caseOf("node_00").StateSince
		for f.clock.Now().Before(since.Add(verifyTimeout - time.Second)) {
			f.round()
			c := f.caseOf("node_00")
			if c.State != store.RemediationVerifying || c.Action != config.ActionReboot {
				t.Fatalf("node_00 with the same boot id %v after its reboot: case %s %s: %s",
					f.clock.Now().Sub(since), c.State, c.Action, c.Reason)
			}
			if !strings.Contains(c.Reason, "boot id") {
				t.Fatalf("node_00 verifying: reason %q, want it to name the unchanged boot id", c.Reason)
			}
		}
		var granted bool
		f.until(80, "all returned", func() bool {
			if !granted {
				if cmds, _ := st.CommandList(f.ctx, &store.CommandListParams{NodeID: agent, State: store.CommandQueued}); len(cmds) > 0 {
					ok, err := st.SecretGrantTake(f.ctx, bmcsecret.Name("node_00"), agent, nil)
					if err != nil || !ok {
						t.Fatalf("no grant for the agent: %v", err)
					}
					granted = true
				}
			}
			for _, id := range []string{"node_00", "node_01", "node_02"} {
				if c := f.caseOf(id); c.State != store.RemediationReturned {
					return false
				}
			}
			return true
		})
		ladder := []string{"detected", "quarantined", "draining", "remediating", "verifying",
			"draining", "remediating", "verifying", "returned"}
		if got := f.steps("node_00"); !slices.Equal(got, ladder) {
			t.Errorf("node_00 steps %v, want %v", got, ladder)
		}
		if c := f.caseOf("node_00"); c.Action != config.ActionPowerCycle || c.Attempts != 2 {
			t.Errorf("node_00 returned after %s, attempt %d; want the power cycle, attempt 2", c.Action, c.Attempts)
		}
		if got := f.commandsOf(agent); got[sessionv1.KindPowerCycle] != 1 {
			t.Errorf("agent's commands %v, want one power.cycle", got)
		}
		full := []string{"detected", "quarantined", "draining", "remediating", "verifying", "returned"}
		for _, id := range []string{"node_01", "node_02"} {
			if got := f.steps(id); !slices.Equal(got, full) {
				t.Errorf("%s steps %v, want %v", id, got, full)
			}
			if got := f.commandsOf(id); got[sessionv1.KindReboot] != 1 || len(got) != 1 {
				t.Errorf("%s commands %v, want one reboot", id, got)
			}
		}
		for id, want := range map[string]string{"node_00": "boot-node_00-2", "node_01": "boot-node_01-2", "node_02": ""} {
			if n := f.node(id); n.BootID != want || n.Cordoned {
				t.Errorf("%s returned: boot id %q (want %q), cordoned %v", id, n.BootID, want, n.Cordoned)
			}
		}
	})
}

// TestSilentNodeBMCEvidence: a node silent past the liveness window whose
// BMC answers on is unresponsive and power cycled; one whose BMC says off
// is powered-off and left alone (the default policy).
func TestSilentNodeBMCEvidence(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, st store.Store) {
		f := newFixture(t, st, 3, config.Remediation{})
		agent := "node_02"
		if err := st.NodeSetInventory(f.ctx, agent, []byte(`{"plugins":[{"name":"ipmi","healthy":true}]}`), "d"); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"node_00", "node_01"} {
			if err := st.SecretPut(f.ctx, &store.Secret{Name: bmcsecret.Name(id), NodeID: id, Sealed: []byte("x")}); err != nil {
				t.Fatal(err)
			}
			f.down[id] = true
			if err := st.NodeSetState(f.ctx, id, store.NodeUnreachable); err != nil {
				t.Fatal(err)
			}
		}
		f.power["node_00"] = "on"
		f.power["node_01"] = "off"
		f.until(40, "both answered", func() bool {
			a, b := f.caseOf("node_00"), f.caseOf("node_01")
			return a != nil && b != nil && a.State == store.RemediationReturned && b.State == store.RemediationReturned
		})
		a, b := f.caseOf("node_00"), f.caseOf("node_01")
		if a.Finding != config.FindingUnresponsive || a.Action != config.ActionPowerCycle {
			t.Errorf("on: finding %s action %s", a.Finding, a.Action)
		}
		if b.Finding != config.FindingPoweredOff || b.Action != config.ActionNone {
			t.Errorf("off: finding %s action %s", b.Finding, b.Action)
		}
		if n := f.node("node_01"); n.State != store.NodePoweredOff || n.Cordoned {
			t.Errorf("off node: state %s cordoned %v", n.State, n.Cordoned)
		}
		if got := f.commandsOf(agent); got[sessionv1.KindPowerStatus] != 2 || got[sessionv1.KindPowerCycle] != 1 {
			t.Errorf("agent's commands %v", got)
		}
		if got := f.steps("node_00"); !slices.Equal(got, []string{"detected", "quarantined", "draining", "remediating", "verifying", "returned"}) {
			t.Errorf("unresponsive node's steps %v", got)
		}
		// A silent node without BMC credentials gets no case.
		if err := st.NodeSetState(f.ctx, agent, store.NodeUnreachable); err != nil {
			t.Fatal(err)
		}
		f.down[agent] = true
		f.round()
		if c := f.caseOf(agent); c != nil {
			t.Errorf("a node without BMC credentials got a case: %+v", c)
		}
	})
}

// TestBreakerAndConcurrency: 30% of a 20-node pool fail at once, the
// breaker admits 3 nodes a window (minNodes 3) and the pool 2 remediations
// at once: 3 nodes are acted on and the breaker trips; the other 3 are
// cordoned and held (evented) but not acted on; never more than 2
// remediate at once; no healthy node is touched; after a reset the rest
// are handled.
func TestBreakerAndConcurrency(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, st store.Store) {
		f := newFixture(t, st, 20, config.Remediation{Breaker: config.RemediationBreaker{MinNodes: 3,
			Window: config.Duration{Duration: time.Hour}}})
		if err := st.PoolSetBudget(f.ctx, &store.PoolSetBudgetParams{PoolID: f.pool.ID, RemediationConcurrency: 2}); err != nil {
			t.Fatal(err)
		}
		failing := f.nodes[:6]
		for _, id := range failing {
			f.answers[id+" "+sessionv1.KindGPUReset] = hold // slow resets: the slots stay taken a while
			f.xid(id, 95, "UNCONTAINED_ECC_ERROR", "RESET_GPU")
		}
		maxRemediating := 0
		observe := func() {
			b, err := st.PoolBudget(f.ctx, f.pool.ID)
			if err != nil {
				t.Fatal(err)
			}
			maxRemediating = max(maxRemediating, b.Remediating)
			for _, id := range f.nodes[6:] {
				if n := f.node(id); n.Cordoned || n.Disruption != "" || f.caseOf(id) != nil || len(f.commandsOf(id)) > 0 {
					t.Fatalf("healthy %s was touched: cordoned %v disruption %q", id, n.Cordoned, n.Disruption)
				}
			}
		}
		count := func(state string) int {
			n := 0
			for _, id := range failing {
				if c := f.caseOf(id); c != nil && c.State == state {
					n++
				}
			}
			return n
		}
		for range 4 {
			f.round()
			observe()
		}
		held := count(store.RemediationHeld)
		out := 0
		for _, id := range failing {
			if f.node(id).Cordoned {
				out++
			}
		}
		if held != 3 || out != 6 {
			t.Fatalf("held %d, cordoned %d; want 3 held and all 6 cordoned", held, out)
		}
		if count(store.RemediationRemediating) != 2 {
			t.Fatalf("%d remediating, want 2 (the pool's concurrency)", count(store.RemediationRemediating))
		}
		bs, err := st.RemediationBreakers(f.ctx)
		if err != nil || len(bs) == 0 || bs[0].TrippedAt == nil {
			t.Fatalf("breakers %+v, %v", bs, err)
		}
		trips, err := st.OutboxQuery(f.ctx, &store.OutboxQueryParams{Key: f.pool.ID, TopicPrefix: "com.better-compute.remediation.breaker-tripped"})
		if err != nil || len(trips) != 1 {
			t.Fatalf("%d breaker-tripped events, %v", len(trips), err)
		}
		for _, id := range failing {
			if c := f.caseOf(id); c.State == store.RemediationHeld && len(f.commandsOf(id)) > 0 {
				t.Errorf("held %s has commands", id)
			}
		}
		// Resets now answer; the operator resets the breaker.
		for _, id := range failing {
			delete(f.answers, id+" "+sessionv1.KindGPUReset)
		}
		now := f.clock.Now()
		if _, err := st.RemediationBreakerReset(f.ctx, f.pool.ID, "token:op", &now); err != nil {
			t.Fatal(err)
		}
		f.until(60, "all returned", func() bool {
			observe()
			return count(store.RemediationReturned) == 6
		})
		if maxRemediating > 2 {
			t.Errorf("%d remediating at once, want at most 2", maxRemediating)
		}
		for _, id := range failing {
			if got := f.commandsOf(id); got[sessionv1.KindGPUReset] != 1 {
				t.Errorf("%s commands %v, want one gpu.reset", id, got)
			}
		}
	})
}

// TestTakeoverResumes: the worker holding a node's shard stops mid-
// remediation without a word (as kill -9 leaves it); once its lease
// expires another worker takes the shard, resumes the case from its
// recorded state and finishes it; nothing is enqueued twice, and the old
// worker's writes are fenced.
func TestTakeoverResumes(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, st store.Store) {
		f := newFixture(t, st, 2, config.Remediation{})
		f.answers["node_00 "+sessionv1.KindReboot] = hold
		f.xid("node_00", 79, "GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM")
		f.round()
		c := f.caseOf("node_00")
		if c.State != store.RemediationRemediating || len(c.CommandIDs) != 1 {
			t.Fatalf("before the kill: %s, commands %v", c.State, c.CommandIDs)
		}
		// w1 stops; its lease (1 min) runs out; w2 takes over.
		f.clock.Advance(2 * time.Minute)
		old := f.rec
		f.holder = "w2"
		f.rec = f.reconciler(config.Remediation{})
		delete(f.answers, "node_00 "+sessionv1.KindReboot)
		f.until(20, "returned", func() bool { return f.caseOf("node_00").State == store.RemediationReturned })
		if got := f.commandsOf("node_00"); got[sessionv1.KindReboot] != 1 || len(got) != 1 {
			t.Errorf("commands %v, want the one reboot", got)
		}
		audit, err := st.AuditQuery(f.ctx, &store.AuditQueryParams{Resource: "remediation/" + c.ID, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		actors := map[string]bool{}
		for _, a := range audit {
			actors[a.Actor] = true
		}
		if !actors["remediation:w1"] || !actors["remediation:w2"] {
			t.Errorf("audit actors %v: want both workers", actors)
		}
		// The old worker, come back with its old fence, changes nothing.
		f.xid("node_00", 79, "GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM")
		n := store.ShardOf("node_00")
		l, err := st.LeaseGet(f.ctx, "shard:"+strconv.Itoa(n))
		if err != nil {
			t.Fatal(err)
		}
		now := f.clock.Now()
		if err := old.Reconcile(f.ctx, n, store.Fence{Lease: l.Name, Holder: "w1", Epoch: l.Epoch - 1, Now: &now}); !errors.Is(err, store.ErrFenced) {
			t.Fatalf("old worker's pass: %v, want ErrFenced", err)
		}
		if c := f.caseOf("node_00"); c.State != store.RemediationReturned {
			t.Fatalf("the fenced pass opened a case: %+v", c)
		}
	})
}

// TestPolicyRefused: a policy that does not validate is refused by New,
// naming the rule at fault.
func TestPolicyRefused(t *testing.T) {
	t.Parallel()
	_, err := remediation.New(remediation.Config{Holder: "w", Settings: config.Remediation{Policy: []config.RemediationRule{
		{Resolution: "RESET_GPU", Action: "gpu.reset"}, {Resolution: "RESTART_BM", Action: "reboot-now", Line: 7}}}}, nil, nil)
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Key != "remediation.policy[1].action" || !strings.Contains(ce.Msg, "line 7") {
		t.Fatalf("err = %v", err)
	}
	p, err := remediation.NewPolicy(nil)
	if err != nil {
		t.Fatal(err)
	}
	if a := p.Action(remediation.FindingOf(&sessionv1.GPUFinding{Signal: &sessionv1.GPUFinding_Xid{Xid: &sessionv1.XIDSignal{Code: 48}}}), "WORKFLOW_XID_48"); a != config.ActionEscalate {
		t.Errorf("an unmatched resolution -> %s, want escalate", a)
	}
	ib := &sessionv1.GPUFinding{Signal: &sessionv1.GPUFinding_Infiniband{Infiniband: &sessionv1.InfiniBandSignal{Device: "mlx5_0", Port: 1}}}
	if f := remediation.FindingOf(ib); f != config.FindingInfiniBand {
		t.Errorf("FindingOf(an infiniband signal) = %s, want %s", f, config.FindingInfiniBand)
	}
	for _, r := range []string{"CHECK_MECHANICALS", "ESCALATE", "RESTART_BM"} {
		if a := p.Action(remediation.FindingOf(ib), r); a != config.ActionCordon {
			t.Errorf("an InfiniBand finding with %s -> %s, want cordon (no GPU reset, no reboot)", r, a)
		}
	}
}

// TestDrainWaitsForRunningCommands: a quarantined node's running commands
// finish before the action starts (at most drainTimeout); nothing new is
// placed on it meanwhile (it is cordoned).
func TestDrainWaitsForRunningCommands(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, st store.Store) {
		f := newFixture(t, st, 1, config.Remediation{DrainTimeout: config.Duration{Duration: 10 * time.Second}})
		f.answers["node_00 exec"] = hold
		now := f.clock.Now()
		cmds, err := st.CommandEnqueue(f.ctx, &store.CommandEnqueueParams{NodeIDs: []string{"node_00"}, Kind: "exec", CreatedBy: "t",
			Timeout: time.Hour, Now: &now})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.CommandSetState(f.ctx, &store.CommandSetStateParams{ID: cmds[0].ID, State: store.CommandRunning, GatewayID: "gw", Now: &now}); err != nil {
			t.Fatal(err)
		}
		f.xid("node_00", 95, "UNCONTAINED_ECC_ERROR", "RESET_GPU")
		for range 5 {
			f.round()
		}
		c := f.caseOf("node_00")
		if c.State != store.RemediationDraining || !strings.Contains(c.Reason, "1 running commands") || !f.node("node_00").Cordoned {
			t.Fatalf("with a command running: %s (%s)", c.State, c.Reason)
		}
		// Past drainTimeout the action starts anyway.
		f.until(10, "remediating", func() bool { return f.caseOf("node_00").State != store.RemediationDraining })
		if got := f.commandsOf("node_00"); got[sessionv1.KindGPUReset] != 1 {
			t.Fatalf("commands %v", got)
		}
		if d := f.caseOf("node_00").StateSince.Sub(c.StateSince); d < 10*time.Second {
			t.Errorf("drained for %v, want the 10 s drain timeout", d)
		}
	})
}

// TestReservedNodeIsStillRemediated: failed hardware is remediated whether
// or not the node holds a reservation (DESIGN.md, "Scheduler"): a node
// placed for an active reservation raises XID 95 and is quarantined, reset
// and returned like any other; the reservation keeps its slot.
func TestReservedNodeIsStillRemediated(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, st store.Store) {
		f := newFixture(t, st, 3, config.Remediation{})
		now := time.Now()
		r, err := st.ReservationCreate(f.ctx, &store.ReservationCreateParams{PoolID: f.pool.ID, Nodes: 1,
			Start: now.Add(-time.Minute), End: now.Add(time.Hour), Owner: "team-a"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.ReservationPlace(f.ctx, &store.ReservationPlaceParams{ID: r.ID,
			Slots: []*store.ReservationSlot{{NodeID: "node_01", GPU: 0}}}); err != nil {
			t.Fatal(err)
		}
		if got, err := st.NodeReservedNow(f.ctx, "node_01", nil); err != nil || got == nil {
			t.Fatalf("node_01 is not reserved: %v %v", got, err)
		}
		f.xid("node_01", 95, "UNCONTAINED_ECC_ERROR", "RESET_GPU")
		f.until(20, "returned", func() bool { c := f.caseOf("node_01"); return c != nil && c.State == store.RemediationReturned })
		if got := f.commandsOf("node_01"); got[sessionv1.KindGPUReset] != 1 {
			t.Errorf("reserved node's XID 95 commands %v, want one gpu.reset", got)
		}
		if got, err := st.NodeReservedNow(f.ctx, "node_01", nil); err != nil || got == nil || got.ID != r.ID {
			t.Errorf("after remediation the reservation is %v (%v), want %s still holding the node", got, err, r.ID)
		}
	})
}

// TestDefaultPolicyIssue43Findings: the default policy takes no action on
// persistence mode off (IGNORE) and on a driver that drifts from its pool's
// (UPDATE_SWFW), and escalates the fabric manager's service down or
// flapping (ESCALATE); each signal names its own finding (FindingOf), so
// an operator's rule can single it out.
func TestDefaultPolicyIssue43Findings(t *testing.T) {
	t.Parallel()
	p, err := remediation.NewPolicy(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		f               *sessionv1.GPUFinding
		finding, action string
	}{
		{&sessionv1.GPUFinding{Resolution: "IGNORE", Signal: &sessionv1.GPUFinding_Persistence{Persistence: &sessionv1.PersistenceModeSignal{}}},
			config.FindingPersistenceMode, config.ActionNone},
		{&sessionv1.GPUFinding{Resolution: "UPDATE_SWFW", Signal: &sessionv1.GPUFinding_Drift{Drift: &sessionv1.DriftSignal{DriverVersion: "535"}}},
			config.FindingDrift, config.ActionNone},
		{&sessionv1.GPUFinding{Resolution: "ESCALATE", Signal: &sessionv1.GPUFinding_FabricManager{FabricManager: &sessionv1.FabricManagerSignal{ActiveState: "failed"}}},
			config.FindingFabricManager, config.ActionEscalate},
	} {
		if got := remediation.FindingOf(c.f); got != c.finding {
			t.Errorf("FindingOf(%v) = %s, want %s", c.f, got, c.finding)
		}
		if a := p.Action(c.finding, c.f.GetResolution()); a != c.action {
			t.Errorf("%s %s -> %s, want %s", c.finding, c.f.GetResolution(), a, c.action)
		}
	}
	cordon, err := remediation.NewPolicy([]config.RemediationRule{{Finding: config.FindingPersistenceMode, Action: config.ActionCordon},
		{Action: config.ActionEscalate}})
	if err != nil {
		t.Fatal(err)
	}
	if a := cordon.Action(config.FindingPersistenceMode, "IGNORE"); a != config.ActionCordon {
		t.Errorf("an operator's persistence-mode rule -> %s, want cordon", a)
	}
}
