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

// TestFabricManagerFindingEndToEnd (issue 43): a real bcd on the mock DGX
// A100 (nvmlmock) reads GPU 1's NVLink fabric state stuck in progress; past
// the control plane's gpuHealth.fabricGrace (2 s here, sent in Welcome) it
// is a gpu.fabric finding, ESCALATE, which the default policy escalates
// (the node quarantined for a person); once the state reads completed the
// GPU reads ok again.
func TestFabricManagerFindingEndToEnd(t *testing.T) {
	t.Parallel()
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{
		gateway: "    heartbeatInterval: 1s\n",
		top:     "remediation:\n  interval: 300ms\ngpuHealth:\n  fabricGrace: 2s\n",
	})
	tokenFile, _ := d.joinToken(1, time.Hour)
	m := newMachine(t, "gpu-fabric")
	node := m.mustJoin(d.gatewayURL, tokenFile)
	gm := m.tm()
	gm.BCD = testenv.BinaryTags(t, "bcd", "nvmlmock")
	bin, args := gm.Argv("node", "--data-dir", m.dataDir, "--plugin-dir", t.TempDir(),
		"--bmc-file", filepath.Join(t.TempDir(), "none.yaml"), "--inventory-interval", "300ms")
	np := testenv.Start(t, nil, bin, args...)
	np.WaitLine(`NVML is go-nvml's mock DGX A100`, 60*time.Second)
	np.WaitLine(sessionEstablished.String(), 60*time.Second)
	nodeOf := func() *store.Node {
		n, err := d.st.NodeGet(t.Context(), node)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	eventually(t, 60*time.Second, func() bool {
		return nodeOf().State == store.NodeReady && len(inventory(nodeOf().Inventory).GetGpus()) == 8
	}, func() string { return "node not ready with its 8 GPUs: " + nodeOf().State })
	health := func() sessionv1.GPUHealthState {
		return inventory(nodeOf().Inventory).GetGpus()[1].GetHealth().GetState()
	}

	if err := os.WriteFile(filepath.Join(m.dataDir, "nvmlmock-xids"), []byte("1 fabric 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	np.Signal(syscall.SIGUSR1)
	np.WaitLine(`msg="Mock reading set" .*gpu_index=1 reading="fabric 2"`, 30*time.Second)
	var f *sessionv1.GPUFinding
	eventually(t, 60*time.Second, func() bool {
		es, err := d.st.EventList(t.Context(), &store.EventListParams{NodeID: node, Limit: store.MaxListLimit})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			if e.Kind == gpufinding.KindFabric {
				if f, err = gpufinding.Decode(e.Kind, e.Payload); err != nil {
					t.Fatal(err)
				}
				return true
			}
		}
		return false
	}, func() string { return "no gpu.fabric finding" })
	if f.GetGpuUuid() != gputest.UUID(1) || f.GetFabric().GetState() != "IN_PROGRESS" || f.GetFabric().GetFor().AsDuration() < 2*time.Second ||
		f.GetResolution() != "ESCALATE" || f.GetHealth() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED {
		t.Errorf("fabric finding = %v", f)
	}
	var c *store.Remediation
	eventually(t, 60*time.Second, func() bool {
		c = latestCase(t, d.st, node)
		return c != nil && c.State == store.RemediationEscalated && c.QuarantinedAt != nil
	}, func() string { return fmt.Sprintf("node not escalated: %+v", c) })
	if c.GPUUUID != gputest.UUID(1) || c.Finding != "health" || c.Resolution != "ESCALATE" {
		t.Errorf("case = %+v", c)
	}
	eventually(t, 60*time.Second, func() bool { return health() == sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED },
		func() string { return "GPU 1 reads " + health().String() })

	if err := os.WriteFile(filepath.Join(m.dataDir, "nvmlmock-xids"), []byte("1 fabric 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	np.Signal(syscall.SIGUSR1)
	np.WaitLine(`msg="Mock reading set" .*gpu_index=1 reading="fabric 3"`, 30*time.Second)
	eventually(t, 60*time.Second, func() bool { return health() == sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK },
		func() string { return "GPU 1 still reads " + health().String() })
}
