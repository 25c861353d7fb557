package config

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// GPUHealth are the thresholds of bcd's GPU and fabric health readers (key
// gpuHealth; docs/gpu-health.md), sent to every node in Welcome. The
// defaults are bcd's own (gpu.DefaultThresholds), so a node of a gateway
// that sends nothing judges the same way.
type GPUHealth struct {
	// PCIeReplayThreshold is the rise of a GPU's PCIe replay counter
	// within PCIeReplayWindow at which the GPU is degraded. Defaults to
	// 100 replays (our heuristic: a healthy link stays near 0).
	PCIeReplayThreshold uint64 `yaml:"pcieReplayThreshold"`
	// PCIeReplayWindow defaults to 10 min; 1 s to 24 h.
	PCIeReplayWindow Duration `yaml:"pcieReplayWindow"`
	// PCIeCheckGeneration makes a link below its maximum generation a
	// finding. Defaults to false: idle GPUs lower the generation to save
	// power; a narrower width is always a finding.
	PCIeCheckGeneration bool `yaml:"pcieCheckGeneration"`
	// LogFindingHold is how long a finding made of kernel-log lines (PCIe
	// AER) holds after its last line. Defaults to 10 min; 1 s to 24 h.
	LogFindingHold Duration `yaml:"logFindingHold"`
	// FabricGrace is how long a GPU's NVLink fabric state (NVSwitch
	// systems) may stay short of completed before it is a finding:
	// nvidia-fabricmanager trains the fabric at boot. Defaults to 5 min;
	// 1 s to 24 h.
	FabricGrace Duration `yaml:"fabricGrace"`
	// IBErrorThreshold is the rise of an InfiniBand/RoCE port's error
	// counters (symbol_error, link_error_recovery, port_rcv_errors and
	// excessive_buffer_overrun_errors together) within IBErrorWindow at
	// which the port is degraded. Defaults to 10 (our heuristic: these
	// counters stay at 0 on a healthy link; Meta's GCM collects the same
	// counters).
	IBErrorThreshold uint64 `yaml:"ibErrorThreshold"`
	// IBErrorWindow defaults to 10 min; 1 s to 24 h.
	IBErrorWindow Duration `yaml:"ibErrorWindow"`
	// IBFlapWindow is the stabilisation window of a port's flap episode:
	// one finding per episode, which ends once the port has not flapped
	// for this long. Defaults to 5 min (our heuristic); 1 s to 24 h.
	IBFlapWindow Duration `yaml:"ibFlapWindow"`
	// IBDownGrace is how long a port that was up may stay down before it
	// is a finding; back up within it, it flapped. Defaults to 1 min (our
	// heuristic; the split of a drop from a flap follows gpud's two
	// InfiniBand findings); 1 s to 24 h.
	IBDownGrace Duration `yaml:"ibDownGrace"`
	// IgnorePersistenceMode leaves a GPU with persistence mode off without
	// a finding. Defaults to false: off is a degraded finding calling for
	// IGNORE (no action); a fleet that keeps the driver loaded another way
	// sets it.
	IgnorePersistenceMode bool `yaml:"ignorePersistenceMode"`
	// FabricManagerFlapRestarts is how many restarts of
	// nvidia-fabricmanager within FabricManagerWindow make it flapping.
	// Defaults to 3 (our heuristic: one restart is an operator or an
	// upgrade); 1 to 100.
	FabricManagerFlapRestarts uint32 `yaml:"fabricManagerFlapRestarts"`
	// FabricManagerWindow is the window of FabricManagerFlapRestarts and
	// the stabilisation window: a fabric-manager finding ends once the
	// service has stayed up this long without a restart. Defaults to
	// 10 min; 1 s to 24 h.
	FabricManagerWindow Duration `yaml:"fabricManagerWindow"`
	// DriftInterval is how often the control plane compares the driver
	// and CUDA versions of each pool's nodes (package drift). Defaults to
	// 1 min; 1 s to 24 h.
	DriftInterval Duration `yaml:"driftInterval"`
}

func (g *GPUHealth) defaults() {
	if g.PCIeReplayThreshold == 0 {
		g.PCIeReplayThreshold = 100
	}
	if g.PCIeReplayWindow.Duration == 0 {
		g.PCIeReplayWindow.Duration = 10 * time.Minute
	}
	if g.LogFindingHold.Duration == 0 {
		g.LogFindingHold.Duration = 10 * time.Minute
	}
	if g.FabricGrace.Duration == 0 {
		g.FabricGrace.Duration = 5 * time.Minute
	}
	if g.IBErrorThreshold == 0 {
		g.IBErrorThreshold = 10
	}
	if g.IBErrorWindow.Duration == 0 {
		g.IBErrorWindow.Duration = 10 * time.Minute
	}
	if g.IBFlapWindow.Duration == 0 {
		g.IBFlapWindow.Duration = 5 * time.Minute
	}
	if g.IBDownGrace.Duration == 0 {
		g.IBDownGrace.Duration = time.Minute
	}
	if g.FabricManagerFlapRestarts == 0 {
		g.FabricManagerFlapRestarts = 3
	}
	if g.FabricManagerWindow.Duration == 0 {
		g.FabricManagerWindow.Duration = 10 * time.Minute
	}
	if g.DriftInterval.Duration == 0 {
		g.DriftInterval.Duration = time.Minute
	}
}

func (g *GPUHealth) validate() error {
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"gpuHealth.pcieReplayWindow", g.PCIeReplayWindow.Duration}, {"gpuHealth.logFindingHold", g.LogFindingHold.Duration},
		{"gpuHealth.fabricGrace", g.FabricGrace.Duration}, {"gpuHealth.ibErrorWindow", g.IBErrorWindow.Duration},
		{"gpuHealth.ibFlapWindow", g.IBFlapWindow.Duration}, {"gpuHealth.ibDownGrace", g.IBDownGrace.Duration},
		{"gpuHealth.fabricManagerWindow", g.FabricManagerWindow.Duration}, {"gpuHealth.driftInterval", g.DriftInterval.Duration}} {
		if d.v < time.Second || d.v > 24*time.Hour {
			return &Error{Key: d.key, Msg: fmt.Sprintf("%v: want 1s to 24h", d.v)}
		}
	}
	if g.FabricManagerFlapRestarts > 100 {
		return &Error{Key: "gpuHealth.fabricManagerFlapRestarts", Msg: fmt.Sprintf("%d: want 1 to 100", g.FabricManagerFlapRestarts)}
	}
	return nil
}

// Thresholds is g as Welcome carries it.
func (g GPUHealth) Thresholds() *sessionv1.GPUHealthThresholds {
	return &sessionv1.GPUHealthThresholds{
		PcieReplayThreshold:       g.PCIeReplayThreshold,
		PcieReplayWindow:          durationpb.New(g.PCIeReplayWindow.Duration),
		PcieCheckGeneration:       g.PCIeCheckGeneration,
		LogFindingHold:            durationpb.New(g.LogFindingHold.Duration),
		FabricGrace:               durationpb.New(g.FabricGrace.Duration),
		IbErrorThreshold:          g.IBErrorThreshold,
		IbErrorWindow:             durationpb.New(g.IBErrorWindow.Duration),
		IbFlapWindow:              durationpb.New(g.IBFlapWindow.Duration),
		IbDownGrace:               durationpb.New(g.IBDownGrace.Duration),
		IgnorePersistenceMode:     g.IgnorePersistenceMode,
		FabricManagerFlapRestarts: g.FabricManagerFlapRestarts,
		FabricManagerWindow:       durationpb.New(g.FabricManagerWindow.Duration),
	}
}
