package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
	"github.com/better-compute/better-compute/tests/testenv"
)

// ibFixture is a sysfs tree of InfiniBand ports, for bcd node --sysfs-root.
type ibFixture struct {
	t    *testing.T
	root string
}

func (f *ibFixture) write(rel, content string) {
	f.t.Helper()
	p := filepath.Join(f.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		f.t.Fatal(err)
	}
	// Written whole and renamed in place, so that a scan never reads half.
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(content+"\n"), 0o644); err != nil {
		f.t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		f.t.Fatal(err)
	}
}

// port writes an up port, its counters at 0, of a device at pci.
func (f *ibFixture) port(dev string, n int, pci string) {
	f.t.Helper()
	f.write("class/infiniband/"+dev+"/device/uevent", "DRIVER=mlx5_core\nPCI_SLOT_NAME="+pci)
	for file, v := range map[string]string{"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": "400 Gb/sec (4X NDR)",
		"link_layer": "InfiniBand", "counters/link_downed": "0", "counters/link_error_recovery": "0", "counters/symbol_error": "0",
		"counters/port_rcv_errors": "0", "counters/excessive_buffer_overrun_errors": "0"} {
		f.set(dev, n, file, v)
	}
}

func (f *ibFixture) set(dev string, n int, file, v string) {
	f.t.Helper()
	f.write(fmt.Sprintf("class/infiniband/%s/ports/%d/%s", dev, n, file), v)
}

