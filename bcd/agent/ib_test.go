package agent_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/agent"
	"github.com/better-compute/better-compute/bcd/inventory/ib"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// TestInfiniBandFindingsReachTheGateway: on a host with an InfiniBand port
// and no GPU, bcd follows the kernel log (for the ports' mlx5_core lines):
// a fatal line of the port's device reaches the gateway as an ib.port
// event with its typed finding, and the port reads failed in the next
// inventory; a later scan that reads link_downed risen sends the flap.
func TestInfiniBandFindingsReachTheGateway(t *testing.T) {
	t.Parallel()
	sysfs := t.TempDir()
	write := func(rel, content string) {
		t.Helper()
		p := filepath.Join(sysfs, "class/infiniband/mlx5_0", rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p+".tmp", []byte(content+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			t.Fatal(err)
		}
	}
	write("device/uevent", "PCI_SLOT_NAME=0000:3b:00.0")
	write("ports/1/state", "4: ACTIVE")
	write("ports/1/phys_state", "5: LinkUp")
	write("ports/1/counters/link_downed", "0")
	boot := time.Now().Add(-time.Hour)
	mon := ib.New(ib.Config{SysFS: os.DirFS(sysfs), BootTime: func() time.Time { return boot }})
	// Logged now: an hour after the boot above.
	const line = "mlx5_core 0000:3b:00.0: poll_health:802:(pid 0): Fatal error 1 detected"
	log := kernelLog{fmt.Sprintf("3,77,%d,-;%s", time.Hour.Microseconds(), line)}
	r := start(t, agent.Config{IB: mon, KernelLog: log, RescanInterval: 20 * time.Millisecond})
	s := r.gw.NextSession(t, wait)
	ev := next(t, s, "the mlx5 event", func(m *sessionv1.NodeMessage) bool { return m.GetEvent() != nil }).GetEvent()
	f := ev.GetGpuFinding()
	if ev.GetKind() != "ib.port" || ev.GetSeverity() != sessionv1.Severity_SEVERITY_CRITICAL || ev.GetResolution() != "ESCALATE" ||
		f.GetInfiniband().GetCause() != "mlx5" || f.GetInfiniband().GetDevice() != "mlx5_0" || f.GetEvidence().GetLogLine() != line ||
		f.GetEvidence().GetSource() != "kmsg" || f.GetPciBusId() != "0000:3b:00.0" || f.GetGpuUuid() != "" {
		t.Fatalf("mlx5 event %v", ev)
	}
	next(t, s, "an inventory with the port failed", func(m *sessionv1.NodeMessage) bool {
		ps := m.GetInventory().GetIbPorts()
		return len(ps) == 1 && ps[0].GetHealth().GetState() == sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED
	})

	write("ports/1/counters/link_downed", "1")
	ev = next(t, s, "the flap event", func(m *sessionv1.NodeMessage) bool { return m.GetEvent() != nil }).GetEvent()
	if s := ev.GetGpuFinding().GetInfiniband(); ev.GetKind() != "ib.port" || s.GetCause() != "flap" || s.GetLinkDowned() != 1 ||
		s.GetPort() != 1 || ev.GetSeverity() != sessionv1.Severity_SEVERITY_WARNING {
		t.Fatalf("flap event %v", ev)
	}
}
