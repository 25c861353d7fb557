package sim

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/xid"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// The health signals of issue 43 (docs/gpu-health.md): a FakeDaemon sends
// each as bcd does, with the same signal, resolution and health (bcd's
// health rules, package bcd/inventory/gpu), once when it appears, and the
// next inventory shows the GPU's health until the reading is set back.
// Setting a reading back ends it (the next inventory reads ok); ClearFaults
// ends them all, and a reboot all but the versions.

// Readings the daemon keeps as causes (gpuCause.key).
const (
	keyPCIe          = "pcie"
	keyFabric        = "fabric"
	keyPersistence   = "persistence"
	keyFabricManager = "fabric-manager"
)

// simPCIeWidth and simPCIeGeneration are the simulated GPUs' PCIe link at
// its best (an A100 SXM4's).
const (
	simPCIeWidth      = 16
	simPCIeGeneration = 4
)

// PCIeFault is a PCIe link fault of a simulated GPU; at least one field is
// set.
type PCIeFault struct {
	// Replays is how much the replay counter rose within bcd's window (at
	// least gpuHealth.pcieReplayThreshold, 100 by default).
	Replays uint64
	// Width is the link's width in lanes when below its 16; 0: full.
	Width int
	// AER is an AER error the kernel logged for the GPU: "corrected"
	// (the event only), "non-fatal" or "fatal".
	AER string
}

// aerRules are bcd's AER severities: resolution and health.
var aerRules = map[string]struct {
	resolution string
	health     sessionv1.GPUHealthState
}{
	"corrected": {xid.Ignore, sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK},
	"non-fatal": {"CHECK_MECHANICALS", sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED},
	"fatal":     {xid.RestartBM, sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED},
}

// RaisePCIe makes GPU i report p: replays rising or a narrowed link
// (degraded, CHECK_MECHANICALS), or an AER error (corrected: IGNORE and
// the event only; non-fatal: degraded, CHECK_MECHANICALS; fatal: failed,
// RESTART_BM). A gpu.pcie Event goes at once; the GPU's health holds until
// ClearPCIe. Errors: ErrNoSuchGPU, ErrBadFault for an empty fault or an
// unknown AER severity.
func (d *FakeDaemon) RaisePCIe(i int, p PCIeFault) error {
	g, err := d.gpuAt(i)
	if err != nil {
		return err
	}
	s := &sessionv1.PCIeSignal{Replays: p.Replays, AerSeverity: p.AER, LinkGeneration: simPCIeGeneration,
		MaxLinkGeneration: simPCIeGeneration, LinkWidth: uint32(cmp.Or(p.Width, simPCIeWidth)), MaxLinkWidth: simPCIeWidth}
	resolution, health := "CHECK_MECHANICALS", sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED
	var reason string
	switch {
	case p.AER != "":
		r, ok := aerRules[p.AER]
		if !ok {
			return fmt.Errorf("%w: AER severity %q: want corrected, non-fatal or fatal", ErrBadFault, p.AER)
		}
		resolution, health, reason = r.resolution, r.health, "PCIe AER error: "+p.AER
	case p.Replays > 0:
		s.Window = durationpb.New(10 * time.Minute)
		reason = fmt.Sprintf("PCIe replays rose by %d within 10m0s", p.Replays)
	case p.Width > 0 && p.Width < simPCIeWidth:
		reason = fmt.Sprintf("PCIe link width x%d below its maximum x%d", p.Width, simPCIeWidth)
	default:
		return fmt.Errorf("%w: an empty PCIe fault", ErrBadFault)
	}
	f := &sessionv1.GPUFinding{Signal: &sessionv1.GPUFinding_Pcie{Pcie: s}, ImmediateResolution: resolution,
		Resolution: resolution, Health: health}
	var c *gpuCause
	if health != sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK {
		c = &gpuCause{reason: reason, resolution: resolution, health: health}
	}
	d.setReading(i, g, keyPCIe, c, f, reason)
	return nil
}

// ClearPCIe ends GPU i's PCIe fault: the next inventory reads its link
// healthy. Errors: ErrNoSuchGPU.
func (d *FakeDaemon) ClearPCIe(i int) error {
	g, err := d.gpuAt(i)
	if err != nil {
		return err
	}
	d.setReading(i, g, keyPCIe, nil, nil, "")
	return nil
}

// fabricStates are NVML's fabric states without their prefix.
var fabricStates = []string{"NOT_STARTED", "IN_PROGRESS", "COMPLETED"}

