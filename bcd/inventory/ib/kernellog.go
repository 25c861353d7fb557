package ib

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/kmsg"
)

// KernelRecord reads one raw /dev/kmsg record (as gpu.KernelLog passes
// them) and returns the finding to send when it is an mlx5_core error
// (kmsg.ParseMlx5) that starts an episode: no line of that severity for
// that device within Thresholds.LogHold before it, and the line itself not
// older than the hold (the look-back's history). The finding holds in the
// health of the device's ports until LogHold after the episode's last
// line. The device is the one whose PCI address the line names, from the
// last Collect; a line of an address no device has is sent with Device "".
func (m *Monitor) KernelRecord(record string) (Finding, bool) {
	r, err := kmsg.ParseRecord(record)
	if err != nil {
		return Finding{}, false
	}
	x, ok := kmsg.ParseMlx5(r.Message)
	if !ok {
		return Finding{}, false
	}
	at := m.boot().Add(r.SinceBoot)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.now().Sub(at) > m.th.LogHold {
		return Finding{}, false
	}
	dev := m.byPCI[x.Address]
	h, r2 := mlx5Health(x.Severity)
	f := Finding{Device: dev, PCIBusID: x.Address, Cause: CauseMlx5, Health: h, Resolution: r2, Source: SourceKmsg,
		LogLine: r.Message, Time: at}
	name := dev
	if name == "" {
		name = "PCI " + x.Address
	}
	f.Message = fmt.Sprintf("mlx5_core %s error on %s: %s", x.Severity, name, x.Text)
	key := cmp.Or(dev, x.Address) + "/" + x.Severity
	if prev, held := m.mlx5[key]; held && at.Sub(prev.at) <= m.th.LogHold {
		if at.After(prev.at) {
			prev.at, prev.line = at, r.Message
		}
		m.mlx5[key] = prev
		return f, false
	}
	m.mlx5[key] = heldLine{at: at, line: r.Message, sev: x.Severity, dev: dev, addr: x.Address}
	return f, true
}

// mlx5Health is the health and resolution of an mlx5 error of severity
// sev: a fatal one stopped the adapter; either needs a person (firmware,
// a reset of the adapter, or its replacement).
func mlx5Health(sev string) (Health, string) {
	if sev == kmsg.Mlx5Fatal {
		return HealthFailed, ResolutionEscalate
	}
	return HealthDegraded, ResolutionEscalate
}

// mlx5Health adds the held mlx5 findings of p's device to p's health.
func (m *Monitor) mlx5Health(p *Port) {
	for _, k := range slices.Sorted(maps.Keys(m.mlx5)) {
		h := m.mlx5[k]
		if h.dev != p.Device && (h.dev != "" || h.addr != p.PCIBusID || p.PCIBusID == "") {
			continue
		}
		hl, r := mlx5Health(h.sev)
		p.add(Finding{Cause: CauseMlx5, Health: hl, Resolution: r})
	}
}
