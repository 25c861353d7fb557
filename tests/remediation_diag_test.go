package tests

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/gputest"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/tests/testenv"
)

// dcgmDiagJSON is what `dcgmi diag -r 1 -j` prints (DCGM 3's document), with
// GPU 1's memory test in status.
func dcgmDiagJSON(status string) string {
	return `{"DCGM GPU Diagnostic": {"test_categories": [
 {"category": "Deployment", "tests": [{"name": "Denylist", "results": [{"status": "Pass"}]},
   {"name": "Persistence Mode", "results": [{"status": "Pass"}]}]},
 {"category": "Hardware", "tests": [{"name": "GPU Memory", "results": [
   {"gpu_ids": "0", "status": "Pass"},
   {"gpu_ids": "1", "status": "` + status + `", "warnings": [{"warning": "Memory error found at address 0x1fa0", "error_id": 5}]}]}]}]}}`
}

// TestDiagnosticBeforeReturn (issue 44, item 1): serve (embedded SQLite) and
// three real bcds built with nvmlmock, each given XID 95 (RESET_GPU) on GPU 1
// and reset through a stand-in nvidia-smi. Before each returns, the
// reconciler sends gpu.diag: on the node whose stand-in dcgmi reports GPU 1's
// memory test failed, the case escalates naming that test, and the node
// stays cordoned; on the node whose dcgmi passes, it returns saying so; on
// the node without dcgmi, bcd runs its built-in NVML check, and it returns.
func TestDiagnosticBeforeReturn(t *testing.T) {
	t.Parallel()
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{
		gateway: "    heartbeatInterval: 1s\n",
		top: "remediation:\n  interval: 500ms\n  verifySettle: 2s\n  verifyTimeout: 60s\n  actionTimeout: 60s\n" +
			"  verify:\n    diag: 1\n    diagTimeout: 60s\n  breaker:\n    share: 100%\n",
	})
	tokenFile, _ := d.joinToken(3, time.Hour)
	mockBCD := testenv.BinaryTags(t, "bcd", "nvmlmock")
	type machineRun struct {
		m    *machine
		node string
		stub string
		np   *testenv.Proc
	}
	run := func(name, dcgmStatus string) *machineRun {
		m := newMachine(t, name)
		r := &machineRun{m: m, node: m.mustJoin(d.gatewayURL, tokenFile), stub: t.TempDir()}
		writeScript(t, filepath.Join(r.stub, "nvidia-smi"), "#!/bin/sh\necho \"$*\" >>"+shellQuote(filepath.Join(r.stub, "nvidia-smi.log"))+"\n")
		if dcgmStatus != "" {
			doc := filepath.Join(r.stub, "diag.json")
			if err := os.WriteFile(doc, []byte(dcgmDiagJSON(dcgmStatus)), 0o600); err != nil {
				t.Fatal(err)
			}
			code := "0"
			if dcgmStatus == "Fail" {
				code = "226" // dcgmi's exit status when a test failed
			}
			writeScript(t, filepath.Join(r.stub, "dcgmi"), "#!/bin/sh\necho \"$*\" >>"+shellQuote(filepath.Join(r.stub, "dcgmi.log"))+
				"\ncat "+shellQuote(doc)+"\nexit "+code+"\n")
		}
		gm := m.tm()
		gm.BCD = mockBCD
		bin, args := gm.Argv("node", "--data-dir", m.dataDir, "--plugin-dir", t.TempDir(),
			"--bmc-file", filepath.Join(t.TempDir(), "none.yaml"))
		r.np = testenv.Start(t, []string{"PATH=" + r.stub + ":" + os.Getenv("PATH")}, bin, args...)
		r.np.WaitLine(`NVML is go-nvml's mock DGX A100`, 60*time.Second)
		r.np.WaitLine(sessionEstablished.String(), 60*time.Second)
		return r
	}
	failing, passing, builtin := run("diag-fails", "Fail"), run("diag-passes", "Pass"), run("diag-builtin", "")
	all := []*machineRun{failing, passing, builtin}
	nodeOf := func(id string) *store.Node {
		n, err := d.st.NodeGet(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	var listed struct {
		Remediations []struct {
			ID      string `json:"id"`
			GPUUUID string `json:"gpuUuid"`
			Action  string `json:"action"`
			State   string `json:"state"`
			Reason  string `json:"reason"`
		} `json:"remediations"`
	}
	caseOf := func(node string) (state, reason string) {
		d.cliJSON(&listed, d.viaAPI("remediation", "list", "--node", node)...)
		if len(listed.Remediations) != 1 {
			return "", ""
		}
		return listed.Remediations[0].State, listed.Remediations[0].Reason
	}
	for _, r := range all {
		eventually(t, 60*time.Second, func() bool {
			n := nodeOf(r.node)
			return n.State == store.NodeReady && strings.Contains(string(n.Inventory), gputest.UUID(7))
		}, func() string { return r.node + " not ready with its inventory: " + nodeOf(r.node).State })
	}
	for _, r := range all {
		if err := os.WriteFile(filepath.Join(r.m.dataDir, "nvmlmock-xids"), []byte("1 95\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		r.np.Signal(syscall.SIGUSR1)
		r.np.WaitLine(`msg="Mock XID raised" .*gpu_index=1 xid=95`, 30*time.Second)
	}
	ended := func(r *machineRun, want string) string {
		t.Helper()
		var state, reason string
		eventually(t, 120*time.Second, func() bool {
			state, reason = caseOf(r.node)
			return state == want
		}, func() string { return r.node + "'s case: " + state + ": " + reason })
		return reason
	}

	// dcgmi failing: escalated, the failed test named, the node kept out.
	reason := ended(failing, store.RemediationEscalated)
	if !strings.Contains(reason, "diagnostic failed after gpu.reset") ||
		!strings.Contains(reason, "Hardware/GPU Memory on GPU 1: Memory error found at address 0x1fa0") {
		t.Errorf("failed diagnostic's case reason %q does not name the failed test", reason)
	}
	if n := nodeOf(failing.node); !n.Cordoned {
		t.Errorf("the node whose diagnostic failed is back in service")
	}
	// dcgmi passing: returned, saying what passed.
	if reason := ended(passing, store.RemediationReturned); !strings.Contains(reason, "diagnostic passed: dcgmi diag -r 1: passed 4 tests") {
		t.Errorf("passed diagnostic's case reason %q", reason)
	}
	if n := nodeOf(passing.node); n.Cordoned {
		t.Errorf("the node whose diagnostic passed is still cordoned")
	}
	for _, r := range []*machineRun{failing, passing} {
		if b, _ := os.ReadFile(filepath.Join(r.stub, "dcgmi.log")); string(b) != "diag -r 1 -j\n" {
			t.Errorf("%s ran dcgmi with %q, want once with diag -r 1 -j", r.node, b)
		}
		if b, _ := os.ReadFile(filepath.Join(r.stub, "nvidia-smi.log")); !strings.Contains(string(b), "-r -i "+gputest.UUID(1)) {
			t.Errorf("%s was not reset: nvidia-smi %q", r.node, b)
		}
	}
	// No dcgmi: bcd's built-in NVML check (8 GPUs, 3 readings each) passes.
	if reason := ended(builtin, store.RemediationReturned); !strings.Contains(reason, "diagnostic passed: the NVML check: passed 24 tests") {
		t.Errorf("built-in check's case reason %q", reason)
	}
	if !regexp.MustCompile(`No dcgmi on this node: running the built-in NVML check instead`).MatchString(builtin.np.Output()) {
		t.Errorf("bcd without dcgmi did not say it ran the built-in check")
	}
}
