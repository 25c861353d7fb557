package gpu

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/xid"
)

// resolutionRank orders resolutions by strength (xid.Rank): a GPU's
// Resolution is the strongest of its causes'.
func resolutionRank(r string) int { return xid.Rank(r) }

// xidHealth is the health an XID whose resolution is r implies while it
// holds (xid.ImpactOf; the table in the package documentation).
func xidHealth(r string) Health {
	switch xid.ImpactOf(r) {
	case xid.ImpactFailed:
		return HealthFailed
	case xid.ImpactDegraded:
		return HealthDegraded
	default:
		return HealthOK
	}
}

// xidSeverity grades an XID event of resolution r.
func xidSeverity(r string) Severity {
	if r == xid.RestartApp {
		return SeverityWarning // the application failed, the GPU did not
	}
	return severityOf(xidHealth(r))
}

// seenXID is an XID that holds a GPU's health until the GPU is reset.
type seenXID struct {
	entry xid.Entry
	at    time.Time
}

// nvlinkSample is one reading of a GPU's NVLink error totals.
type nvlinkSample struct {
	at    time.Time
	total uint64
}

// gpuState is what the Collector remembers about one GPU between calls,
// keyed by UUID: XIDs and ECC events seen by Watch and WatchKernelLog, the
// last corrected-ECC count and the NVLink error readings of the window.
type gpuState struct {
	// xids maps each XID code that affects health to its latest sighting.
	// They hold until the GPU is reset (ResetDone) or bcd starts again
	// in a new boot.
	xids map[uint32]seenXID
	// reported is when each XID code was last passed on as an Event, for
	// the deduplication of NVML events and kernel-log lines.
	reported map[uint32]time.Time
	// resetAt is when the GPU was last reset successfully; XIDs logged
	// before it are history, not causes.
	resetAt time.Time
	// uncorrectedEvent is when the last double-bit ECC event arrived; zero
	// when none did since the last reset.
	uncorrectedEvent time.Time
	// lastCorrected is the volatile corrected ECC count at the previous
	// Collect; nil before the first reading.
	lastCorrected *uint64
	// nvlink holds the NVLink error totals read within the window, oldest
	// first.
	nvlink []nvlinkSample
	// scanned holds the keys of the reading findings of the previous
	// Collect (finding.key), so each is reported once while it holds.
	scanned map[string]bool
	// pcieReplay holds the PCIe replay counter readings of the window,
	// oldest first.
	pcieReplay []nvlinkSample
	// fabricSince is when the GPU's fabric state was first read short of
	// completed, zero while it is completed (or the GPU has no fabric).
	fabricSince time.Time
	// aer holds the latest kernel-log AER error of each severity until
	// Thresholds.LogFindingHold has passed since it.
	aer map[string]heldAER
}

// heldAER is the latest AER line of one severity on a GPU.
type heldAER struct {
	at   time.Time
	line string
}

func newState() *gpuState {
	return &gpuState{xids: map[uint32]seenXID{}, reported: map[uint32]time.Time{}}
}

// finding is one cause of a GPU's health.
type finding struct {
	health     Health
	reason     string
	resolution string
	// xid, mnemonic and at are set for a finding that is an XID.
	xid      uint32
	mnemonic string
	at       time.Time
	// signal is the Event a finding of a reading is reported as (its kind
	// and signal fields; assess completes it), nil for XIDs and ECC events
	// (Watch reports those). key tells it from the others of its GPU.
	signal *Event
	key    string
}

// assessParams carries the thresholds assess needs from the Config.
type assessParams struct {
	now             time.Time
	correctedSpike  uint64
	nvlinkWindow    time.Duration
	nvlinkThreshold uint64
	th              Thresholds
}

// Clock event reasons that mean the GPU is being slowed down by heat or by
// a power brake (NVML's nvmlClocksEventReason*). The software power cap is
// not one: running at the power limit is normal operation.
const throttleMask = nvml.ClocksThrottleReasonHwSlowdown | nvml.ClocksEventReasonSwThermalSlowdown |
	nvml.ClocksThrottleReasonHwThermalSlowdown | nvml.ClocksThrottleReasonHwPowerBrakeSlowdown

