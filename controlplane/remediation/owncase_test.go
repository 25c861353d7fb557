package remediation_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// xidOn makes node id report an XID on GPU uuid as the gateway records it.
func (f *fixture) xidOn(id, uuid string, code int, mnemonic, resolution string) {
	f.t.Helper()
	finding := &sessionv1.GPUFinding{GpuUuid: uuid, Resolution: resolution, ImmediateResolution: resolution,
		Signal: &sessionv1.GPUFinding_Xid{Xid: &sessionv1.XIDSignal{Code: uint32(code), Mnemonic: mnemonic}}}
	if _, err := f.st.EventInsert(f.ctx, &store.Event{NodeID: id, Kind: gpufinding.KindXID, Severity: "critical",
		Message: fmt.Sprintf("XID %d", code), GPUFinding: finding}); err != nil {
		f.t.Fatal(err)
	}
}

// inventory stores node id's inventory with GPUs, each "uuid" (healthy) or
// "uuid failed <xid> <resolution>".
func (f *fixture) inventory(id string, gpus ...string) {
	f.t.Helper()
	var parts []string
	for _, g := range gpus {
		w := strings.Fields(g)
		if len(w) == 1 {
			parts = append(parts, fmt.Sprintf(`{"uuid":%q,"health":{"state":"GPU_HEALTH_STATE_OK"}}`, w[0]))
			continue
		}
		parts = append(parts, fmt.Sprintf(`{"uuid":%q,"health":{"state":"GPU_HEALTH_STATE_FAILED","reasons":["XID %s"],"xid":%s,"resolution":%q}}`,
			w[0], w[2], w[2], w[3]))
	}
	if err := f.st.NodeSetInventory(f.ctx, id, []byte(`{"gpus":[`+strings.Join(parts, ",")+`]}`), "d-"+strings.Join(gpus, "|")); err != nil {
		f.t.Fatal(err)
	}
}

// cases returns node id's cases, oldest first.
func (f *fixture) cases(id string) []*store.Remediation {
	list, err := f.st.RemediationList(f.ctx, &store.RemediationListParams{NodeID: id})
	if err != nil {
		f.t.Fatal(err)
	}
	slices.SortFunc(list, func(a, b *store.Remediation) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return list
}

// TestVerificationJudgesItsOwnCase (issue 32, item 4): a GPU left failed by
// an earlier case (escalated, then returned by a person with the GPU still
// failed) does not keep an unrelated XID 95 case on another GPU of the node
// verifying: that case is verified on its own GPU and returned, and the
// stale GPU, read again, opens its own case.
func TestVerificationJudgesItsOwnCase(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, st store.Store) {
		f := newFixture(t, st, 1, config.Remediation{})
		id := "node_00"
		f.inventory(id, "GPU-stale failed 48 ESCALATE", "GPU-ok")
		f.xidOn(id, "GPU-ok", 95, "UNCONTAINED_ECC_ERROR", "RESET_GPU")
		f.until(20, "the XID 95 case returned", func() bool {
			cs := f.cases(id)
			return len(cs) > 0 && cs[0].State == store.RemediationReturned
		})
		cs := f.cases(id)
		if c := cs[0]; c.GPUUUID != "GPU-ok" || c.Attempts != 1 || c.Action != config.ActionGPUReset {
			t.Errorf("XID 95 case: gpu %s, %d attempts, action %s (%s), want GPU-ok, one gpu.reset", c.GPUUUID, c.Attempts, c.Action, c.Reason)
		}
		if got := f.commandsOf(id); got[sessionv1.KindGPUReset] != 1 || len(got) != 1 {
			t.Errorf("commands %v, want one gpu.reset", got)
		}
		if len(cs) != 2 {
			t.Fatalf("%d cases, want the XID 95 case and the stale GPU's own", len(cs))
		}
		if c := cs[1]; c.GPUUUID != "GPU-stale" || c.State != store.RemediationEscalated || c.XID != 48 {
			t.Errorf("stale GPU's case: gpu %s, state %s, xid %d, want GPU-stale escalated for XID 48", c.GPUUUID, c.State, c.XID)
		}
		t.Logf("cases: %s %s (%s); %s %s (%s)", cs[0].GPUUUID, cs[0].State, cs[0].Reason, cs[1].GPUUUID, cs[1].State, cs[1].Reason)
	})
}

// TestFindingOnAnotherGPUDoesNotFailVerification (issue 32, item 4): an XID
// 79 on another GPU while an XID 95 reset is verified does not fail it (no
// reboot in its ladder): the reset is verified and returned, and the other
// GPU, read again, opens its own case, which reboots the node.
func TestFindingOnAnotherGPUDoesNotFailVerification(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, st store.Store) {
		f := newFixture(t, st, 1, config.Remediation{})
		id := "node_00"
		f.inventory(id, "GPU-a", "GPU-b")
		f.xidOn(id, "GPU-a", 95, "UNCONTAINED_ECC_ERROR", "RESET_GPU")
		f.until(20, "verifying", func() bool {
			c := f.caseOf(id)
			return c != nil && c.State == store.RemediationVerifying
		})
		f.inventory(id, "GPU-a", "GPU-b failed 79 RESTART_BM")
		f.xidOn(id, "GPU-b", 79, "GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM")
		f.until(20, "the XID 95 case returned", func() bool { return f.cases(id)[0].State == store.RemediationReturned })
		cs := f.cases(id)
		if got, want := f.steps(id)[:6], []string{"detected", "quarantined", "draining", "remediating", "verifying", "returned"}; !slices.Equal(got, want) {
			t.Errorf("XID 95 case steps %v, want %v", got, want)
		}
		if c := cs[0]; c.Attempts != 1 || c.Action != config.ActionGPUReset {
			t.Errorf("XID 95 case: %d attempts, action %s (%s), want one gpu.reset", c.Attempts, c.Action, c.Reason)
		}
		if len(cs) != 2 || cs[1].GPUUUID != "GPU-b" || cs[1].Action != config.ActionReboot {
			t.Fatalf("cases %d, want the XID 95 case and GPU-b's own reboot case", len(cs))
		}
		f.inventory(id, "GPU-a", "GPU-b") // the reboot clears it
		f.until(20, "GPU-b's case returned", func() bool { return f.cases(id)[1].State == store.RemediationReturned })
		if got := f.commandsOf(id); got[sessionv1.KindGPUReset] != 1 || got[sessionv1.KindReboot] != 1 || len(got) != 2 {
			t.Errorf("commands %v, want one gpu.reset and one reboot", got)
		}
	})
}

// A finding on the case's own GPU while it is verified still fails it.
func TestFindingOnOwnGPUFailsVerification(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, st store.Store) {
		f := newFixture(t, st, 1, config.Remediation{})
		id := "node_00"
		f.xidOn(id, "GPU-a", 95, "UNCONTAINED_ECC_ERROR", "RESET_GPU")
		f.until(20, "verifying", func() bool {
			c := f.caseOf(id)
			return c != nil && c.State == store.RemediationVerifying
		})
		f.xidOn(id, "GPU-a", 95, "UNCONTAINED_ECC_ERROR", "RESET_GPU")
		f.round()
		if c := f.caseOf(id); c.Action != config.ActionReboot || c.Attempts != 2 {
			t.Errorf("after a new finding on its GPU: %s, action %s, %d attempts (%s), want the next action, a reboot", c.State, c.Action, c.Attempts, c.Reason)
		}
	})
}
