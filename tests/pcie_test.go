package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/gputest"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestPCIeFindingsEndToEnd (issue 43): with serve (embedded SQLite) and a
// real bcd built with nvmlmock, each PCIe signal reaches the control plane
// as a typed gpu.pcie finding, opens a case with the action the policy
// maps it to, and clears from the GPU's health when its cause ends. The
// thresholds are the control plane's gpuHealth.* (a replay threshold of
// 50 in a 4 s window, below bcd's default of 100: the finding shows that
// Welcome carried them):
//
//   - GPU 2's link retrains to x8: CHECK_MECHANICALS, cordoned; back at
//     x16 the GPU reads ok;
//   - GPU 3's replay counter rises by 60: CHECK_MECHANICALS, cordoned; the
//     GPU reads ok once the window has passed;
//   - the kernel logs a fatal AER error for GPU 4's address: RESTART_BM,
//     the reboot the policy names; the GPU reads ok once the hold (4 s) has
//     passed without another line.
func TestPCIeFindingsEndToEnd(t *testing.T) {
	t.Parallel()
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{
		gateway: "    heartbeatInterval: 1s\n",
		top: "remediation:\n  interval: 300ms\n  verifyTimeout: 10m\n  policy:\n" +
			"  - {resolution: CHECK_MECHANICALS, action: cordon}\n  - {resolution: RESTART_BM, action: reboot}\n  - {action: escalate}\n" +
			"gpuHealth:\n  pcieReplayThreshold: 50\n  pcieReplayWindow: 4s\n  logFindingHold: 4s\n",
	})
	tokenFile, _ := d.joinToken(1, time.Hour)
	m := newMachine(t, "gpu-pcie")
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
	eventually(t, 60*time.Second, func() bool {
		return nodeOf().State == store.NodeReady && len(inventory(nodeOf().Inventory).GetGpus()) == 8
	}, func() string { return "node not ready with its 8 GPUs: " + nodeOf().State })
	raise := func(lines, pattern string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(m.dataDir, "nvmlmock-xids"), []byte(lines), 0o600); err != nil {
			t.Fatal(err)
		}
		np.Signal(syscall.SIGUSR1)
		np.WaitLine(pattern, 30*time.Second)
	}
	health := func(i int) sessionv1.GPUHealthState {
		return inventory(nodeOf().Inventory).GetGpus()[i].GetHealth().GetState()
	}
	// finding waits for the node's gpu.pcie finding of GPU i that ok
	// accepts.
	finding := func(i int, ok func(*sessionv1.GPUFinding) bool) *sessionv1.GPUFinding {
		t.Helper()
		var got *sessionv1.GPUFinding
		var seen []string
		eventually(t, 60*time.Second, func() bool {
			es, err := d.st.EventList(t.Context(), &store.EventListParams{NodeID: node, Limit: store.MaxListLimit})
			if err != nil {
				t.Fatal(err)
			}
			seen = seen[:0]
			for _, e := range es {
				f, err := gpufinding.Decode(e.Kind, e.Payload)
				if err != nil || e.Kind != gpufinding.KindPCIe {
					continue
				}
				seen = append(seen, fmt.Sprint(f))
				if f.GetGpuUuid() == gputest.UUID(i) && gpufinding.SignalOf(f) == gpufinding.SignalPCIe && ok(f) {
					got = f
					return true
				}
			}
			return false
		}, func() string { return fmt.Sprintf("no such gpu.pcie finding of GPU %d; stored: %q", i, seen) })
		return got
	}
	// openCase waits for the node's open case and checks its GPU, finding
	// and action.
	openCase := func(i int, action string) *store.Remediation {
		t.Helper()
		var c *store.Remediation
		eventually(t, 60*time.Second, func() bool {
			c = latestCase(t, d.st, node)
			return c != nil && c.ClosedAt == nil && c.GPUUUID == gputest.UUID(i) && c.Action == action && c.QuarantinedAt != nil
		}, func() string { return fmt.Sprintf("no open case of GPU %d with action %s: %+v", i, action, c) })
		if c.Finding != "health" {
			t.Errorf("case %s: finding %q, want health (remediation.FindingOf of a pcie signal)", c.ID, c.Finding)
		}
		return c
	}
	reads := func(i int, want sessionv1.GPUHealthState) {
		t.Helper()
		eventually(t, 60*time.Second, func() bool { return health(i) == want },
			func() string { return fmt.Sprintf("GPU %d reads %s, want %s", i, health(i), want) })
	}
	cleared := func(i int) {
		t.Helper()
		eventually(t, 60*time.Second, func() bool { return health(i) == sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK },
			func() string { return fmt.Sprintf("GPU %d still %s", i, health(i)) })
	}

	// A link below its maximum width.
	raise("2 pcie-width 8\n", `msg="Mock reading set" .*gpu_index=2 reading="pcie-width 8"`)
	f := finding(2, func(f *sessionv1.GPUFinding) bool { return f.GetPcie().GetLinkWidth() == 8 })
	if p := f.GetPcie(); p.GetMaxLinkWidth() != 16 || p.GetLinkGeneration() != 4 || f.GetResolution() != "CHECK_MECHANICALS" ||
		f.GetHealth() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED || f.GetEvidence().GetSource() != "scan" ||
		f.GetEvidence().GetCounters()["pcieLinkWidth"] != 8 {
		t.Errorf("width finding = %v", f)
	}
	c := openCase(2, "cordon")
	reads(2, sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED)
	raise("2 pcie-width 0\n", `msg="Mock reading set" .*gpu_index=2 reading="pcie-width 0"`)
	cleared(2)
	d.cli("remediation", "return", c.ID, "--note", "reseated GPU 2")

	// Replays rising past the configured threshold within the window.
	raise("3 pcie-replay 60\n", `msg="Mock reading set" .*gpu_index=3 reading="pcie-replay 60"`)
	f = finding(3, func(f *sessionv1.GPUFinding) bool { return f.GetPcie().GetReplays() > 0 })
	if p := f.GetPcie(); p.GetReplays() != 60 || p.GetWindow().AsDuration() != 4*time.Second || f.GetResolution() != "CHECK_MECHANICALS" {
		t.Errorf("replay finding = %v (want a rise of 60 in the configured 4 s window)", f)
	}
	c = openCase(3, "cordon")
	reads(3, sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED)
	cleared(3) // the counter stays at 60: no rise once the window has passed
	d.cli("remediation", "return", c.ID, "--note", "cable replaced")

	// A fatal AER error in the kernel log.
	raise("4 aer fatal\n", `msg="Mock reading set" .*gpu_index=4 reading="aer fatal"`)
	f = finding(4, func(f *sessionv1.GPUFinding) bool { return f.GetPcie().GetAerSeverity() == "fatal" })
	if f.GetResolution() != "RESTART_BM" || f.GetHealth() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED ||
		f.GetEvidence().GetSource() != "kmsg" || !strings.Contains(f.GetEvidence().GetLogLine(), "severity=Uncorrected (Fatal)") {
		t.Errorf("AER finding = %v", f)
	}
	openCase(4, "reboot")
	reads(4, sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED)
	cleared(4)
}