// throttleNames names the bits of throttleMask.
var throttleNames = []struct {
	bit  uint64
	name string
}{
	{nvml.ClocksThrottleReasonHwSlowdown, "hardware slowdown"},
	{nvml.ClocksEventReasonSwThermalSlowdown, "software thermal slowdown"},
	{nvml.ClocksThrottleReasonHwThermalSlowdown, "hardware thermal slowdown"},
	{nvml.ClocksThrottleReasonHwPowerBrakeSlowdown, "hardware power brake"},
}

// recoveryActions maps the driver's recovery action (NVML field
// FI_DEV_GET_GPU_RECOVERY_ACTION) to a health and resolution.
var recoveryActions = map[nvml.DeviceGpuRecoveryAction]struct {
	name       string
	health     Health
	resolution string
}{
	nvml.GPU_RECOVERY_ACTION_GPU_RESET:           {"GPU_RESET", HealthFailed, xid.ResetGPU},
	nvml.GPU_RECOVERY_ACTION_NODE_REBOOT:         {"NODE_REBOOT", HealthFailed, xid.RestartBM},
	nvml.GPU_RECOVERY_ACTION_DRAIN_P2P:           {"DRAIN_P2P", HealthDegraded, xid.Escalate},
	nvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET:     {"DRAIN_AND_RESET", HealthFailed, xid.ResetGPU},
	nvml.GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN: {"RECOVER_IMEX_DOMAIN", HealthDegraded, xid.Escalate},
	nvml.GPU_RECOVERY_ACTION_BUS_RESET:           {"BUS_RESET", HealthFailed, xid.ResetGPU},
	nvml.GPU_RECOVERY_ACTION_SYSTEM_REBOOT:       {"SYSTEM_REBOOT", HealthFailed, xid.RestartBM},
}

// recoveryActionName names a recovery action the way NVML's header does,
// without its prefix; "" for NONE.
func recoveryActionName(a nvml.DeviceGpuRecoveryAction) string {
	if a == nvml.GPU_RECOVERY_ACTION_NONE {
		return ""
	}
	if r, ok := recoveryActions[a]; ok {
		return r.name
	}
	return fmt.Sprintf("ACTION_%d", a)
}

