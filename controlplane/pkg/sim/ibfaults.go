package sim

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// The InfiniBand faults a FakeDaemon plays (RaiseIBPortFault), as bcd's
// package bcd/inventory/ib names their causes.
const (
	IBFaultDown   = "down"   // the port left ACTIVE/LinkUp
	IBFaultErrors = "errors" // its error counters rose past the threshold
	IBFaultFlap   = "flap"   // a flap episode
	IBFaultMlx5   = "mlx5"   // an mlx5_core fatal error in the kernel log
)

// ErrNoSuchIBPort reports an InfiniBand port index the simulated machine
// does not have.
var ErrNoSuchIBPort = errors.New("no such simulated InfiniBand port")

// RaiseIBPortFault makes InfiniBand port i (0-based, in the inventory's
// order: mlx5_<i>/1) report a fault of cause (one of the IBFault*
// constants), as bcd would: an "ib.port" Event with its typed finding
// (InfiniBandSignal, CHECK_MECHANICALS for a link's fault, ESCALATE for an
// mlx5 error), and the port reads degraded (failed for mlx5; DOWN/Polling
// for down) in the inventory it sends next, until ClearIBPortFault or
// ClearFaults (a reboot does not mend a cable). Errors: ErrNoSuchIBPort, or
// an unknown cause.
func (d *FakeDaemon) RaiseIBPortFault(i int, cause string) error {
	ports := d.inv.GetIbPorts()
	if i < 0 || i >= len(ports) {
		return fmt.Errorf("fake daemon %s: InfiniBand port %d: %w (it has %d)", d.cfg.Name, i, ErrNoSuchIBPort, len(ports))
	}
	p := ports[i]
	s := &sessionv1.InfiniBandSignal{Device: p.GetDevice(), Port: p.GetPort(), Cause: cause, State: p.GetState(),
		PhysState: p.GetPhysState()}
	resolution, health := "CHECK_MECHANICALS", sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED
	switch cause {
	case IBFaultDown:
		s.State, s.PhysState = "DOWN", "Polling"
	case IBFaultErrors:
		s.Errors, s.Window = 100, durationpb.New(10*time.Minute)
	case IBFaultFlap:
		s.LinkDowned, s.Window = 1, durationpb.New(5*time.Minute)
	case IBFaultMlx5:
		s.Port = 0
		resolution, health = "ESCALATE", sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED
	default:
		return fmt.Errorf("fake daemon %s: InfiniBand fault %q: want down, errors, flap or mlx5", d.cfg.Name, cause)
	}
	f := d.faults()
	f.mu.Lock()
	if f.ib == nil {
		f.ib = map[int]string{}
	}
	f.ib[i] = cause
	f.version++
	f.mu.Unlock()
	now := timestamppb.Now()
	msg := fmt.Sprintf("InfiniBand port %s/%d: %s (simulated)", p.GetDevice(), p.GetPort(), cause)
	sev := sessionv1.Severity_SEVERITY_WARNING
	if health == sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED {
		sev = sessionv1.Severity_SEVERITY_CRITICAL
	}
	d.report(&sessionv1.Event{Kind: gpufinding.KindInfiniBand, Time: now, Severity: sev, Resolution: resolution, Message: msg,
		Attributes: map[string]string{"source": "sim"},
		GpuFinding: &sessionv1.GPUFinding{PciBusId: p.GetPciBusId(), Signal: &sessionv1.GPUFinding_Infiniband{Infiniband: s},
			ImmediateResolution: resolution, Resolution: resolution, Health: health, ObservedAt: now,
			Evidence: &sessionv1.GPUFindingEvidence{Source: "sim", Message: msg}}})
	return nil
}

// ClearIBPortFault ends port i's fault: the next inventory (sent at once
// when connected) reads it up and ok. Errors: ErrNoSuchIBPort.
func (d *FakeDaemon) ClearIBPortFault(i int) error {
	if i < 0 || i >= len(d.inv.GetIbPorts()) {
		return fmt.Errorf("fake daemon %s: InfiniBand port %d: %w", d.cfg.Name, i, ErrNoSuchIBPort)
	}
	f := d.faults()
	f.mu.Lock()
	if _, ok := f.ib[i]; ok {
		delete(f.ib, i)
		f.version++
	}
	f.mu.Unlock()
	d.sendInventoryIfDue()
	return nil
}

// ibPortFault sets p (a copy in the inventory being built) to what a fault
// of cause shows.
func ibPortFault(p *sessionv1.InfiniBandPort, cause string) {
	h := &sessionv1.GPUHealth{State: sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED, Resolution: "CHECK_MECHANICALS"}
	switch cause {
	case IBFaultDown:
		p.State, p.PhysState = "DOWN", "Polling"
		h.Reasons = []string{"port down after having been up"}
	case IBFaultErrors:
		p.SymbolError += 100
		h.Reasons = []string{"error counters rose by 100 within 10m0s"}
	case IBFaultFlap:
		p.LinkDowned++
		h.Reasons = []string{"link flapping"}
	case IBFaultMlx5:
		h.State, h.Resolution, h.Reasons = sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED, "ESCALATE", []string{"mlx5_core error"}
	}
	p.Health = h
}
