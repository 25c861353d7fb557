package remediation_test

import (
	"strings"
	"testing"

	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// A node whose GPU reads healthy after its reset runs the diagnostic of
// remediation.verify before it returns: passing, it returns with the
// diagnostic in the reason; failing, the case escalates with the failed test
// named and the node stays cordoned; with diag none no diagnostic runs. The
// diagnostic is a check, not an action: the repeat rules never count it.
func TestDiagnosticBeforeReturn(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, st store.Store) {
		f := newFixture(t, st, 2, config.Remediation{Verify: config.RemediationVerify{Diag: "2"}})
		f.answers["node_01 "+sessionv1.KindGPUDiag] = fail
		f.xidOn("node_00", "GPU-a", 95, "UNCONTAINED_ECC_ERROR", "RESET_GPU")
		f.xidOn("node_01", "GPU-b", 95, "UNCONTAINED_ECC_ERROR", "RESET_GPU")
		f.until(30, "both cases ended", func() bool {
			a, b := f.caseOf("node_00"), f.caseOf("node_01")
			return a != nil && b != nil && a.State == store.RemediationReturned && b.State == store.RemediationEscalated
		})
		passed, failed := f.caseOf("node_00"), f.caseOf("node_01")
		if !strings.Contains(passed.Reason, "diagnostic passed: dcgmi diag -r 2: passed 12 tests") {
			t.Errorf("returned case's reason %q does not say the diagnostic passed", passed.Reason)
		}
		if !strings.Contains(failed.Reason, "diagnostic failed after gpu.reset") ||
			!strings.Contains(failed.Reason, "Hardware/GPU Memory on GPU 0: Memory error found at address 0x1000") {
			t.Errorf("escalated case's reason %q does not name the failed test", failed.Reason)
		}
		if n := f.node("node_00"); n.Cordoned || n.Disruption != "" {
			t.Errorf("passed node: cordoned %v, disruption %q", n.Cordoned, n.Disruption)
		}
		if n := f.node("node_01"); !n.Cordoned || n.Disruption == "" {
			t.Errorf("failed node back in service: cordoned %v, disruption %q", n.Cordoned, n.Disruption)
		}
		for _, c := range []*store.Remediation{passed, failed} {
			if len(c.CommandIDs) != 1 {
				t.Errorf("case %s lists %d actions %v, want its one gpu.reset (the diagnostic is no action)", c.ID, len(c.CommandIDs), c.CommandIDs)
			}
		}
		for _, id := range []string{"node_00", "node_01"} {
			if n := f.diagsOf(id); n != 1 {
				t.Errorf("%s ran %d diagnostics, want 1", id, n)
			}
		}
		cmds, err := f.st.CommandList(f.ctx, &store.CommandListParams{NodeID: "node_00"})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cmds {
			spec := &sessionv1.Command{}
			if c.Kind != sessionv1.KindGPUDiag {
				continue
			}
			if err := sessionv1.UnmarshalSpec(c.SessionSpec, spec); err != nil || spec.GetGpuDiag().GetLevel() != 2 ||
				spec.GetGpuDiag().GetGpuUuid() != "GPU-a" {
				t.Errorf("diagnostic spec %s (%v): want level 2 for GPU-a", c.SessionSpec, err)
			}
		}
	})
}

// With remediation.verify.diag none, a node returns on its health alone.
func TestNoDiagnosticWhenNone(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, st store.Store) {
		g := newFixture(t, st, 1, config.Remediation{Verify: config.RemediationVerify{Diag: config.DiagNone}})
		g.xidOn("node_00", "GPU-c", 95, "UNCONTAINED_ECC_ERROR", "RESET_GPU")
		g.until(30, "returned", func() bool { c := g.caseOf("node_00"); return c != nil && c.State == store.RemediationReturned })
		if n := g.diagsOf("node_00"); n != 0 || strings.Contains(g.caseOf("node_00").Reason, "diagnostic") {
			t.Errorf("diag none ran %d diagnostics (reason %q)", n, g.caseOf("node_00").Reason)
		}
	})
}
