package gpu

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"
)

// xidClass maps an XID number to the health it implies and a short
// description. The table is documented in doc.go; its source is NVIDIA's
// XID catalogue (https://docs.nvidia.com/deploy/xid-errors/). XIDs not
// listed here leave health unchanged.
func xidClass(xid uint64) (Health, string) {
	switch xid {
	case 79:
		return HealthFailed, "GPU has fallen off the bus"
	case 48:
		return HealthFailed, "double-bit ECC error"
	case 63:
		return HealthFailed, "ECC page retirement or row remapping recording event"
	case 64:
		return HealthFailed, "ECC page retirement or row remapper recording failure"
	case 74:
		return HealthFailed, "NVLink error"
	case 92:
		return HealthFailed, "high single-bit ECC error rate"
	case 94:
		return HealthFailed, "contained ECC error"
	case 95:
		return HealthFailed, "uncontained ECC error"
	case 13:
		return HealthDegraded, "graphics engine exception"
	case 31:
		return HealthDegraded, "GPU memory page fault"
	case 43:
		return HealthDegraded, "GPU stopped processing"
	default:
		return HealthOK, "see NVIDIA's XID catalogue"
	}
}

// gpuState is what the Collector remembers about one GPU between calls,
// keyed by UUID: events seen by Watch and the last corrected-ECC count.
type gpuState struct {
	// xids maps an XID that implies degraded or failed health to the last
	// time it was seen.
	xids map[uint64]time.Time
	// uncorrectedEvent is when the last double-bit ECC event arrived; zero
	// when none did.
	uncorrectedEvent time.Time
	// lastCorrected is the volatile corrected ECC count at the previous
	// Collect; nil before the first reading.
	lastCorrected *uint64
}

type finding struct {
	health Health
	reason string
}

// assessParams carries the thresholds assess needs from the Config.
type assessParams struct {
	now               time.Time
	correctedSpike    uint64
	degradedXIDWindow time.Duration
}

// assess sets g.Health and g.HealthReasons from pre (findings made while
// reading the GPU, such as a lost GPU), g's counters and st (events from
// Watch). It updates st's corrected-ECC baseline and forgets degraded XIDs
// older than the window. st may be nil (no UUID known).
func assess(g *GPU, pre []finding, st *gpuState, p assessParams) {
	fs := slices.Clone(pre)
	if g.ECC != nil && g.ECC.VolatileUncorrected != nil && *g.ECC.VolatileUncorrected > 0 {
		fs = append(fs, finding{HealthFailed,
			fmt.Sprintf("uncorrectable ECC errors: %d since driver load", *g.ECC.VolatileUncorrected)})
	}
	if rr := g.RemappedRows; rr != nil {
		if rr.Failure {
			fs = append(fs, finding{HealthFailed, "row remapping failure: GPU out of spare rows"})
		}
		if rr.Pending {
			fs = append(fs, finding{HealthDegraded, "row remapping pending: GPU reset required"})
		}
	}
	if rp := g.RetiredPages; rp != nil && rp.Pending != nil && *rp.Pending {
		fs = append(fs, finding{HealthDegraded, "retired pages pending: GPU reset or reboot required"})
	}
	if st != nil {
		if g.ECC != nil && g.ECC.VolatileCorrected != nil {
			cur := *g.ECC.VolatileCorrected
			if last := st.lastCorrected; last != nil && cur >= *last && cur-*last >= p.correctedSpike {
				fs = append(fs, finding{HealthDegraded,
					fmt.Sprintf("corrected ECC errors rose by %d since the last collection", cur-*last)})
			}
			st.lastCorrected = &cur
		}
		if !st.uncorrectedEvent.IsZero() {
			fs = append(fs, finding{HealthFailed, "uncorrectable ECC error event"})
		}
		for _, xid := range slices.Sorted(maps.Keys(st.xids)) {
			h, desc := xidClass(xid)
			if h == HealthDegraded && p.now.Sub(st.xids[xid]) > p.degradedXIDWindow {
				delete(st.xids, xid)
				continue
			}
			fs = append(fs, finding{h, fmt.Sprintf("XID %d: %s", xid, desc)})
		}
	}
	slices.SortStableFunc(fs, func(a, b finding) int { return cmp.Compare(b.health.rank(), a.health.rank()) })

	g.Health = HealthOK
	g.HealthReasons = nil
	for _, f := range fs {
		if f.health.rank() > g.Health.rank() {
			g.Health = f.health
		}
		g.HealthReasons = append(g.HealthReasons, f.reason)
	}
}
