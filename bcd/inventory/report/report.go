// Package report turns a host inventory into the session protocol's
// Inventory message, the form in which bcd reports it and the control plane
// stores it.
package report

import (
	"math"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bcd/inventory"
	"github.com/better-compute/better-compute/bcd/inventory/gpu"
	"github.com/better-compute/better-compute/bcd/inventory/ib"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Inventory converts h, collected at at, with the plugins bcd runs.
func Inventory(h *inventory.Host, plugins []*sessionv1.PluginInfo, at time.Time) *sessionv1.Inventory {
	inv := &sessionv1.Inventory{
		Digest:      h.Digest(),
		GpuStatus:   h.GPUStatus,
		Plugins:     plugins,
		CollectedAt: timestamppb.New(at),
		Host: &sessionv1.HostInfo{
			Hostname:      h.Hostname,
			MachineId:     h.MachineID,
			BootId:        h.BootID,
			UptimeSeconds: h.UptimeSeconds,
			Os:            &sessionv1.OS{Name: h.OS.Name, Version: h.OS.Version, Kernel: h.OS.Kernel},
			Cpu: &sessionv1.CPU{Model: h.CPU.Model, Sockets: uint32(h.CPU.Sockets), Cores: uint32(h.CPU.Cores),
				Threads: uint32(h.CPU.Threads), Flags: h.CPU.Flags},
			Memory: &sessionv1.Memory{TotalBytes: h.Memory.TotalBytes, AvailableBytes: h.Memory.AvailableBytes},
			Dmi: &sessionv1.DMI{SystemVendor: h.DMI.SystemVendor, ProductName: h.DMI.ProductName,
				ProductSerial: h.DMI.ProductSerial, BiosVersion: h.DMI.BIOSVersion},
		},
	}
	for _, d := range h.Disks {
		inv.Host.Disks = append(inv.Host.Disks, &sessionv1.Disk{Name: d.Name, SizeBytes: d.SizeBytes, Model: d.Model,
			Serial: d.Serial, Rotational: d.Rotational})
	}
	for _, n := range h.NICs {
		inv.Host.Nics = append(inv.Host.Nics, &sessionv1.NIC{Name: n.Name, Mac: n.MAC, SpeedMbps: n.SpeedMbps,
			Addresses: n.Addresses, Driver: n.Driver})
	}
	for _, g := range h.GPUs {
		inv.Gpus = append(inv.Gpus, GPU(&g))
	}
	for _, p := range h.IBPorts {
		inv.IbPorts = append(inv.IbPorts, InfiniBandPort(&p))
	}
	return inv
}

// InfiniBandPort converts one InfiniBand/RoCE port.
func InfiniBandPort(p *ib.Port) *sessionv1.InfiniBandPort {
	c := p.Counters
	return &sessionv1.InfiniBandPort{Device: p.Device, Port: uint32(max(p.Port, 0)), PciBusId: p.PCIBusID, State: p.State,
		PhysState: p.PhysState, Rate: p.Rate, LinkLayer: p.LinkLayer, LinkDowned: c.LinkDowned,
		LinkErrorRecovery: c.LinkErrorRecovery, SymbolError: c.SymbolError, PortRcvErrors: c.PortRcvErrors,
		ExcessiveBufferOverrunErrors: c.ExcessiveBufferOverrunErrors,
		Health:                       &sessionv1.GPUHealth{State: ibHealth(p.Health), Reasons: p.HealthReasons, Resolution: p.Resolution}}
}

func ibHealth(h ib.Health) sessionv1.GPUHealthState {
	switch h {
	case ib.HealthDegraded:
		return sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED
	case ib.HealthFailed:
		return sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED
	}
	return sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK
}

// InfiniBandFinding is the typed finding (sessionv1.GPUFinding, kind
// gpufinding.KindInfiniBand) of an InfiniBand/RoCE port's finding: no GPU;
// the device's PCI address, the InfiniBandSignal, the resolution (as the
// immediate one too), the health, the evidence and when it was seen.
func InfiniBandFinding(f ib.Finding) *sessionv1.GPUFinding {
	s := &sessionv1.InfiniBandSignal{Device: f.Device, Port: uint32(max(f.Port, 0)), Cause: f.Cause, State: f.State,
		PhysState: f.PhysState, Errors: f.Errors, LinkDowned: f.LinkDowned}
	if f.Window > 0 {
		s.Window = durationpb.New(f.Window)
	}
	out := &sessionv1.GPUFinding{PciBusId: f.PCIBusID, ImmediateResolution: f.Resolution, Resolution: f.Resolution,
		Health: ibHealth(f.Health), Signal: &sessionv1.GPUFinding_Infiniband{Infiniband: s},
		Evidence: &sessionv1.GPUFindingEvidence{Source: f.Source, LogLine: f.LogLine, Counters: f.Counters, Message: f.Message}}
	if !f.Time.IsZero() {
		out.ObservedAt = timestamppb.New(f.Time)
	}
	return out
}

// GPU converts one GPU.
func GPU(g *gpu.GPU) *sessionv1.GPU {
	out := &sessionv1.GPU{
		Index: uint32(g.Index), Name: g.Name, Uuid: g.UUID, Serial: g.Serial, PciBusId: g.PCIBusID,
		MemoryTotalBytes: g.MemoryTotalBytes, MemoryUsedBytes: g.MemoryUsedBytes, DriverVersion: g.DriverVersion,
		CudaDriverVersion: g.CUDADriverVersion, TemperatureC: g.TemperatureC, PowerDrawMw: g.PowerDrawMilliwatts,
		PowerLimitMw: g.PowerLimitMilliwatts,
		Clocks:       &sessionv1.Clocks{SmMhz: g.SMClockMHz, MemoryMhz: g.MemoryClockMHz},
		Health: &sessionv1.GPUHealth{State: health(g.Health), Reasons: g.HealthReasons, Xid: g.XID,
			XidMnemonic: g.XIDMnemonic, Resolution: g.Resolution},
		MigMode: sessionv1.MIGMode_MIG_MODE_UNSUPPORTED,
	}
	if e := g.ECC; e != nil {
		out.EccVolatileCorrected = deref(e.VolatileCorrected)
		out.EccVolatileUncorrected = deref(e.VolatileUncorrected)
		out.EccAggregateCorrected = deref(e.AggregateCorrected)
		out.EccAggregateUncorrected = deref(e.AggregateUncorrected)
	}
	if p := g.RetiredPages; p != nil {
		out.RetiredPages = uint32(derefInt(p.MultipleSingleBitECC) + derefInt(p.DoubleBitECC))
	}
	if r := g.RemappedRows; r != nil {
		out.RemappedRowsCorrectable = uint32(r.Corrected)
		out.RemappedRowsUncorrectable = uint32(r.Uncorrected)
		out.RemappedRowsPending = r.Pending
		out.RemappedRowsFailed = r.Failure
	}
	if m := g.MIG; m != nil {
		out.MigMode, out.MigModePending = migMode(m.Enabled), migMode(m.PendingEnabled)
		for _, d := range m.Devices {
			out.MigDevices = append(out.MigDevices, &sessionv1.MIGDevice{Index: uint32(d.Index), Uuid: d.UUID, Profile: d.Name,
				GpuInstanceId: uint32(d.GPUInstanceID), ComputeInstanceId: uint32(d.ComputeInstanceID)})
		}
	}
	return out
}

func health(h gpu.Health) sessionv1.GPUHealthState {
	switch h {
	case gpu.HealthOK:
		return sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK
	case gpu.HealthDegraded:
		return sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED
	case gpu.HealthFailed:
		return sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED
	}
	return sessionv1.GPUHealthState_GPU_HEALTH_STATE_UNSPECIFIED
}

func migMode(enabled bool) sessionv1.MIGMode {
	if enabled {
		return sessionv1.MIGMode_MIG_MODE_ENABLED
	}
	return sessionv1.MIGMode_MIG_MODE_DISABLED
}

func deref(p *uint64) uint64 {
	if p == nil {
		return 0
	}
	return *p
}

func derefInt(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// Finding is the typed finding (sessionv1.GPUFinding) of a GPU event: its
// GPU, signal (by ev.Kind, one of gpu.EventKind*, with that kind's fields),
// NVIDIA's resolutions, the health it implies, the evidence (log line or
// counters) and when it was seen. An event of a kind it does not know has
// no signal.
func Finding(ev gpu.Event) *sessionv1.GPUFinding {
	f := &sessionv1.GPUFinding{
		GpuUuid: ev.GPUUUID, BoardSerial: ev.Serial, PciBusId: ev.PCIBusID,
		ImmediateResolution: ev.Immediate, InvestigatoryResolution: ev.Investigatory, Resolution: ev.Resolution,
		Health: health(ev.Health),
		Evidence: &sessionv1.GPUFindingEvidence{Source: ev.Source, LogLine: ev.LogLine, Pid: uint32(max(ev.PID, 0)),
			Process: ev.Process, Message: ev.Message, Counters: ev.Counters},
	}
	if !ev.Time.IsZero() {
		f.ObservedAt = timestamppb.New(ev.Time)
	}
	switch ev.Kind {
	case gpu.EventKindXID:
		f.Signal = &sessionv1.GPUFinding_Xid{Xid: &sessionv1.XIDSignal{Code: uint32(ev.XID), Mnemonic: ev.XIDMnemonic}}
	case gpu.EventKindECCUncorrected:
		f.Signal = &sessionv1.GPUFinding_Ecc{Ecc: &sessionv1.ECCSignal{Uncorrectable: true, Count: ev.ECCCount}}
	case gpu.EventKindECCCorrected:
		f.Signal = &sessionv1.GPUFinding_Ecc{Ecc: &sessionv1.ECCSignal{Count: ev.ECCCount}}
	case gpu.EventKindRowRemap:
		rr := ev.RemappedRows
		if rr == nil {
			rr = &gpu.RemappedRows{}
		}
		f.Signal = &sessionv1.GPUFinding_RowRemap{RowRemap: &sessionv1.RowRemapSignal{Failure: rr.Failure, Pending: rr.Pending,
			CorrectableRows: uint32(max(rr.Corrected, 0)), UncorrectableRows: uint32(max(rr.Uncorrected, 0))}}
	case gpu.EventKindRecoveryAction:
		f.Signal = &sessionv1.GPUFinding_RecoveryAction{RecoveryAction: &sessionv1.RecoveryActionSignal{Action: ev.RecoveryAction}}
	case gpu.EventKindClocks:
		f.Signal = &sessionv1.GPUFinding_Clocks{Clocks: &sessionv1.ClocksSignal{EventReasons: ev.ClocksEventReasons,
			Reasons: ev.ClockReasons}}
	case gpu.EventKindNVLink:
		f.Signal = &sessionv1.GPUFinding_Nvlink{Nvlink: &sessionv1.NVLinkSignal{Errors: ev.NVLinkErrors,
			Window: durationpb.New(ev.NVLinkWindow)}}
	case gpu.EventKindRetiredPages:
		f.Signal = &sessionv1.GPUFinding_RetiredPages{RetiredPages: &sessionv1.RetiredPagesSignal{Pending: true}}
	case gpu.EventKindGPULost:
		f.Signal = &sessionv1.GPUFinding_GpuLost{GpuLost: &sessionv1.GPULostSignal{NvmlError: ev.LostError}}
	case gpu.EventKindPCIe:
		s := &sessionv1.PCIeSignal{Replays: ev.PCIeReplays, AerSeverity: ev.AERSeverity}
		if ev.PCIeWindow > 0 {
			s.Window = durationpb.New(ev.PCIeWindow)
		}
		if l := ev.PCIeLink; l != nil {
			s.LinkGeneration, s.MaxLinkGeneration = uint32(l.LinkGeneration), uint32(l.MaxLinkGeneration)
			s.LinkWidth, s.MaxLinkWidth = uint32(l.LinkWidth), uint32(l.MaxLinkWidth)
		}
		f.Signal = &sessionv1.GPUFinding_Pcie{Pcie: s}
	case gpu.EventKindFabric:
		s := &sessionv1.FabricSignal{For: durationpb.New(ev.FabricFor)}
		if fb := ev.Fabric; fb != nil {
			s.State, s.Status = fb.State, fb.Status
		}
		f.Signal = &sessionv1.GPUFinding_Fabric{Fabric: s}
	case gpu.EventKindPersistence:
		f.Signal = &sessionv1.GPUFinding_Persistence{Persistence: &sessionv1.PersistenceModeSignal{}}
	case gpu.EventKindFabricManager:
		s := &sessionv1.FabricManagerSignal{Restarts: uint32(min(ev.FabricManagerRestarts, math.MaxUint32))}
		if fm := ev.FabricManager; fm != nil {
			s.ActiveState, s.SubState, s.LoadState = fm.ActiveState, fm.SubState, fm.LoadState
		}
		if ev.FabricManagerWindow > 0 {
			s.Window = durationpb.New(ev.FabricManagerWindow)
		}
		if ev.FabricManagerDownFor > 0 {
			s.DownFor = durationpb.New(ev.FabricManagerDownFor)
		}
		f.Signal = &sessionv1.GPUFinding_FabricManager{FabricManager: s}
	}
	return f
}
