package remediation_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// catalogued makes node id's GPU uuid report XID code with the catalogue's
// immediate and investigatory resolutions, as the gateway records it.
func (f *fixture) catalogued(id, uuid string, code int, mnemonic, immediate, investigatory string) {
	f.t.Helper()
	finding := &sessionv1.GPUFinding{GpuUuid: uuid, BoardSerial: "serial-" + uuid, Resolution: immediate,
		ImmediateResolution: immediate, InvestigatoryResolution: investigatory,
		Signal: &sessionv1.GPUFinding_Xid{Xid: &sessionv1.XIDSignal{Code: uint32(code), Mnemonic: mnemonic}}}
	if _, err := f.st.EventInsert(f.ctx, &store.Event{NodeID: id, Kind: gpufinding.KindXID, Severity: "warning",
		Message: fmt.Sprintf("XID %d", code), GPUFinding: finding}); err != nil {
		f.t.Fatal(err)
	}
}

// TestActionsSpacedOnNode (issue 32, item 2; remediation.repeat.spacing,
// after Meta GCM's cooldown per node): with the default spacing of 10 min,
// doubling after each, on an injected clock: the node's second automatic
// action waits 10 min after its first, the third 20 min after the second;
// the waiting case says why.
func TestActionsSpacedOnNode(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, st store.Store) {
		f := newFixture(t, st, 1, config.Remediation{Repeat: config.RemediationRepeat{
			Spacing: config.Duration{Duration: 10 * time.Minute}}})
		resets := func() []*store.Command {
			cmds, err := f.st.CommandList(f.ctx, &store.CommandListParams{NodeID: "node_00"})
			if err != nil {
				t.Fatal(err)
			}
			return slices.DeleteFunc(cmds, func(c *store.Command) bool { return c.Kind == sessionv1.KindGPUDiag })
		}
		returned := func(n int) func() bool {
			return func() bool {
				cs := f.cases("node_00")
				return len(cs) == n && cs[n-1].State == store.RemediationReturned
			}
		}
		f.xidOn("node_00", "GPU-a", 95, "UNCONTAINED_ERROR", "RESET_GPU")
		f.until(20, "first returned", returned(1))
		first := resets()[0].CreatedAt

		// The second fault, at once: it waits, draining, for 10 min
		// after the first reset.
		f.xidOn("node_00", "GPU-b", 95, "UNCONTAINED_ERROR", "RESET_GPU")
		for range 5 {
			f.round()
		}
		c := f.caseOf("node_00")
		if c.State != store.RemediationDraining || !strings.HasPrefix(c.Reason, "spacing:") || len(resets()) != 1 {
			t.Fatalf("second case %s (%s) with %d commands; want draining for the spacing, one command", c.State, c.Reason, len(resets()))
		}
		t.Logf("second case waits: %s", c.Reason)
		f.clock.Advance(first.Add(10*time.Minute - 2*time.Second).Sub(f.clock.Now()))
		f.round()
		if n := len(resets()); n != 1 {
			t.Fatalf("%d commands before 10 min, want 1", n)
		}
		f.until(20, "second returned", returned(2))
		cmds := resets()
		second := cmds[0].CreatedAt
		for _, c := range cmds {
			if c.CreatedAt.After(second) {
				second = c.CreatedAt
			}
		}
		if gap := second.Sub(first); gap < 10*time.Minute {
			t.Errorf("second action %v after the first, want at least 10m", gap)
		}

		// The third: 20 min after the second.
		f.xidOn("node_00", "GPU-c", 95, "UNCONTAINED_ERROR", "RESET_GPU")
		f.clock.Advance(second.Add(20*time.Minute - 2*time.Second).Sub(f.clock.Now()))
		f.round()
		if n := len(resets()); n != 2 {
			t.Fatalf("%d commands before 20 min after the second, want 2", n)
		}
		if c := f.caseOf("node_00"); !strings.Contains(c.Reason, "20m0s after the last") {
			t.Errorf("third case waits with reason %q, want the doubled spacing", c.Reason)
		}
		f.until(20, "third returned", returned(3))
	})
}

// TestContactSupportRepeatHolds (issue 32, item 3): XID 13 (RESTART_APP,
// investigatory WORKFLOW_XID_13) ten times on one GPU: no case, no hold,
// the count in the GPU's history; XID 92 (IGNORE, investigatory
// CONTACT_SUPPORT) four times: nothing, the fifth: one case held for a
// person (escalated, reason repeated), more add nothing. The GPU's
// history lists its findings only.
func TestContactSupportRepeatHolds(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, st store.Store) {
		f := newFixture(t, st, 1, config.Remediation{})
		for range 10 {
			f.catalogued("node_00", "GPU-13", 13, "GR_EXCEPTION", "RESTART_APP", "WORKFLOW_XID_13")
			f.round()
		}
		if cs := f.cases("node_00"); len(cs) != 0 {
			t.Fatalf("%d cases after XID 13 ten times, want none", len(cs))
		}
		h, err := f.st.RemediationHistory(f.ctx, &store.RemediationHistoryParams{GPUUUID: "GPU-13"})
		if err != nil {
			t.Fatal(err)
		}
		if len(h.Findings) != 10 || len(h.Counts) != 1 || h.Counts[0].Count != 10 || h.Counts[0].XID != 13 {
			t.Fatalf("GPU-13's history: %d findings, counts %+v; want 10, one count of 10", len(h.Findings), h.Counts)
		}
		if fd := h.Findings[0]; fd.Outcome != store.FindingOutcomeNone || fd.BoardSerial != "serial-GPU-13" ||
			fd.Investigatory != "WORKFLOW_XID_13" {
			t.Errorf("kept finding %+v", fd)
		}
		for i := range 7 {
			f.catalogued("node_00", "GPU-92", 92, "EXCESSIVE_SBE_INTERRUPTS", "IGNORE", "CONTACT_SUPPORT")
			f.round()
			if n := len(f.cases("node_00")); (i < 4 && n != 0) || (i >= 4 && n != 1) {
				t.Fatalf("after XID 92 %d times: %d cases", i+1, n)
			}
		}
		c := f.caseOf("node_00")
		if c.State != store.RemediationEscalated || !strings.HasPrefix(c.Reason, "repeated:") || c.GPUUUID != "GPU-92" ||
			len(c.CommandIDs) != 0 {
			t.Errorf("XID 92's case: %s, reason %q, gpu %s, %d actions; want escalated, repeated, GPU-92, none",
				c.State, c.Reason, c.GPUUUID, len(c.CommandIDs))
		}
		if n := f.node("node_00"); !n.Cordoned || n.Disruption != store.DisruptionQuarantined {
			t.Errorf("held node: cordoned %v, disruption %q", n.Cordoned, n.Disruption)
		}
		h, err = f.st.RemediationHistory(f.ctx, &store.RemediationHistoryParams{GPUUUID: "GPU-92"})
		if err != nil {
			t.Fatal(err)
		}
		outcomes := map[string]int{}
		for _, fd := range h.Findings {
			if fd.GPUUUID != "GPU-92" {
				t.Errorf("GPU-92's history holds a finding of %s", fd.GPUUUID)
			}
			outcomes[fd.Outcome]++
		}
		if len(h.Findings) != 7 || outcomes[store.FindingOutcomeHeld] != 1 || len(h.Cases) != 1 || h.Cases[0].ID != c.ID {
			t.Errorf("GPU-92's history: findings by outcome %v, %d cases; want 7 (one held), the one case", outcomes, len(h.Cases))
		}
		t.Logf("XID 92 held: %s", c.Reason)
	})
}