// assess sets g.Health, g.HealthReasons, g.Resolution, g.XID and
// g.XIDMnemonic from pre (findings made while reading the GPU, such as a
// lost GPU), g's readings and st (what Watch and WatchKernelLog saw). It
// updates st's corrected-ECC baseline and NVLink window. st may be nil (no
// UUID known). Nothing in st holds a GPU unhealthy except an XID or an ECC
// event, and those end with a reset (ResetDone): every other finding is
// read anew each time.
func assess(g *GPU, pre []finding, st *gpuState, p assessParams) {
	fs := slices.Clone(pre)
	if g.ECC != nil && g.ECC.VolatileUncorrected != nil && *g.ECC.VolatileUncorrected > 0 {
		n := *g.ECC.VolatileUncorrected
		fs = append(fs, finding{health: HealthFailed, resolution: xid.ResetGPU,
			reason: fmt.Sprintf("uncorrectable ECC errors: %d since driver load or reset", n),
			key:    EventKindECCUncorrected, signal: &Event{Kind: EventKindECCUncorrected, ECCCount: n,
				Counters: map[string]uint64{"eccVolatileUncorrected": n}}})
	}
	if rr := g.RemappedRows; rr != nil {
		remap := func() *Event {
			c := *rr
			return &Event{Kind: EventKindRowRemap, RemappedRows: &c, Counters: map[string]uint64{
				"remappedRowsCorrectable": uint64(max(rr.Corrected, 0)), "remappedRowsUncorrectable": uint64(max(rr.Uncorrected, 0))}}
		}
		if rr.Failure {
			fs = append(fs, finding{health: HealthFailed, resolution: xid.ContactSupport,
				reason: "row remapping failure: GPU out of spare rows", key: EventKindRowRemap + "/failure", signal: remap()})
		}
		if rr.Pending {
			fs = append(fs, finding{health: HealthDegraded, resolution: xid.ResetGPU,
				reason: "row remapping pending: GPU reset required", key: EventKindRowRemap + "/pending", signal: remap()})
		}
	}
	if rp := g.RetiredPages; rp != nil && rp.Pending != nil && *rp.Pending {
		fs = append(fs, finding{health: HealthDegraded, resolution: xid.ResetGPU,
			reason: "retired pages pending: GPU reset or reboot required",
			key:    EventKindRetiredPages, signal: &Event{Kind: EventKindRetiredPages}})
	}
	if r := g.ClocksEventReasons; r != nil && *r&throttleMask != 0 {
		var names []string
		for _, t := range throttleNames {
			if *r&t.bit != 0 {
				names = append(names, t.name)
			}
		}
		fs = append(fs, finding{health: HealthDegraded, resolution: "CHECK_MECHANICALS",
			reason: "clocks throttled: " + strings.Join(names, ", "),
			key:    fmt.Sprintf("%s/%d", EventKindClocks, *r&throttleMask),
			signal: &Event{Kind: EventKindClocks, ClocksEventReasons: *r, ClockReasons: names,
				Counters: map[string]uint64{"clocksEventReasons": *r}}})
	}
	if a := g.RecoveryAction; a != "" {
		f := finding{health: HealthDegraded, resolution: xid.Escalate, reason: "driver recovery action: " + a,
			key: EventKindRecoveryAction + "/" + a, signal: &Event{Kind: EventKindRecoveryAction, RecoveryAction: a}}
		for _, r := range recoveryActions {
			if r.name == a {
				f.health, f.resolution = r.health, r.resolution
			}
		}
		fs = append(fs, f)
	}
	fs = append(fs, pcieLinkFindings(g.PCIe, p.th)...)
	fs = append(fs, persistenceFinding(g.PersistenceMode, p.th)...)
	if st != nil {
		fs = append(fs, st.pcieFindings(g.PCIe, p)...)
		fs = append(fs, st.fabricFindings(g.Fabric, p)...)
		if g.ECC != nil && g.ECC.VolatileCorrected != nil {
			cur := *g.ECC.VolatileCorrected
			if last := st.lastCorrected; last != nil && cur >= *last && cur-*last >= p.correctedSpike {
				fs = append(fs, finding{health: HealthDegraded, resolution: xid.Ignore,
					reason: fmt.Sprintf("corrected ECC errors rose by %d since the last collection", cur-*last),
					key:    EventKindECCCorrected, signal: &Event{Kind: EventKindECCCorrected, ECCCount: cur - *last,
						Counters: map[string]uint64{"eccVolatileCorrected": cur, "eccVolatileCorrectedBefore": *last}}})
			}
			st.lastCorrected = &cur
		}
		if d, ok := st.nvlinkDelta(g.NVLinkErrors, p); ok && d >= p.nvlinkThreshold {
			n := g.NVLinkErrors
			fs = append(fs, finding{health: HealthDegraded, resolution: xid.Escalate,
				reason: fmt.Sprintf("NVLink errors rose by %d within %v", d, p.nvlinkWindow),
				key:    EventKindNVLink, signal: &Event{Kind: EventKindNVLink, NVLinkErrors: d, NVLinkWindow: p.nvlinkWindow,
					Counters: map[string]uint64{"nvlinkCrcFlit": n.CRCFlit, "nvlinkCrcData": n.CRCData,
						"nvlinkReplay": n.Replay, "nvlinkRecovery": n.Recovery}}})
		}
		if !st.uncorrectedEvent.IsZero() {
			fs = append(fs, finding{health: HealthFailed, resolution: xid.ResetGPU, reason: "uncorrectable ECC error event",
				at: st.uncorrectedEvent})
		}
		for _, code := range slices.Sorted(maps.Keys(st.xids)) {
			s := st.xids[code]
			fs = append(fs, finding{health: xidHealth(s.entry.Resolution), reason: xidReason(s.entry),
				resolution: s.entry.Resolution, xid: code, mnemonic: s.entry.Mnemonic, at: s.at})
		}
	}
	slices.SortStableFunc(fs, func(a, b finding) int { return cmp.Compare(b.health.rank(), a.health.rank()) })
	g.NewFindings = nil
	if st != nil {
		g.NewFindings = st.newFindings(g, fs, p.now)
	}

	g.Health, g.HealthReasons, g.Resolution, g.XID, g.XIDMnemonic = HealthOK, nil, "", 0, ""
	var latest time.Time
	var latestRank int
	for _, f := range fs {
		if f.health.rank() > g.Health.rank() {
			g.Health = f.health
		}
		if resolutionRank(f.resolution) > resolutionRank(g.Resolution) {
			g.Resolution = f.resolution
		}
		// The most recent XID; of two seen at once, the one that calls
		// for more.
		if r := resolutionRank(f.resolution); f.xid != 0 && (f.at.After(latest) || f.at.Equal(latest) && r > latestRank) {
			latest, latestRank, g.XID, g.XIDMnemonic = f.at, r, f.xid, f.mnemonic
		}
		g.HealthReasons = append(g.HealthReasons, f.reason)
	}
}