// SetFabricState sets GPU i's NVLink fabric state (NVML's, without its
// prefix): "NOT_STARTED" or "IN_PROGRESS" is a gpu.fabric finding past
// bcd's grace (sent at once here: degraded, ESCALATE); "COMPLETED" ends
// it. Errors: ErrNoSuchGPU, ErrBadFault for another state.
func (d *FakeDaemon) SetFabricState(i int, state string) error {
	g, err := d.gpuAt(i)
	if err != nil {
		return err
	}
	if !slices.Contains(fabricStates, state) {
		return fmt.Errorf("%w: fabric state %q: want one of %v", ErrBadFault, state, fabricStates)
	}
	if state == "COMPLETED" {
		d.setReading(i, g, keyFabric, nil, nil, "")
		return nil
	}
	reason := "NVLink fabric state " + state
	f := &sessionv1.GPUFinding{Signal: &sessionv1.GPUFinding_Fabric{Fabric: &sessionv1.FabricSignal{State: state, Status: "SUCCESS",
		For: durationpb.New(5 * time.Minute)}}, ImmediateResolution: xid.Escalate, Resolution: xid.Escalate,
		Health: sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED}
	d.setReading(i, g, keyFabric, &gpuCause{reason: reason, resolution: xid.Escalate,
		health: sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED}, f, reason)
	return nil
}

// SetPersistenceMode sets GPU i's persistence mode: off is a
// gpu.persistence finding (degraded, IGNORE: no action by default); on
// ends it. Errors: ErrNoSuchGPU.
func (d *FakeDaemon) SetPersistenceMode(i int, on bool) error {
	g, err := d.gpuAt(i)
	if err != nil {
		return err
	}
	if on {
		d.setReading(i, g, keyPersistence, nil, nil, "")
		return nil
	}
	f := &sessionv1.GPUFinding{Signal: &sessionv1.GPUFinding_Persistence{Persistence: &sessionv1.PersistenceModeSignal{}},
		ImmediateResolution: xid.Ignore, Resolution: xid.Ignore, Health: sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED}
	d.setReading(i, g, keyPersistence, &gpuCause{reason: "persistence mode off", resolution: xid.Ignore,
		health: sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED}, f, "persistence mode off")
	return nil
}

// SetFabricManager sets the nvidia-fabricmanager unit's ActiveState:
// anything but "active" is down, one gpu.fabric-manager finding of the
// node (naming no GPU; degraded, ESCALATE) with every GPU degraded;
// "active" ends it (at once: the simulator has no stabilisation window).
func (d *FakeDaemon) SetFabricManager(activeState string) {
	f := d.faults()
	up := activeState == "active" || activeState == "reloading"
	reason := "nvidia-fabricmanager.service not running: " + activeState
	f.mu.Lock()
	raised := false
	for i := range d.inv.GetGpus() {
		var c *gpuCause
		if !up {
			c = &gpuCause{reason: reason, resolution: xid.Escalate, health: sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED}
		}
		had := f.setCauseLocked(i, keyFabricManager, c)
		raised = raised || !had && !up
	}
	f.mu.Unlock()
	if !raised {
		d.sendInventoryIfDue()
		return
	}
	now := timestamppb.Now()
	fd := &sessionv1.GPUFinding{Signal: &sessionv1.GPUFinding_FabricManager{FabricManager: &sessionv1.FabricManagerSignal{
		ActiveState: activeState, SubState: activeState, LoadState: "loaded", DownFor: durationpb.New(5 * time.Minute)}},
		ImmediateResolution: xid.Escalate, Resolution: xid.Escalate, Health: sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED,
		Evidence: &sessionv1.GPUFindingEvidence{Source: "sim", Message: reason}, ObservedAt: now}
	d.report(&sessionv1.Event{Kind: gpufinding.KindFabricManager, Time: now, Severity: sessionv1.Severity_SEVERITY_WARNING,
		Resolution: xid.Escalate, Message: reason, Attributes: map[string]string{"source": "sim"}, GpuFinding: fd})
}

// RemoveGPU makes GPU i fall off the bus without a word: the inventory
// lists one GPU fewer (bcd's record of the GPUs it has seen still names
// it), which the gateway judges against the node's expected count (a
// gpu.missing finding, RESTART_BM). RestoreGPU, ClearFaults or a reboot
// bring it back. Errors: ErrNoSuchGPU.
func (d *FakeDaemon) RemoveGPU(i int) error { return d.setRemoved(i, true) }

// board is a GPU board swapped into a slot (SwapGPU).
type board struct{ uuid, serial string }

