package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/gputest"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// mockGPUNode is a real bcd on the mock DGX A100 (the nvmlmock build)
// joined to d and ready with its 8 GPUs.
type mockGPUNode struct {
	t       *testing.T
	d       *deployment
	m       *machine
	np      *testenv.Proc
	id      string
	dataDir string
}

func startMockGPUNode(t *testing.T, d *deployment, name string) *mockGPUNode {
	t.Helper()
	tokenFile, _ := d.joinToken(1, time.Hour)
	m := newMachine(t, name)
	node := m.mustJoin(d.gatewayURL, tokenFile)
	gm := m.tm()
	gm.BCD = testenv.BinaryTags(t, "bcd", "nvmlmock")
	bin, args := gm.Argv("node", "--data-dir", m.dataDir, "--plugin-dir", t.TempDir(),
		"--bmc-file", filepath.Join(t.TempDir(), "none.yaml"), "--inventory-interval", "300ms")
	np := testenv.Start(t, nil, bin, args...)
	np.WaitLine(`NVML is go-nvml's mock DGX A100`, 60*time.Second)
	np.WaitLine(sessionEstablished.String(), 60*time.Second)
	n := &mockGPUNode{t: t, d: d, m: m, np: np, id: node, dataDir: m.dataDir}
	eventually(t, 60*time.Second, func() bool {
		return n.node().State == store.NodeReady && len(inventory(n.node().Inventory).GetGpus()) == 8
	}, func() string { return "node not ready with its 8 GPUs: " + n.node().State })
	return n
}

func (n *mockGPUNode) node() *store.Node {
	n.t.Helper()
	nd, err := n.d.st.NodeGet(n.t.Context(), n.id)
	if err != nil {
		n.t.Fatal(err)
	}
	return nd
}

// set writes line to the mock's reading file, signals bcd and waits for
// its log of it (logged, a regexp).
func (n *mockGPUNode) set(line, logged string) {
	n.t.Helper()
	if err := os.WriteFile(filepath.Join(n.dataDir, "nvmlmock-xids"), []byte(line+"\n"), 0o600); err != nil {
		n.t.Fatal(err)
	}
	n.np.Signal(syscall.SIGUSR1)
	n.np.WaitLine(logged, 30*time.Second)
}

// health is GPU i's health in the node's latest inventory.
func (n *mockGPUNode) health(i int) sessionv1.GPUHealthState {
	return inventory(n.node().Inventory).GetGpus()[i].GetHealth().GetState()
}

// findings returns the node's stored findings of kind, oldest first.
func (n *mockGPUNode) findings(kind string) []*sessionv1.GPUFinding {
	n.t.Helper()
	es, err := n.d.st.EventList(n.t.Context(), &store.EventListParams{NodeID: n.id, Limit: store.MaxListLimit})
	if err != nil {
		n.t.Fatal(err)
	}
	var out []*sessionv1.GPUFinding
	for i := len(es) - 1; i >= 0; i-- {
		if es[i].Kind != kind {
			continue
		}
		f, err := gpufinding.Decode(es[i].Kind, es[i].Payload)
		if err != nil {
			n.t.Fatal(err)
		}
		out = append(out, f)
	}
	return out
}

// kept returns the outcomes of the node's kept findings of kind (what the
// remediation reconciler made of each).
func (n *mockGPUNode) kept(kind string) []string {
	n.t.Helper()
	h, err := n.d.st.RemediationHistory(n.t.Context(), &store.RemediationHistoryParams{NodeID: n.id})
	if err != nil {
		n.t.Fatal(err)
	}
	var out []string
	for _, f := range h.Findings {
		if f.Kind == kind {
			out = append(out, f.Outcome)
		}
	}
	return out
}