// TestInfiniBandFindingsEndToEnd (issue 43): a real bcd (the nvmlmock
// build, for its kernel log file) reads two InfiniBand ports from a sysfs
// fixture (--sysfs-root). The ports are in the node's inventory and in
// nodes get; each finding reaches the control plane as a typed ib.port
// finding, the default policy cordons the node for it (finding
// infiniband: no GPU reset, no reboot), and the port reads ok again once
// the cause has ended. The thresholds are the control plane's
// gpuHealth.ib* (sent in Welcome; smaller than bcd's defaults, so the
// findings show they arrived):
//
//   - mlx5_0/1's link_downed rises: a flap episode, cleared after the
//     stabilisation window (3 s) without another flap;
//   - mlx5_1/1's symbol errors rise by 20 (threshold 5 in 3 s): cleared
//     once the window passes without a rise;
//   - the kernel logs an mlx5_core fatal error for mlx5_0's address: the
//     device's port fails, until the hold (3 s) has passed.
func TestInfiniBandFindingsEndToEnd(t *testing.T) {
	t.Parallel()
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{
		gateway: "    heartbeatInterval: 1s\n",
		top: "remediation:\n  interval: 300ms\n  verifyTimeout: 10m\n" +
			"gpuHealth:\n  ibErrorThreshold: 5\n  ibErrorWindow: 3s\n  ibFlapWindow: 3s\n  ibDownGrace: 1s\n  logFindingHold: 3s\n",
	})
	tokenFile, _ := d.joinToken(1, time.Hour)
	m := newMachine(t, "ib-node")
	node := m.mustJoin(d.gatewayURL, tokenFile)
	fx := &ibFixture{t: t, root: t.TempDir()}
	fx.port("mlx5_0", 1, "0000:3b:00.0")
	fx.port("mlx5_1", 1, "0000:86:00.0")
	gm := m.tm()
	gm.BCD = testenv.BinaryTags(t, "bcd", "nvmlmock")
	bin, args := gm.Argv("node", "--data-dir", m.dataDir, "--plugin-dir", t.TempDir(),
		"--bmc-file", filepath.Join(t.TempDir(), "none.yaml"), "--inventory-interval", "300ms", "--sysfs-root", fx.root)
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
	port := func(key string) *sessionv1.InfiniBandPort {
		for _, p := range inventory(nodeOf().Inventory).GetIbPorts() {
			if fmt.Sprintf("%s/%d", p.GetDevice(), p.GetPort()) == key {
				return p
			}
		}
		return nil
	}
	eventually(t, 60*time.Second, func() bool {
		return nodeOf().State == store.NodeReady && port("mlx5_0/1") != nil && port("mlx5_1/1") != nil
	}, func() string { return "node not ready with its 2 InfiniBand ports: " + nodeOf().State })
	if p := port("mlx5_0/1"); p.GetState() != "ACTIVE" || p.GetPhysState() != "LinkUp" || p.GetPciBusId() != "0000:3b:00.0" ||
		p.GetRate() != "400 Gb/sec (4X NDR)" || p.GetLinkLayer() != "InfiniBand" ||
		p.GetHealth().GetState() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK {
		t.Errorf("mlx5_0/1 in the inventory: %v", p)
	}
	// nodes get shows the ports, in text and as JSON.
	if out := d.cli("nodes", "get", node); !strings.Contains(out, "ib mlx5_0/1") ||
		!strings.Contains(out, "ACTIVE/LinkUp 400 Gb/sec (4X NDR) InfiniBand") {
		t.Errorf("nodes get does not show the InfiniBand ports:\n%s", out)
	}
	var got struct {
		Inventory struct {
			IbPorts []struct {
				Device string `json:"device"`
				State  string `json:"state"`
			} `json:"ibPorts"`
		} `json:"inventory"`
	}
	if err := json.Unmarshal([]byte(d.cli("nodes", "get", node, "-o", "json")), &got); err != nil ||
		len(got.Inventory.IbPorts) != 2 || got.Inventory.IbPorts[1].Device != "mlx5_1" {
		t.Errorf("nodes get -o json: %+v, %v; want the inventory's 2 ibPorts", got, err)
	}

	// finding waits for the node's ib.port finding that ok accepts.
	finding := func(ok func(*sessionv1.GPUFinding) bool) *sessionv1.GPUFinding {
		t.Helper()
		var f *sessionv1.GPUFinding
		var seen []string
		eventually(t, 60*time.Second, func() bool {
			es, err := d.st.EventList(t.Context(), &store.EventListParams{NodeID: node, Limit: store.MaxListLimit})
			if err != nil {
				t.Fatal(err)
			}
			seen = seen[:0]
			for _, e := range es {
				if e.Kind != gpufinding.KindInfiniBand {
					continue
				}
				g, err := gpufinding.Decode(e.Kind, e.Payload)
				if err != nil {
					t.Fatalf("event %d: %v", e.ID, err)
				}
				seen = append(seen, fmt.Sprint(g))
				if gpufinding.SignalOf(g) == gpufinding.SignalInfiniBand && ok(g) {
					f = g
					return true
				}
			}
			return false
		}, func() string { return fmt.Sprintf("no such ib.port finding; stored: %q", seen) })
		return f
	}
	// cordoned waits for the node's open case, cordon for an infiniband
	// finding, and returns it once the port reads ok again.
	cordonedUntilOK := func(key string, want sessionv1.GPUHealthState) {
		t.Helper()
		var c *store.Remediation
		eventually(t, 60*time.Second, func() bool {
			c = latestCase(t, d.st, node)
			return c != nil && c.ClosedAt == nil && c.Action == "cordon" && c.QuarantinedAt != nil
		}, func() string { return fmt.Sprintf("no open cordon case: %+v", c) })
		if c.Finding != "infiniband" || c.GPUUUID != "" {
			t.Errorf("case %s: finding %q GPU %q, want infiniband and no GPU", c.ID, c.Finding, c.GPUUUID)
		}
		if !nodeOf().Cordoned {
			t.Errorf("node not cordoned")
		}
		eventually(t, 60*time.Second, func() bool { return port(key).GetHealth().GetState() == want },
			func() string { return fmt.Sprintf("%s reads %v, want %s", key, port(key).GetHealth(), want) })
		eventually(t, 60*time.Second, func() bool {
			return port(key).GetHealth().GetState() == sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK
		}, func() string { return fmt.Sprintf("%s still %v", key, port(key).GetHealth()) })
		d.cli("remediation", "return", c.ID, "--note", "cable reseated on "+key)
		eventually(t, 60*time.Second, func() bool {
			c = latestCase(t, d.st, node)
			return c.ClosedAt != nil
		}, func() string { return fmt.Sprintf("case not closed after return: %+v", c) })
	}

	// A flap: link_downed rises on a port that is up.
	fx.set("mlx5_0", 1, "counters/link_downed", "1")
	f := finding(func(f *sessionv1.GPUFinding) bool { return f.GetInfiniband().GetCause() == "flap" })
	if s := f.GetInfiniband(); s.GetDevice() != "mlx5_0" || s.GetPort() != 1 || s.GetLinkDowned() != 1 ||
		s.GetWindow().AsDuration() != 3*time.Second || f.GetGpuUuid() != "" || f.GetPciBusId() != "0000:3b:00.0" ||
		f.GetResolution() != "CHECK_MECHANICALS" || f.GetHealth() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED ||
		f.GetEvidence().GetSource() != "scan" || f.GetEvidence().GetCounters()["link_downed"] != 1 {
		t.Errorf("flap finding = %v", f)
	}
	cordonedUntilOK("mlx5_0/1", sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED)

	// Error counters rising past the configured threshold in the window.
	fx.set("mlx5_1", 1, "counters/symbol_error", "20")
	f = finding(func(f *sessionv1.GPUFinding) bool { return f.GetInfiniband().GetCause() == "errors" })
	if s := f.GetInfiniband(); s.GetDevice() != "mlx5_1" || s.GetErrors() != 20 || s.GetWindow().AsDuration() != 3*time.Second ||
		f.GetEvidence().GetCounters()["symbol_error"] != 20 {
		t.Errorf("errors finding = %v", f)
	}
	cordonedUntilOK("mlx5_1/1", sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED)

	// An mlx5_core fatal error in the kernel log (the mock's, stamped on
	// CLOCK_MONOTONIC as the kernel stamps /dev/kmsg).
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	line := "mlx5_core 0000:3b:00.0: poll_health:802:(pid 0): Fatal error 1 detected"
	kf, err := os.OpenFile(filepath.Join(m.dataDir, "nvmlmock-kmsg"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(kf, "3,9001,%d,-;%s\n", ts.Nano()/1000, line); err != nil {
		t.Fatal(err)
	}
	if err := kf.Close(); err != nil {
		t.Fatal(err)
	}
	f = finding(func(f *sessionv1.GPUFinding) bool { return f.GetInfiniband().GetCause() == "mlx5" })
	if s := f.GetInfiniband(); s.GetDevice() != "mlx5_0" || s.GetPort() != 0 || f.GetEvidence().GetSource() != "kmsg" ||
		f.GetEvidence().GetLogLine() != line || f.GetResolution() != "ESCALATE" ||
		f.GetHealth() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED {
		t.Errorf("mlx5 finding = %v", f)
	}
	cordonedUntilOK("mlx5_0/1", sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED)
}

// TestInfiniBandSimulatedPortCordons (issue 43): the simulator plays an
// InfiniBand port fault (FakeDaemon.RaiseIBPortFault) against the real
// control plane: the ib.port finding is stored, the default policy cordons
// the node (finding infiniband), the port reads down in the stored
// inventory, and once the fault is cleared it reads ok and an operator's
// return closes the case.
func TestInfiniBandSimulatedPortCordons(t *testing.T) {
	t.Parallel()
	d := newDeploymentWith(t, backendSQLite, deploymentConfig{gateway: "    heartbeatInterval: 1s\n",
		top: "remediation:\n  interval: 300ms\n"})
	tokenFile, _ := d.joinToken(1, time.Hour)
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := sim.NewFakeDaemon(sim.DaemonConfig{Name: "ib-sim-01", Session: session.Config{StartJitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := fd.Join(t.Context(), d.gatewayURL, strings.TrimSpace(string(tok))); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- fd.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
	node := fd.NodeID()
	nodeOf := func() *store.Node {
		n, err := d.st.NodeGet(t.Context(), node)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	port := func() *sessionv1.InfiniBandPort {
		if ps := inventory(nodeOf().Inventory).GetIbPorts(); len(ps) == 8 {
			return ps[5]
		}
		return nil
	}
	eventually(t, 60*time.Second, func() bool { return nodeOf().State == store.NodeReady && port() != nil },
		func() string { return "simulated node not ready with its 8 InfiniBand ports: " + nodeOf().State })

	if err := fd.RaiseIBPortFault(5, sim.IBFaultDown); err != nil {
		t.Fatal(err)
	}
	var c *store.Remediation
	eventually(t, 60*time.Second, func() bool {
		c = latestCase(t, d.st, node)
		return c != nil && c.ClosedAt == nil && c.Action == "cordon" && c.QuarantinedAt != nil && nodeOf().Cordoned
	}, func() string { return fmt.Sprintf("no open cordon case: %+v", c) })
	if c.Finding != "infiniband" || c.Resolution != "CHECK_MECHANICALS" || c.GPUUUID != "" {
		t.Errorf("case = %+v, want finding infiniband, CHECK_MECHANICALS, no GPU", c)
	}
	eventually(t, 60*time.Second, func() bool { return port().GetState() == "DOWN" },
		func() string { return fmt.Sprintf("mlx5_5/1 in the stored inventory: %v", port()) })

	if err := fd.ClearIBPortFault(5); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() bool {
		return port().GetState() == "ACTIVE" && port().GetHealth().GetState() == sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK
	}, func() string { return fmt.Sprintf("mlx5_5/1 after the clear: %v", port()) })
	d.cli("remediation", "return", c.ID, "--note", "cable replaced")
	eventually(t, 60*time.Second, func() bool {
		c = latestCase(t, d.st, node)
		return c.ClosedAt != nil && !nodeOf().Cordoned
	}, func() string { return fmt.Sprintf("case not closed or node still cordoned after return: %+v", c) })
}