// SwapGPU puts another board in GPU i's slot, as a repair that moves a
// board from one machine to another does: the inventory lists uuid and
// serial there from now on, and faults raised on GPU i name them. Giving
// the UUID of a board another node lists too makes a UUID conflict (a
// copied image, issue 44). The simulated machine's own boards have UUIDs
// unique per node (derived from its name). Errors: ErrNoSuchGPU,
// ErrBadFault for an empty uuid.
func (d *FakeDaemon) SwapGPU(i int, uuid, serial string) error {
	if _, err := d.gpuAt(i); err != nil {
		return err
	}
	if uuid == "" {
		return fmt.Errorf("%w: a swapped GPU needs a UUID", ErrBadFault)
	}
	f := d.faults()
	f.mu.Lock()
	if f.boards[i] != (board{uuid, serial}) {
		if f.boards == nil {
			f.boards = map[int]board{}
		}
		f.boards[i] = board{uuid, serial}
		f.version++
	}
	f.mu.Unlock()
	d.sendInventoryIfDue()
	return nil
}

// RestoreGPU lists GPU i again after RemoveGPU. Errors: ErrNoSuchGPU.
func (d *FakeDaemon) RestoreGPU(i int) error { return d.setRemoved(i, false) }

func (d *FakeDaemon) setRemoved(i int, removed bool) error {
	if _, err := d.gpuAt(i); err != nil {
		return err
	}
	f := d.faults()
	f.mu.Lock()
	if f.removed[i] != removed {
		if f.removed == nil {
			f.removed = map[int]bool{}
		}
		f.removed[i] = removed
		if !removed {
			delete(f.removed, i)
		}
		f.version++
	}
	f.mu.Unlock()
	d.sendInventoryIfDue()
	return nil
}

// SetVersions makes every GPU of the inventory report driver and CUDA
// version cuda ("" keeps the simulated 550.54.15 and 12.4): a node whose
// versions differ from its pool's drifts (docs/gpu-health.md, "Drift"),
// judged by the control plane. ClearFaults sets them back; a reboot keeps
// them, as it keeps an installed driver.
func (d *FakeDaemon) SetVersions(driver, cuda string) {
	f := d.faults()
	f.mu.Lock()
	if f.driver != driver || f.cuda != cuda {
		f.driver, f.cuda = driver, cuda
		f.version++
	}
	f.mu.Unlock()
	d.sendInventoryIfDue()
}

// setCauseLocked replaces GPU i's cause of key with c (nil: removes it)
// and reports whether one was there before. f.mu must be held.
func (f *faultState) setCauseLocked(i int, key string, c *gpuCause) (had bool) {
	cs := f.causes[i]
	k := slices.IndexFunc(cs, func(c gpuCause) bool { return c.key == key })
	had = k >= 0
	switch {
	case c == nil && !had:
		return false
	case c == nil:
		f.causes[i] = slices.Delete(cs, k, k+1)
	case had:
		c.key, c.at = key, cs[k].at
		cs[k] = *c
	default:
		c.key, c.at = key, time.Now()
		f.causes[i] = append(cs, *c)
	}
	f.version++
	return had
}

// setReading sends finding f (completed with g's identity and msg) as bcd
// would, and sets GPU i's reading cause of key to c; f nil ends the cause,
// c nil with a finding (an event only, such as a corrected AER error)
// leaves it. The inventory goes after the event.
func (d *FakeDaemon) setReading(i int, g *sessionv1.GPU, key string, c *gpuCause, f *sessionv1.GPUFinding, msg string) {
	if c != nil || f == nil {
		fs := d.faults()
		fs.mu.Lock()
		fs.setCauseLocked(i, key, c)
		fs.mu.Unlock()
	}
	if f == nil {
		d.sendInventoryIfDue()
		return
	}
	now := timestamppb.Now()
	f.ObservedAt = now
	msg = fmt.Sprintf("GPU %d (%s): %s", i, g.GetUuid(), msg)
	sev := sessionv1.Severity_SEVERITY_WARNING
	switch f.GetHealth() {
	case sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED:
		sev = sessionv1.Severity_SEVERITY_CRITICAL
	case sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK:
		sev = sessionv1.Severity_SEVERITY_INFO
	}
	d.report(&sessionv1.Event{Kind: gpufinding.Kind(f), Time: now, Severity: sev, GpuUuid: g.GetUuid(),
		Resolution: f.GetResolution(), Message: msg, Attributes: map[string]string{"source": "sim"},
		GpuFinding: simFinding(g, f, msg)})
}