// TestPersistenceModeFindingEndToEnd (issue 43): a real bcd on the mock
// DGX A100 reads GPU 3's persistence mode off: a gpu.persistence finding
// (degraded, IGNORE) reaches the control plane, the default policy maps it
// to none (the finding kept with outcome none, no case, the node stays in
// service); with persistence mode back on the GPU reads ok again.
func TestPersistenceModeFindingEndToEnd(t *testing.T) {
	t.Parallel()
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{
		gateway: "    heartbeatInterval: 1s\n",
		top:     "remediation:\n  interval: 300ms\n",
	})
	n := startMockGPUNode(t, d, "gpu-persistence")

	n.set("3 persistence off", `msg="Mock reading set" .*gpu_index=3 reading="persistence off"`)
	eventually(t, 60*time.Second, func() bool { return len(n.findings(gpufinding.KindPersistence)) > 0 },
		func() string { return "no gpu.persistence finding" })
	f := n.findings(gpufinding.KindPersistence)[0]
	if f.GetGpuUuid() != gputest.UUID(3) || f.GetPersistence() == nil || f.GetResolution() != "IGNORE" ||
		f.GetHealth() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED {
		t.Errorf("persistence finding = %v", f)
	}
	eventually(t, 60*time.Second, func() bool { return len(n.kept(gpufinding.KindPersistence)) > 0 },
		func() string { return "the reconciler did not take the finding" })
	if out := n.kept(gpufinding.KindPersistence); out[0] != store.FindingOutcomeNone {
		t.Errorf("outcome = %v, want none (the default policy)", out)
	}
	if c := latestCase(t, d.st, n.id); c != nil {
		t.Errorf("a case was opened: %+v", c)
	}
	eventually(t, 60*time.Second, func() bool { return n.health(3) == sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED },
		func() string { return "GPU 3 reads " + n.health(3).String() })
	if nd := n.node(); nd.Cordoned {
		t.Errorf("node cordoned for persistence mode")
	}

	n.set("3 persistence on", `msg="Mock reading set" .*gpu_index=3 reading="persistence on"`)
	eventually(t, 60*time.Second, func() bool { return n.health(3) == sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK },
		func() string { return "GPU 3 still reads " + n.health(3).String() })
}

// TestFabricManagerServiceFindingEndToEnd (issue 43): a real bcd on the
// mock DGX A100 (every GPU on an NVLink fabric) reads the
// nvidia-fabricmanager unit failed (its mock systemctl); past
// gpuHealth.fabricGrace (2 s here) it is one gpu.fabric-manager finding,
// the node's (naming no GPU; each GPU on the fabric reads degraded),
// ESCALATE, which the default policy escalates (the node
// quarantined for a person). Running again, the GPUs read ok once the
// stabilisation window (gpuHealth.fabricManagerWindow, 3 s here) has
// passed.
func TestFabricManagerServiceFindingEndToEnd(t *testing.T) {
	t.Parallel()
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{
		gateway: "    heartbeatInterval: 1s\n",
		top:     "remediation:\n  interval: 300ms\ngpuHealth:\n  fabricGrace: 2s\n  fabricManagerWindow: 3s\n",
	})
	n := startMockGPUNode(t, d, "gpu-fabric-manager")

	n.set("fabric-manager failed", `msg="Mock reading set" .*reading="fabric-manager failed"`)
	eventually(t, 60*time.Second, func() bool { return len(n.findings(gpufinding.KindFabricManager)) > 0 },
		func() string { return "no gpu.fabric-manager finding" })
	f := n.findings(gpufinding.KindFabricManager)[0]
	if s := f.GetFabricManager(); s.GetActiveState() != "failed" || s.GetDownFor().AsDuration() < 2*time.Second || f.GetGpuUuid() != "" ||
		f.GetResolution() != "ESCALATE" || f.GetHealth() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED {
		t.Errorf("fabric-manager finding = %v", f)
	}
	var c *store.Remediation
	eventually(t, 60*time.Second, func() bool {
		c = latestCase(t, d.st, n.id)
		return c != nil && c.State == store.RemediationEscalated && c.QuarantinedAt != nil
	}, func() string { return fmt.Sprintf("node not escalated: %+v", c) })
	if c.Finding != "fabric-manager" || c.Resolution != "ESCALATE" {
		t.Errorf("case = %+v", c)
	}

	eventually(t, 60*time.Second, func() bool {
		return n.health(7) == sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED
	}, func() string { return "GPU 7 reads " + n.health(7).String() })
	if got := len(n.findings(gpufinding.KindFabricManager)); got != 1 {
		t.Errorf("%d gpu.fabric-manager findings, want 1 (the node's)", got)
	}

	n.set("fabric-manager running", `msg="Mock reading set" .*reading="fabric-manager running"`)
	eventually(t, 60*time.Second, func() bool {
		for i := range 8 {
			if n.health(i) != sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK {
				return false
			}
		}
		return true
	}, func() string { return "GPU 0 still reads " + n.health(0).String() })
}
