package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/gputest"
	"github.com/better-compute/better-compute/controlplane/pkg/gpucount"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestGPUCountMissingGPUQuarantinesNode (issue 43): a real bcd on the
// mock DGX A100 (nvmlmock) joins with 8 GPUs, and the control plane takes
// 8 as the node's expected count (label better-compute.io/gpu-count). GPU
// 5 falls off the bus: NVML answers 7 devices, and the control plane
// stores a gpu.missing finding naming GPU 5's UUID (from bcd's record of
// the GPUs it has seen), RESTART_BM, and quarantines the node with the
// default policy's reboot. The case is verified only once the GPU is
// listed again. An operator then acknowledges 7 GPUs (nodes
// set-gpu-count, audited): the next inventory of 7 is no finding.
func TestGPUCountMissingGPUQuarantinesNode(t *testing.T) {
	t.Parallel()
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{
		gateway: "    heartbeatInterval: 1s\n",
		top:     "remediation:\n  interval: 300ms\n  verifySettle: 1s\n  verifyTimeout: 10m\n",
	})
	tokenFile, _ := d.joinToken(1, time.Hour)
	m := newMachine(t, "gpu-count")
	node := m.mustJoin(d.gatewayURL, tokenFile)
	stub := filepath.Join(t.TempDir(), "stub")
	writeScript(t, filepath.Join(stub, "systemctl"), "#!/bin/sh\necho \"$*\" >>"+shellQuote(filepath.Join(t.TempDir(), "systemctl.log"))+"\n")
	gm := m.tm()
	gm.BCD = testenv.BinaryTags(t, "bcd", "nvmlmock")
	bin, args := gm.Argv("node", "--data-dir", m.dataDir, "--plugin-dir", t.TempDir(),
		"--bmc-file", filepath.Join(t.TempDir(), "none.yaml"), "--inventory-interval", "300ms")
	np := testenv.Start(t, []string{"PATH=" + stub + ":" + os.Getenv("PATH")}, bin, args...)
	np.WaitLine(`NVML is go-nvml's mock DGX A100`, 60*time.Second)
	np.WaitLine(sessionEstablished.String(), 60*time.Second)
	nodeOf := func() *store.Node {
		n, err := d.st.NodeGet(t.Context(), node)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	eventually(t, 60*time.Second, func() bool { return nodeOf().Labels[gpucount.Label] == "8" },
		func() string {
			return fmt.Sprintf("expected count not taken from the first inventory: labels %v", nodeOf().Labels)
		})
	if b, err := os.ReadFile(filepath.Join(m.dataDir, "gpus-seen.json")); err != nil || !strings.Contains(string(b), gputest.UUID(7)) {
		t.Errorf("bcd's record of the GPUs seen: %s, %v", b, err)
	}
	raise := func(lines, pattern string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(m.dataDir, "nvmlmock-xids"), []byte(lines), 0o600); err != nil {
			t.Fatal(err)
		}
		np.Signal(syscall.SIGUSR1)
		np.WaitLine(pattern, 30*time.Second)
	}
	missing := func() []*sessionv1.GPUFinding {
		es, err := d.st.EventList(t.Context(), &store.EventListParams{NodeID: node, Limit: store.MaxListLimit})
		if err != nil {
			t.Fatal(err)
		}
		var out []*sessionv1.GPUFinding
		for _, e := range es {
			if e.Kind != gpufinding.KindGPUMissing {
				continue
			}
			f, err := gpufinding.Decode(e.Kind, e.Payload)
			if err != nil {
				t.Fatalf("event %d: %v", e.ID, err)
			}
			out = append(out, f)
		}
		return out
	}

	raise("5 remove\n", `msg="Mock reading set" .*gpu_index=5 reading=remove`)
	eventually(t, 60*time.Second, func() bool { return len(missing()) > 0 }, func() string { return "no gpu.missing finding" })
	f := missing()[0]
	if f.GetGpuUuid() != gputest.UUID(5) || f.GetResolution() != "RESTART_BM" || f.GetGpuMissing().GetExpected() != 8 ||
		f.GetGpuMissing().GetPresent() != 7 || f.GetHealth() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED {
		t.Errorf("gpu.missing finding = %v", f)
	}
	var c *store.Remediation
	eventually(t, 60*time.Second, func() bool {
		c = latestCase(t, d.st, node)
		return c != nil && c.QuarantinedAt != nil && c.Action == "reboot"
	}, func() string { return fmt.Sprintf("node not quarantined for a reboot: %+v", c) })
	if c.GPUUUID != gputest.UUID(5) || c.Resolution != "RESTART_BM" || c.Finding != "gpu-lost" || !nodeOf().Cordoned {
		t.Errorf("case = %+v, node cordoned %v", c, nodeOf().Cordoned)
	}

	// The GPU comes back (the mock does not reboot: the stand-in systemctl
	// only records): the node reads 8 GPUs again.
	raise("5 restore\n", `msg="Mock reading set" .*gpu_index=5 reading=restore`)
	eventually(t, 60*time.Second, func() bool { return len(inventory(nodeOf().Inventory).GetGpus()) == 8 },
		func() string { return "GPU 5 not listed again" })

	// An intended change: 7 GPUs from now on.
	before := d.snapshot()
	out := d.cli("nodes", "set-gpu-count", node, "7")
	if !strings.Contains(out, gpucount.Label+"=7") {
		t.Errorf("nodes set-gpu-count printed\n%s\nwant the label %s=7", out, gpucount.Label)
	}
	if n := nodeOf(); n.Labels[gpucount.Label] != "7" {
		t.Errorf("labels after set-gpu-count: %v", n.Labels)
	}
	rows, err := d.st.AuditList(t.Context(), before.audit, 500)
	if err != nil {
		t.Fatal(err)
	}
	var audited []string
	for _, e := range rows {
		audited = append(audited, e.Action+" "+e.Resource+" "+e.Outcome)
	}
	if !slices.ContainsFunc(audited, func(a string) bool { return strings.HasPrefix(a, "nodes.setGPUCount") }) {
		t.Errorf("nodes.setGPUCount not audited: %q", audited)
	}
	n := len(missing())
	raise("3 remove\n", `msg="Mock reading set" .*gpu_index=3 reading=remove`)
	eventually(t, 60*time.Second, func() bool { return len(inventory(nodeOf().Inventory).GetGpus()) == 7 },
		func() string { return "GPU 3 not gone from the inventory" })
	time.Sleep(time.Second) // a finding would be stored with the inventory that showed it
	if got := len(missing()); got != n {
		t.Errorf("7 of 7 expected GPUs gave a finding: %v", missing()[n:])
	}
}
