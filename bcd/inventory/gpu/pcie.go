package gpu

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/kmsg"
	"github.com/better-compute/better-compute/bcd/inventory/gpu/xid"
)

// The resolution of a PCIe finding that needs hands on the machine: reseat
// the GPU or its riser, check the slot (NVIDIA's word for it, as in the XID
// catalogue).
const checkMechanicals = "CHECK_MECHANICALS"

// pcieCounters are the evidence counters of a PCIe reading.
func pcieCounters(pc *PCIe) map[string]uint64 {
	return map[string]uint64{"pcieReplays": pc.Replays, "pcieLinkGeneration": uint64(pc.LinkGeneration),
		"pcieMaxLinkGeneration": uint64(pc.MaxLinkGeneration), "pcieLinkWidth": uint64(pc.LinkWidth),
		"pcieMaxLinkWidth": uint64(pc.MaxLinkWidth)}
}

// pcieLinkFindings judges the link's width (and generation, when th says
// so) against its maximum: each one below is a degraded finding calling for
// CHECK_MECHANICALS, read anew at every Collect.
func pcieLinkFindings(pc *PCIe, th Thresholds) []finding {
	if pc == nil {
		return nil
	}
	var fs []finding
	link := func(what string, cur, most int) {
		c := *pc
		fs = append(fs, finding{health: HealthDegraded, resolution: checkMechanicals,
			reason: fmt.Sprintf("PCIe link %s %d below its maximum %d", what, cur, most),
			key:    fmt.Sprintf("%s/%s/%d", EventKindPCIe, what, cur),
			signal: &Event{Kind: EventKindPCIe, PCIeLink: &c, Counters: pcieCounters(pc)}})
	}
	if pc.LinkWidth > 0 && pc.LinkWidth < pc.MaxLinkWidth {
		link("width", pc.LinkWidth, pc.MaxLinkWidth)
	}
	if th.PCIeCheckGeneration && pc.LinkGeneration > 0 && pc.LinkGeneration < pc.MaxLinkGeneration {
		link("generation", pc.LinkGeneration, pc.MaxLinkGeneration)
	}
	return fs
}

// pcieFindings adds the replay counter to its window and judges its rise,
// and returns the AER errors still held (dropping those older than the
// hold). A replay rise is a scan finding; an AER error was sent when its
// line was read, so its finding has no signal to send again.
func (st *gpuState) pcieFindings(pc *PCIe, p assessParams) []finding {
	var fs []finding
	if pc == nil {
		st.pcieReplay = nil
	} else if d := windowDelta(&st.pcieReplay, pc.Replays, p.now, p.th.PCIeReplayWindow); d >= p.th.PCIeReplayThreshold {
		c := *pc
		fs = append(fs, finding{health: HealthDegraded, resolution: checkMechanicals,
			reason: fmt.Sprintf("PCIe replays rose by %d within %v", d, p.th.PCIeReplayWindow),
			key:    EventKindPCIe + "/replays",
			signal: &Event{Kind: EventKindPCIe, PCIeReplays: d, PCIeWindow: p.th.PCIeReplayWindow, PCIeLink: &c,
				Counters: pcieCounters(pc)}})
	}
	for _, sev := range slices.Sorted(maps.Keys(st.aer)) {
		a := st.aer[sev]
		if p.now.Sub(a.at) > p.th.LogFindingHold {
			delete(st.aer, sev)
			continue
		}
		h, r := aerHealth(sev)
		if h == HealthOK {
			continue
		}
		fs = append(fs, finding{health: h, resolution: r, reason: "PCIe AER error: " + sev, at: a.at})
	}
	return fs
}

// aerHealth is the health and resolution an AER error of severity sev
// implies while it holds: a fatal one took the link down (the machine must
// be restarted to bring it back), a non-fatal uncorrected one lost data on
// a link that needs checking, a corrected one is recorded only.
func aerHealth(sev string) (Health, string) {
	switch sev {
	case kmsg.AERFatal:
		return HealthFailed, xid.RestartBM
	case kmsg.AERNonFatal:
		return HealthDegraded, checkMechanicals
	default:
		return HealthOK, xid.Ignore
	}
}

// noteAER records an AER error of the GPU uuid logged at at and returns its
// Event and whether to pass it on: only the first line of an episode (no
// line of that severity within Thresholds.LogFindingHold before it), and
// not a line older than the hold (the look-back's history).
func (c *Collector) noteAER(uuid, label string, a kmsg.AER, line string, at time.Time) (Event, bool) {
	h, r := aerHealth(a.Severity)
	ev := Event{Kind: EventKindPCIe, GPUUUID: uuid, AERSeverity: a.Severity, Resolution: r, Immediate: r, Health: h,
		Severity: severityOf(h), Source: SourceKernelLog, LogLine: line, Time: at,
		Message: fmt.Sprintf("PCIe AER %s error on %s (%s)", a.Severity, label, a.Type)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.now().Sub(at) > c.th.LogFindingHold {
		return ev, false
	}
	st := c.stateLocked(uuid)
	if st.aer == nil {
		st.aer = map[string]heldAER{}
	}
	prev, held := st.aer[a.Severity]
	if held && at.Sub(prev.at) <= c.th.LogFindingHold {
		prev.at, prev.line = maxTime(prev.at, at), line
		st.aer[a.Severity] = prev
		return ev, false
	}
	st.aer[a.Severity] = heldAER{at: at, line: line}
	return ev, true
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
