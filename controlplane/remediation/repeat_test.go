package remediation_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// escalatedData returns the data of node id's remediation.escalated events,
// oldest first.
func (f *fixture) escalatedData(id string) []events.RemediationData {
	f.t.Helper()
	es, err := f.st.OutboxQuery(f.ctx, &store.OutboxQueryParams{Key: id, TopicPrefix: events.RemediationEscalated,
		Ascending: true, Limit: 1000})
	if err != nil {
		f.t.Fatal(err)
	}
	var out []events.RemediationData
	for _, e := range es {
		var env struct {
			Data *events.RemediationData `json:"data"`
		}
		if err := json.Unmarshal(e.Payload, &env); err != nil {
			f.t.Fatal(err)
		}
		if env.Data == nil {
			env.Data = &events.RemediationData{}
			if err := json.Unmarshal(e.Payload, env.Data); err != nil {
				f.t.Fatal(err)
			}
		}
		out = append(out, *env.Data)
	}
	return out
}

// TestRepeatOnSameGPUHolds (issue 32, item 2; NVSentinel's
// RepeatedXIDErrorOnSameGPU): XID 79 that comes back on the GPU a reboot
// was verified on holds the node for a person (one reboot in all; escalated
// with reason repeated and the first case in the event's history); more
// XID 79s add nothing; a neighbour's XID 95 meanwhile is reset and
// returned.
func TestRepeatOnSameGPUHolds(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, st store.Store) {
		f := newFixture(t, st, 2, config.Remediation{})
		f.xid("node_00", 79, "GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM")
		f.until(20, "returned", func() bool {
			c := f.caseOf("node_00")
			return c != nil && c.State == store.RemediationReturned
		})
		first := f.caseOf("node_00")
		for i := range 5 {
			f.xid("node_00", 79, "GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM")
			if i == 1 {
				f.xid("node_01", 95, "UNCONTAINED_ECC_ERROR", "RESET_GPU")
			}
			for range 10 {
				f.round()
			}
		}
		f.until(20, "neighbour returned", func() bool {
			c := f.caseOf("node_01")
			return c != nil && c.State == store.RemediationReturned
		})
		if got := f.commandsOf("node_00"); got[sessionv1.KindReboot] != 1 || len(got) != 1 {
			t.Errorf("flapping node's commands %v, want one reboot", got)
		}
		cs := f.cases("node_00")
		if len(cs) != 2 {
			t.Fatalf("flapping node has %d cases, want 2 (the reboot, the hold)", len(cs))
		}
		held := cs[1]
		if held.State != store.RemediationEscalated || !strings.HasPrefix(held.Reason, "repeated:") {
			t.Errorf("second case: state %s, reason %q; want escalated, repeated", held.State, held.Reason)
		}
		if n := f.node("node_00"); !n.Cordoned || n.Disruption != store.DisruptionQuarantined {
			t.Errorf("held node: cordoned %v, disruption %q", n.Cordoned, n.Disruption)
		}
		esc := f.escalatedData("node_00")
		if len(esc) != 1 || len(esc[0].History) != 1 || esc[0].History[0].RemediationID != first.ID ||
			esc[0].History[0].Actions != 1 {
			t.Errorf("escalated events %+v, want one carrying case %s (1 action) as history", esc, first.ID)
		}
		if got := f.commandsOf("node_01"); got[sessionv1.KindGPUReset] != 1 || len(got) != 1 {
			t.Errorf("neighbour's commands %v, want one gpu.reset", got)
		}
		t.Logf("flap: %d reboot, then held: %s", f.commandsOf("node_00")[sessionv1.KindReboot], held.Reason)
	})
}

// TestRepeatInvestigatoryAction: a repeat whose catalogue investigatory
// resolution names a rule of the policy takes that rule's action instead
// of holding.
func TestRepeatInvestigatoryAction(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, st store.Store) {
		f := newFixture(t, st, 1, config.Remediation{})
		xid := func() {
			finding := &sessionv1.GPUFinding{GpuUuid: "GPU-node_00", Resolution: "RESET_GPU", ImmediateResolution: "RESET_GPU",
				InvestigatoryResolution: "RESTART_BM",
				Signal:                  &sessionv1.GPUFinding_Xid{Xid: &sessionv1.XIDSignal{Code: 95, Mnemonic: "UNCONTAINED_ECC_ERROR"}}}
			if _, err := f.st.EventInsert(f.ctx, &store.Event{NodeID: "node_00", Kind: "gpu.xid", Severity: "critical",
				Message: "XID 95", GPUFinding: finding}); err != nil {
				t.Fatal(err)
			}
		}
		xid()
		f.until(20, "returned", func() bool {
			c := f.caseOf("node_00")
			return c != nil && c.State == store.RemediationReturned
		})
		xid()
		f.until(20, "second returned", func() bool {
			cs := f.cases("node_00")
			return len(cs) == 2 && cs[1].State == store.RemediationReturned
		})
		if got := f.commandsOf("node_00"); got[sessionv1.KindGPUReset] != 1 || got[sessionv1.KindReboot] != 1 {
			t.Errorf("commands %v, want a gpu.reset then (investigatory RESTART_BM) a reboot", got)
		}
	})
}

// TestFourthActionOnNodeHolds (issue 32, item 2; NVSentinel's
// MultipleRemediations, Meta GCM's cap): four different actionable faults
// on four GPUs of one node within an hour: three act, the fourth holds the
// node for a person with the three prior cases as history.
func TestFourthActionOnNodeHolds(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, st store.Store) {
		f := newFixture(t, st, 1, config.Remediation{})
		faults := []struct {
			code       int
			mnemonic   string
			resolution string
		}{
			{95, "UNCONTAINED_ECC_ERROR", "RESET_GPU"},
			{79, "GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM"},
			{94, "CONTAINED_ECC_ERROR", "RESET_GPU"},
			{74, "NVLINK_ERROR", "RESTART_BM"},
		}
		for i, x := range faults {
			f.xidOn("node_00", "GPU-"+string(rune('a'+i)), x.code, x.mnemonic, x.resolution)
			f.until(30, "case settled", func() bool {
				cs := f.cases("node_00")
				return len(cs) == i+1 && (cs[i].State == store.RemediationReturned || cs[i].State == store.RemediationEscalated)
			})
		}
		cs := f.cases("node_00")
		for i, c := range cs[:3] {
			if c.State != store.RemediationReturned || len(c.CommandIDs) != 1 {
				t.Errorf("fault %d: state %s, %d actions; want returned after one", i+1, c.State, len(c.CommandIDs))
			}
		}
		if c := cs[3]; c.State != store.RemediationEscalated || !strings.HasPrefix(c.Reason, "repeated:") || len(c.CommandIDs) != 0 {
			t.Errorf("fourth fault: state %s, reason %q, %d actions; want escalated, repeated, none", c.State, c.Reason, len(c.CommandIDs))
		}
		esc := f.escalatedData("node_00")
		if len(esc) != 1 || len(esc[0].History) != 3 {
			t.Errorf("escalated events %+v, want one with the three prior cases", esc)
		}
		if n := f.node("node_00"); !n.Cordoned || n.Disruption != store.DisruptionQuarantined {
			t.Errorf("held node: cordoned %v, disruption %q", n.Cordoned, n.Disruption)
		}
		t.Logf("fourth fault held: %s", cs[3].Reason)
	})
}
