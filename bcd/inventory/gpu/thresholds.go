package gpu

import (
	"cmp"
	"time"
)

// Thresholds are the limits of the health readings that the control plane
// sets (gpuHealth.* in its configuration, sent to bcd in Welcome;
// docs/configuration.md). A zero field keeps the default.
type Thresholds struct {
	// PCIeReplayThreshold is the rise of a GPU's PCIe replay counter within
	// PCIeReplayWindow at which the GPU is reported degraded. Default 100
	// replays: our heuristic (NVIDIA's DCGM diagnostic fails a PCIe test at
	// a replay rate, not a count; a healthy link stays near 0).
	PCIeReplayThreshold uint64
	// PCIeReplayWindow is the window of PCIeReplayThreshold. Default 10 min.
	PCIeReplayWindow time.Duration
	// PCIeCheckGeneration makes a link below its maximum PCIe generation
	// a finding. Default false: idle GPUs lower the generation to save
	// power (ASPM and the driver's link speed management), so only a
	// narrower width is judged unless this is set.
	PCIeCheckGeneration bool
	// LogFindingHold is how long a finding made of kernel-log lines (a PCIe
	// AER error) holds after its last line; a later line within it is the
	// same episode. Default 10 min.
	LogFindingHold time.Duration
	// FabricGrace is how long a GPU's NVLink fabric state may stay short of
	// completed (nvidia-fabricmanager trains the fabric at boot) before it
	// is a finding. Default 5 min.
	FabricGrace time.Duration
	// IgnorePersistenceMode leaves a GPU with persistence mode off without
	// a finding. Default false: off is a degraded finding (gpud warns of
	// it too); a fleet that keeps the driver loaded another way sets it.
	IgnorePersistenceMode bool
	// FabricManagerFlapRestarts is how many restarts of nvidia-fabricmanager
	// within FabricManagerWindow make it flapping. Default 3: our
	// heuristic (one restart is an operator or an upgrade).
	FabricManagerFlapRestarts uint64
	// FabricManagerWindow is the window of FabricManagerFlapRestarts, and
	// the stabilisation window: a fabric-manager finding ends once the
	// unit has stayed up this long without a restart. Default 10 min.
	FabricManagerWindow time.Duration
}

// DefaultThresholds are the Thresholds a zero field stands for.
var DefaultThresholds = Thresholds{PCIeReplayThreshold: 100, PCIeReplayWindow: 10 * time.Minute, LogFindingHold: 10 * time.Minute,
	FabricGrace: 5 * time.Minute, FabricManagerFlapRestarts: 3, FabricManagerWindow: 10 * time.Minute}

// withDefaults returns t with its zero fields set from DefaultThresholds;
// negative durations count as zero.
func (t Thresholds) withDefaults() Thresholds {
	d := DefaultThresholds
	t.PCIeReplayThreshold = cmp.Or(t.PCIeReplayThreshold, d.PCIeReplayThreshold)
	t.PCIeReplayWindow = cmp.Or(max(t.PCIeReplayWindow, 0), d.PCIeReplayWindow)
	t.LogFindingHold = cmp.Or(max(t.LogFindingHold, 0), d.LogFindingHold)
	t.FabricGrace = cmp.Or(max(t.FabricGrace, 0), d.FabricGrace)
	t.FabricManagerFlapRestarts = cmp.Or(t.FabricManagerFlapRestarts, d.FabricManagerFlapRestarts)
	t.FabricManagerWindow = cmp.Or(max(t.FabricManagerWindow, 0), d.FabricManagerWindow)
	return t
}

// SetThresholds replaces the Collector's thresholds (zero fields keep the
// defaults); the next Collect and kernel-log line use them. bcd calls it
// with what each Welcome carries.
func (c *Collector) SetThresholds(t Thresholds) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.th = t.withDefaults()
}

// Thresholds returns the thresholds in force.
func (c *Collector) Thresholds() Thresholds {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.th
}
