package tests

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/gputest"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// TestXIDsThatDoNotAct (issue 32, item 3): with real processes — serve
// (embedded SQLite) and a real bcd built with nvmlmock, with a stand-in
// nvidia-smi that resets — codes that do not act never act:
//
//   - XID 95 (RESET_GPU) on GPU 3 is reset; while the reset is verified,
//     XID 154 (GPU_RECOVERY_ACTION_CHANGED, "informational only") arrives on
//     GPU 3: bcd sends it as IGNORE and re-reads the driver's recovery
//     action (none), and the reset is verified and returned (one gpu.reset,
//     no reboot);
//   - then a lone XID 154 on GPU 2 (recovery action none) and XID 13
//     (RESTART_APP) ten times on GPU 4 open no case and change no health;
//     an XID 95 on GPU 5 afterwards (findings are taken oldest first) is
//     the signal that they were taken: its case is the only other one;
//   - an XID 154 on GPU 6 whose recovery action reads GPU_RESET: bcd re-reads
//     the action at the scan the XID starts, and its finding (RESET_GPU)
//     opens GPU 6's case for a gpu.reset.
func TestXIDsThatDoNotAct(t *testing.T) {
	t.Parallel()
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{
		gateway: "    heartbeatInterval: 1s\n",
		host:    "  metrics:\n    bearerToken: " + noActMetricsToken + "\n",
		// A settle long enough for an XID to land inside the
		// verification (the test waits for it there).
		// Three resets on one node within minutes: spaced by 1 s, not
		// the default 10 min (remediation.repeat.spacing).
		top: "remediation:\n  interval: 500ms\n  verifySettle: 8s\n  verifyTimeout: 60s\n  actionTimeout: 60s\n  repeat:\n    spacing: 1s\n",
	})
	tokenFile, _ := d.joinToken(1, time.Hour)
	m := newMachine(t, "gpu-noact")
	node := m.mustJoin(d.gatewayURL, tokenFile)

	dir := t.TempDir()
	stub := filepath.Join(dir, "stub")
	resets := filepath.Join(dir, "nvidia-smi.log")
	writeScript(t, filepath.Join(stub, "nvidia-smi"), "#!/bin/sh\necho \"$*\" >>"+shellQuote(resets)+"\n")
	writeScript(t, filepath.Join(stub, "systemctl"), "#!/bin/sh\necho \"$*\" >>"+shellQuote(filepath.Join(dir, "systemctl.log"))+"\n")
	gm := m.tm()
	gm.BCD = testenv.BinaryTags(t, "bcd", "nvmlmock")
	bin, args := gm.Argv("node", "--data-dir", m.dataDir, "--plugin-dir", t.TempDir(),
		"--bmc-file", filepath.Join(t.TempDir(), "none.yaml"))
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
		n := nodeOf()
		return n.State == store.NodeReady && strings.Contains(string(n.Inventory), gputest.UUID(7))
	}, func() string { return "node not ready with its inventory: " + nodeOf().State })
	raise := func(lines, pattern string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(m.dataDir, "nvmlmock-xids"), []byte(lines), 0o600); err != nil {
			t.Fatal(err)
		}
		np.Signal(syscall.SIGUSR1)
		np.WaitLine(pattern, 30*time.Second)
	}
	cases := func() []*store.Remediation {
		list, err := d.st.RemediationList(t.Context(), &store.RemediationListParams{NodeID: node})
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(list, func(a, b *store.Remediation) int { return a.CreatedAt.Compare(b.CreatedAt) })
		return list
	}
	// xidEvents returns the node's stored XID events as "code resolution
	// gpu-index".
	xidEvents := func() []string {
		es, err := d.st.EventList(t.Context(), &store.EventListParams{NodeID: node, Limit: store.MaxListLimit})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range es {
			f, err := gpufinding.Decode(e.Kind, e.Payload)
			if err != nil || f.GetXid() == nil {
				continue
			}
			idx := -1
			for i := range 8 {
				if gputest.UUID(i) == f.GetGpuUuid() {
					idx = i
				}
			}
			out = append(out, fmt.Sprintf("%d %s %d", f.GetXid().GetCode(), f.GetResolution(), idx))
		}
		return out
	}

	// XID 95 on GPU 3: reset, then XID 154 on GPU 3 while verifying.
	raise("3 95\n", `msg="Mock XID raised" .*gpu_index=3 xid=95`)
	eventually(t, 60*time.Second, func() bool {
		cs := cases()
		return len(cs) == 1 && cs[0].State == store.RemediationVerifying
	}, func() string {
		if cs := cases(); len(cs) > 0 {
			return "XID 95 case " + cs[0].State + ": " + cs[0].Reason
		}
		return "no case for XID 95"
	})
	raise("3 154\n", `msg="Mock XID raised" .*gpu_index=3 xid=154`)
	eventually(t, 30*time.Second, func() bool { return slices.Contains(xidEvents(), "154 IGNORE 3") },
		func() string { return fmt.Sprintf("XID 154 not stored as IGNORE: %q", xidEvents()) })
	if c := cases()[0]; c.State != store.RemediationVerifying {
		t.Fatalf("XID 154 stored after the verification ended (%s: %s); the settle is too short for this machine", c.State, c.Reason)
	}
	eventually(t, 60*time.Second, func() bool {
		c := cases()[0]
		return c.State == store.RemediationReturned || c.State == store.RemediationEscalated
	}, func() string { c := cases()[0]; return "XID 95 case " + c.State + " " + c.Action + ": " + c.Reason })
	c := cases()[0]
	if c.State != store.RemediationReturned || c.Action != "gpu.reset" || c.Attempts != 1 || c.GPUUUID != gputest.UUID(3) {
		t.Errorf("XID 95 case with a 154 in its verification: %s, action %s, %d attempts, gpu %s (%s); want returned after one gpu.reset",
			c.State, c.Action, c.Attempts, c.GPUUUID, c.Reason)
	}
	if b, _ := os.ReadFile(resets); string(b) != "-r -i "+gputest.UUID(3)+"\n" {
		t.Errorf("nvidia-smi was asked %q, want one reset of GPU 3", b)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "systemctl.log")); err == nil {
		t.Errorf("systemctl was asked %q, want nothing (no reboot)", b)
	}

	// A lone 154 on GPU 2 and XID 13 ten times on GPU 4, then the
	// sentinel: XID 95 on GPU 5.
	raise("2 154\n", `msg="Mock XID raised" .*gpu_index=2 xid=154`)
	raise(strings.Repeat("4 13\n", 10), `msg="Mock XID raised" .*gpu_index=4 xid=13`)
	raise("5 95\n", `msg="Mock XID raised" .*gpu_index=5 xid=95`)
	eventually(t, 60*time.Second, func() bool {
		return len(cases()) >= 2 && failedGPUs(nodeOf().Inventory) == gputest.UUID(5)
	}, func() string {
		return fmt.Sprintf("%d cases, failed GPUs %q", len(cases()), failedGPUs(nodeOf().Inventory))
	})
	cs := cases()
	if len(cs) != 2 || cs[1].GPUUUID != gputest.UUID(5) || cs[1].XID != 95 {
		for _, c := range cs {
			t.Logf("case %s: xid %d gpu %s %s", c.ID, c.XID, c.GPUUUID, c.State)
		}
		t.Fatalf("%d cases, want the first XID 95's and GPU 5's only", len(cs))
	}
	evs := xidEvents()
	for _, want := range []string{"154 IGNORE 2", "13 RESTART_APP 4", "95 RESET_GPU 5"} {
		if !slices.Contains(evs, want) {
			t.Errorf("stored XID events %q lack %q", evs, want)
		}
	}
	for _, g := range inventory(nodeOf().Inventory).GetGpus() {
		if g.GetUuid() == gputest.UUID(2) || g.GetUuid() == gputest.UUID(4) {
			if s := g.GetHealth().GetState(); s != sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK {
				t.Errorf("GPU %s after XIDs that do not act: %s %q", g.GetUuid(), s, g.GetHealth().GetReasons())
			}
		}
	}
	// /metrics counts them by code (bcd passes a code on one GPU once
	// within its 30 s dedup window: the ten XID 13s are one event).
	body := scrapeMetrics(t, d.api, noActMetricsToken)
	for _, want := range []string{`bettercompute_gpu_xids_no_action_total{code="154"} 2`, `bettercompute_gpu_xids_no_action_total{code="13"} 1`} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics lacks %s:\n%s", want, grepLines(body, "xids_no_action"))
		}
	}
	if strings.Contains(body, `bettercompute_gpu_xids_no_action_total{code="95"}`) {
		t.Errorf("/metrics counts XID 95, which acts:\n%s", grepLines(body, "xids_no_action"))
	}
	t.Logf("/metrics: %s", grepLines(body, "xids_no_action_total{"))
	// XID 154 whose recovery action reads GPU_RESET: the re-read action
	// (RESET_GPU) drives a reset of that GPU, the 154 itself nothing.
	eventually(t, 60*time.Second, func() bool { return cases()[1].State == store.RemediationReturned },
		func() string { c := cases()[1]; return "GPU 5's case " + c.State + ": " + c.Reason })
	raise(fmt.Sprintf("6 recovery %d\n6 154\n", nvml.GPU_RECOVERY_ACTION_GPU_RESET), `msg="Mock XID raised" .*gpu_index=6 xid=154`)
	eventually(t, 60*time.Second, func() bool { return len(cases()) == 3 },
		func() string { return fmt.Sprintf("%d cases, want GPU 6's", len(cases())) })
	if c := cases()[2]; c.GPUUUID != gputest.UUID(6) || c.Resolution != "RESET_GPU" || c.XID != 0 || c.Action != "gpu.reset" {
		t.Errorf("GPU 6's case: gpu %s resolution %s xid %d action %s kind %s, want a gpu.reset for the recovery action's RESET_GPU",
			c.GPUUUID, c.Resolution, c.XID, c.Action, c.Kind)
	} else {
		t.Logf("XID 154 with recovery action GPU_RESET on GPU 6: case %s kind %s resolution %s action %s", c.ID, c.Kind, c.Resolution, c.Action)
	}
	t.Logf("XID events stored before GPU 6's: %q; cases: %d (XID 95 on GPU 3 returned after one reset with a 154 in its verification, XID 95 on GPU 5, GPU 6's recovery action)", evs, len(cases()))
}

const noActMetricsToken = "noact-metrics-token-0123456789"

// scrapeMetrics GETs api's /metrics with the bearer token.
func scrapeMetrics(t *testing.T, api, token string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, api+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %d %v", res.StatusCode, err)
	}
	return string(b)
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