// xidReason is the health reason of an XID, for example
// "XID 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS: RESTART_BM".
func xidReason(e xid.Entry) string {
	return fmt.Sprintf("XID %d %s: %s", e.Code, cmp.Or(e.Mnemonic, "(not in NVIDIA's catalogue)"), e.Resolution)
}

// nvlinkDelta adds the reading n to the window and returns how much the
// totals rose within it. Aggregate counters never go down; when they do
// (the driver was reloaded) the window starts again. ok is false without a
// reading.
func (st *gpuState) nvlinkDelta(n *NVLinkErrors, p assessParams) (uint64, bool) {
	if n == nil {
		st.nvlink = nil
		return 0, false
	}
	return windowDelta(&st.nvlink, n.CRCFlit+n.CRCData+n.Replay+n.Recovery, p.now, p.nvlinkWindow), true
}

// windowDelta adds the reading total of a counter that only grows, read at
// now, to samples and returns how much it rose within window. A fall (the
// driver was reloaded) starts the window again.
func windowDelta(samples *[]nvlinkSample, total uint64, now time.Time, window time.Duration) uint64 {
	s := *samples
	if k := len(s); k > 0 && total < s[k-1].total {
		s = nil
	}
	s = append(s, nvlinkSample{at: now, total: total})
	// Keep the newest sample at or before the window's start as the
	// baseline, and everything after it.
	start := now.Add(-window)
	for len(s) > 1 && !s[1].at.After(start) {
		s = s[1:]
	}
	*samples = s
	return total - s[0].total
}

// newFindings returns the reading findings of fs whose key the previous
// Collect did not have, as Events of g observed at now, and keeps fs's keys
// for the next Collect.
func (st *gpuState) newFindings(g *GPU, fs []finding, now time.Time) []Event {
	seen := make(map[string]bool, len(fs))
	var out []Event
	for _, f := range fs {
		if f.signal == nil || seen[f.key] {
			continue
		}
		seen[f.key] = true
		if st.scanned[f.key] {
			continue
		}
		ev := *f.signal
		ev.GPUUUID, ev.Serial, ev.PCIBusID = g.UUID, g.Serial, g.PCIBusID
		ev.Immediate, ev.Resolution, ev.Health, ev.Severity = f.resolution, f.resolution, f.health, severityOf(f.health)
		ev.Source, ev.Time = SourceScan, now
		ev.Message = fmt.Sprintf("GPU %d (%s): %s", g.Index, g.UUID, f.reason)
		out = append(out, ev)
	}
	st.scanned = seen
	return out
}
