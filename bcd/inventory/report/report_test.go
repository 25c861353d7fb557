package report_test

import (
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/inventory"
	"github.com/better-compute/better-compute/bcd/inventory/gpu"
	"github.com/better-compute/better-compute/bcd/inventory/ib"
	"github.com/better-compute/better-compute/bcd/inventory/report"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

func TestInventory(t *testing.T) {
	one := uint64(1)
	h := &inventory.Host{
		Hostname: "gpu-01", MachineID: "m", CPU: inventory.CPU{Model: "EPYC", Sockets: 2, Cores: 128, Threads: 256},
		Memory: inventory.Memory{TotalBytes: 1 << 40},
		NICs:   []inventory.NIC{{Name: "eth0", MAC: "aa:bb:cc:dd:ee:ff", SpeedMbps: 100000}},
		GPUs: []gpu.GPU{
			{Index: 0, Name: "NVIDIA A100-SXM4-40GB", UUID: "GPU-0", MemoryTotalBytes: 40 << 30, Health: gpu.HealthOK},
			{Index: 1, Name: "NVIDIA A100-SXM4-40GB", UUID: "GPU-1", Health: gpu.HealthFailed, HealthReasons: []string{"XID 79: GPU has fallen off the bus"},
				ECC: &gpu.ECC{VolatileUncorrected: &one}, MIG: &gpu.MIG{Enabled: true}},
		},
	}
	inv := report.Inventory(h, []*sessionv1.PluginInfo{{Name: "ipmi", Version: "0.1.0", Healthy: true}}, time.Unix(1, 0))
	if inv.Digest != h.Digest() || inv.Host.Hostname != "gpu-01" || inv.Host.Cpu.Threads != 256 || len(inv.Host.Nics) != 1 || len(inv.Plugins) != 1 {
		t.Fatalf("inventory = %v", inv)
	}
	if len(inv.Gpus) != 2 || inv.Gpus[0].MemoryTotalBytes != 40<<30 || inv.Gpus[0].Health.State != sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK {
		t.Fatalf("gpu 0 = %v", inv.Gpus[0])
	}
	g := inv.Gpus[1]
	if g.Health.State != sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED || g.Health.Reasons[0] != "XID 79: GPU has fallen off the bus" ||
		g.EccVolatileUncorrected != 1 || g.MigMode != sessionv1.MIGMode_MIG_MODE_ENABLED {
		t.Fatalf("gpu 1 = %v", g)
	}
}

// TestFinding: each kind of GPU event becomes the typed finding of its
// signal, with the GPU's identity, NVIDIA's resolutions, health, evidence
// and time as the event has them.
func TestFinding(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	base := gpu.Event{GPUUUID: "GPU-3", Serial: "1320", PCIBusID: "00000000:07:00.0", Resolution: "RESET_GPU", Immediate: "RESET_GPU",
		Health: gpu.HealthFailed, Source: gpu.SourceScan, Message: "m", Time: at, Counters: map[string]uint64{"n": 1}}
	for _, c := range []struct {
		ev    gpu.Event
		check func(*sessionv1.GPUFinding) bool
	}{
		{gpu.Event{Kind: gpu.EventKindXID, XID: 79, XIDMnemonic: "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", Investigatory: "CONTACT_SUPPORT",
			Source: gpu.SourceKernelLog, LogLine: "NVRM: Xid (PCI:0000:07:00): 79, pid=7, name=python", PID: 7, Process: "python"},
			func(f *sessionv1.GPUFinding) bool {
				return f.GetXid().GetCode() == 79 && f.GetInvestigatoryResolution() == "CONTACT_SUPPORT" &&
					f.GetEvidence().GetLogLine() != "" && f.GetEvidence().GetPid() == 7 && f.GetEvidence().GetProcess() == "python"
			}},
		{gpu.Event{Kind: gpu.EventKindECCUncorrected, ECCCount: 2},
			func(f *sessionv1.GPUFinding) bool { return f.GetEcc().GetUncorrectable() && f.GetEcc().GetCount() == 2 }},
		{gpu.Event{Kind: gpu.EventKindECCCorrected, ECCCount: 200},
			func(f *sessionv1.GPUFinding) bool {
				return !f.GetEcc().GetUncorrectable() && f.GetEcc().GetCount() == 200
			}},
		{gpu.Event{Kind: gpu.EventKindRowRemap, RemappedRows: &gpu.RemappedRows{Pending: true, Corrected: 2}},
			func(f *sessionv1.GPUFinding) bool {
				return f.GetRowRemap().GetPending() && f.GetRowRemap().GetCorrectableRows() == 2
			}},
		{gpu.Event{Kind: gpu.EventKindRecoveryAction, RecoveryAction: "NODE_REBOOT"},
			func(f *sessionv1.GPUFinding) bool { return f.GetRecoveryAction().GetAction() == "NODE_REBOOT" }},
		{gpu.Event{Kind: gpu.EventKindClocks, ClocksEventReasons: 64, ClockReasons: []string{"hardware thermal slowdown"}},
			func(f *sessionv1.GPUFinding) bool {
				return f.GetClocks().GetEventReasons() == 64 && len(f.GetClocks().GetReasons()) == 1
			}},
		{gpu.Event{Kind: gpu.EventKindNVLink, NVLinkErrors: 150, NVLinkWindow: 10 * time.Minute},
			func(f *sessionv1.GPUFinding) bool {
				return f.GetNvlink().GetErrors() == 150 && f.GetNvlink().GetWindow().AsDuration() == 10*time.Minute
			}},
		{gpu.Event{Kind: gpu.EventKindRetiredPages}, func(f *sessionv1.GPUFinding) bool { return f.GetRetiredPages().GetPending() }},
		{gpu.Event{Kind: gpu.EventKindGPULost, LostError: "ERROR_GPU_IS_LOST"},
			func(f *sessionv1.GPUFinding) bool { return f.GetGpuLost().GetNvmlError() == "ERROR_GPU_IS_LOST" }},
	} {
		ev := base
		ev.Kind, ev.XID, ev.XIDMnemonic, ev.ECCCount, ev.RemappedRows = c.ev.Kind, c.ev.XID, c.ev.XIDMnemonic, c.ev.ECCCount, c.ev.RemappedRows
		ev.RecoveryAction, ev.ClocksEventReasons, ev.ClockReasons = c.ev.RecoveryAction, c.ev.ClocksEventReasons, c.ev.ClockReasons
		ev.NVLinkErrors, ev.NVLinkWindow, ev.LostError = c.ev.NVLinkErrors, c.ev.NVLinkWindow, c.ev.LostError
		if c.ev.Source != "" {
			ev.Source, ev.LogLine, ev.PID, ev.Process, ev.Investigatory = c.ev.Source, c.ev.LogLine, c.ev.PID, c.ev.Process, c.ev.Investigatory
		}
		f := report.Finding(ev)
		if !c.check(f) || f.GetGpuUuid() != "GPU-3" || f.GetBoardSerial() != "1320" || f.GetPciBusId() != "00000000:07:00.0" ||
			f.GetResolution() != "RESET_GPU" || f.GetImmediateResolution() != "RESET_GPU" ||
			f.GetHealth() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED || !f.GetObservedAt().AsTime().Equal(at) ||
			f.GetEvidence().GetSource() != ev.Source || f.GetEvidence().GetMessage() != "m" {
			t.Errorf("%s: finding %v", ev.Kind, f)
		}
	}
}

// TestInfiniBandReport: a port becomes the inventory's InfiniBandPort with
// its counters and health, and a port's finding the typed finding of the
// infiniband signal, naming no GPU.
func TestInfiniBandReport(t *testing.T) {
	h := &inventory.Host{IBPorts: []ib.Port{{Device: "mlx5_0", Port: 1, PCIBusID: "0000:3b:00.0", State: "ACTIVE", StateNum: 4,
		PhysState: "LinkUp", PhysStateNum: 5, Rate: "400 Gb/sec (4X NDR)", LinkLayer: "InfiniBand",
		Counters: ib.Counters{LinkDowned: 2, SymbolError: 30}, Health: ib.HealthDegraded, HealthReasons: []string{"link flapping"},
		Resolution: "CHECK_MECHANICALS"}}}
	inv := report.Inventory(h, nil, time.Unix(1, 0))
	if len(inv.IbPorts) != 1 {
		t.Fatalf("ib ports = %v", inv.IbPorts)
	}
	p := inv.IbPorts[0]
	if p.Device != "mlx5_0" || p.Port != 1 || p.PciBusId != "0000:3b:00.0" || p.State != "ACTIVE" || p.PhysState != "LinkUp" ||
		p.Rate != "400 Gb/sec (4X NDR)" || p.LinkLayer != "InfiniBand" || p.LinkDowned != 2 || p.SymbolError != 30 ||
		p.Health.State != sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED || p.Health.Resolution != "CHECK_MECHANICALS" ||
		p.Health.Reasons[0] != "link flapping" {
		t.Errorf("port = %v", p)
	}
	at := time.Unix(1700000000, 0)
	f := report.InfiniBandFinding(ib.Finding{Device: "mlx5_0", Port: 1, PCIBusID: "0000:3b:00.0", Cause: ib.CauseErrors,
		State: "ACTIVE", PhysState: "LinkUp", Errors: 12, Window: 10 * time.Minute, Health: ib.HealthDegraded,
		Resolution: "CHECK_MECHANICALS", Source: ib.SourceScan, Counters: map[string]uint64{"symbol_error": 12}, Message: "m", Time: at})
	s := f.GetInfiniband()
	if f.GpuUuid != "" || f.PciBusId != "0000:3b:00.0" || s.GetDevice() != "mlx5_0" || s.GetPort() != 1 || s.GetCause() != "errors" ||
		s.GetErrors() != 12 || s.GetWindow().AsDuration() != 10*time.Minute || f.Resolution != "CHECK_MECHANICALS" ||
		f.ImmediateResolution != "CHECK_MECHANICALS" || f.Health != sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED ||
		f.Evidence.GetSource() != "scan" || f.Evidence.GetCounters()["symbol_error"] != 12 || !f.ObservedAt.AsTime().Equal(at) {
		t.Errorf("finding = %v", f)
	}
	if f := report.InfiniBandFinding(ib.Finding{Cause: ib.CauseMlx5, Health: ib.HealthFailed}); f.GetInfiniband().GetWindow() != nil ||
		f.Health != sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED {
		t.Errorf("mlx5 finding = %v", f)
	}
}
