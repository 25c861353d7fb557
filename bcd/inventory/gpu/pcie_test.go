package gpu_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/better-compute/better-compute/bcd/inventory/gpu"
)

// pcieLink answers a device's PCIe queries from settable values.
type pcieLink struct {
	mu                        sync.Mutex
	replays, gen, width, maxW int
}

func (p *pcieLink) get(v *int) func() (int, nvml.Return) {
	return func() (int, nvml.Return) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return *v, nvml.SUCCESS
	}
}

func (p *pcieLink) update(fn func(*pcieLink)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fn(p)
}

// TestPCIeReplaysAndLinkWidth: NVML's PCIe replay counter rising past the
// threshold within the window, and a link narrower than its maximum, are
// degraded findings calling for CHECK_MECHANICALS, each reported once while
// it holds; they end when the window passes and the link is back at full
// width. A link below its maximum generation is judged only when the
// thresholds say so.
func TestPCIeReplaysAndLinkWidth(t *testing.T) {
	t.Parallel()
	s := newDGXA100()
	link := &pcieLink{gen: 4, width: 16, maxW: 16}
	maxGen := 4
	d := device(s, 2)
	d.GetPcieReplayCounterFunc = link.get(&link.replays)
	d.GetCurrPcieLinkGenerationFunc = link.get(&link.gen)
	d.GetMaxPcieLinkGenerationFunc = link.get(&maxGen)
	d.GetCurrPcieLinkWidthFunc = link.get(&link.width)
	d.GetMaxPcieLinkWidthFunc = link.get(&link.maxW)
	clock := &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	c := newCollector(t, gpu.Config{NVML: s, Now: clock.Now,
		Thresholds: gpu.Thresholds{PCIeReplayThreshold: 50, PCIeReplayWindow: 5 * time.Minute}})
	gpu2 := func() gpu.GPU { return collect(t, c).GPUs[2] }

	link.update(func(p *pcieLink) { p.replays = 10000 }) // old replays: a baseline, not a rise
	if g := gpu2(); g.Health != gpu.HealthOK || g.PCIe == nil || g.PCIe.Replays != 10000 || g.PCIe.MaxLinkWidth != 16 || len(g.NewFindings) != 0 {
		t.Fatalf("quiet link: %+v %+v", g, g.PCIe)
	}
	clock.Advance(time.Minute)
	link.update(func(p *pcieLink) { p.replays = 10060 })
	g := gpu2()
	if g.Health != gpu.HealthDegraded || g.Resolution != "CHECK_MECHANICALS" || len(g.NewFindings) != 1 {
		t.Fatalf("replays rising: %s %q %s %+v", g.Health, g.HealthReasons, g.Resolution, g.NewFindings)
	}
	if ev := g.NewFindings[0]; ev.Kind != gpu.EventKindPCIe || ev.PCIeReplays != 60 || ev.PCIeWindow != 5*time.Minute ||
		ev.Counters["pcieReplays"] != 10060 || ev.Source != gpu.SourceScan || ev.GPUUUID != stableUUID(2) {
		t.Errorf("replay finding = %+v", ev)
	}
	clock.Advance(time.Minute)
	if g := gpu2(); g.Health != gpu.HealthDegraded || len(g.NewFindings) != 0 {
		t.Errorf("still within the window: %s, new findings %+v (want none: reported once)", g.Health, g.NewFindings)
	}
	clock.Advance(6 * time.Minute) // the window moves past the rise
	if g := gpu2(); g.Health != gpu.HealthOK || g.Resolution != "" {
		t.Errorf("after the window: %s %q %s", g.Health, g.HealthReasons, g.Resolution)
	}

	link.update(func(p *pcieLink) { p.width, p.gen = 8, 1 }) // retrained to x8, and idle at gen 1
	g = gpu2()
	if g.Health != gpu.HealthDegraded || len(g.HealthReasons) != 1 || g.HealthReasons[0] != "PCIe link width 8 below its maximum 16" ||
		len(g.NewFindings) != 1 || g.NewFindings[0].PCIeLink == nil || g.NewFindings[0].PCIeLink.LinkWidth != 8 {
		t.Errorf("x8 link: %s %q %+v", g.Health, g.HealthReasons, g.NewFindings)
	}
	c.SetThresholds(gpu.Thresholds{PCIeCheckGeneration: true})
	if g := gpu2(); len(g.HealthReasons) != 2 || g.HealthReasons[1] != "PCIe link generation 1 below its maximum 4" {
		t.Errorf("generation judged: %q", g.HealthReasons)
	}
	link.update(func(p *pcieLink) { p.width, p.gen = 16, 4 })
	if g := gpu2(); g.Health != gpu.HealthOK {
		t.Errorf("link back at x16 gen 4: %s %q", g.Health, g.HealthReasons)
	}
	if g := collect(t, c).GPUs[3]; g.PCIe != nil {
		t.Errorf("GPU 3 reports no PCIe readings, got %+v", g.PCIe)
	}
}

// TestPCIeAERInKernelLog: an AER error the kernel logged for a GPU's
// address (the kernel's own format) is one Event per episode: the first
// line is passed on, lines within the hold are the same episode, and the
// GPU's health holds until the hold has passed since the last line. A
// fatal error fails the GPU with RESTART_BM; a corrected one is an
// IGNORE event only; an AER line of another device (a root port) and one
// older than the hold (the look-back's history) are not the GPU's.
func TestPCIeAERInKernelLog(t *testing.T) {
	t.Parallel()
	s := newDGXA100()
	boot := time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)
	clock := &fakeClock{t: boot.Add(time.Hour)}
	c := newCollector(t, gpu.Config{NVML: s, Now: clock.Now, BootTime: func() time.Time { return boot },
		Thresholds: gpu.Thresholds{LogFindingHold: 2 * time.Minute}})
	rep := collect(t, c)
	_, bus, _ := strings.Cut(rep.GPUs[5].PCIBusID, ":")
	addr := "0000:" + strings.ToLower(bus) // "0000:XX:00.0", as the kernel writes it
	at := func(before time.Duration) int64 { return int64((time.Hour - before) / time.Microsecond) }
	log := fakeLog{records: []string{
		fmt.Sprintf("3,20,%d,-;nvidia %s: AER: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)", at(time.Hour-time.Second), addr),
		fmt.Sprintf("3,21,%d,-;pcieport 0000:00:01.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)", at(30*time.Second)),
		fmt.Sprintf("3,22,%d,-;nvidia %s: AER: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)", at(30*time.Second), addr),
		fmt.Sprintf("3,23,%d,-;nvidia %s: AER: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)", at(20*time.Second), addr),
		fmt.Sprintf("4,24,%d,-;nvidia %s: AER: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)", at(10*time.Second), addr),
	}}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	got := make(chan gpu.Event, 8)
	go func() { _ = c.WatchKernelLog(ctx, log, func(ev gpu.Event) { got <- ev }) }()
	next := func() gpu.Event {
		t.Helper()
		select {
		case ev := <-got:
			return ev
		case <-time.After(10 * time.Second):
			t.Fatal("no event within 10 s")
			return gpu.Event{}
		}
	}
	ev := next()
	if ev.Kind != gpu.EventKindPCIe || ev.AERSeverity != "fatal" || ev.GPUUUID != stableUUID(5) || ev.Resolution != "RESTART_BM" ||
		ev.Health != gpu.HealthFailed || ev.Source != gpu.SourceKernelLog || !strings.Contains(ev.LogLine, "severity=Uncorrected (Fatal)") ||
		!ev.Time.Equal(boot.Add(time.Hour-30*time.Second)) {
		t.Errorf("fatal AER event = %+v", ev)
	}
	if ev := next(); ev.AERSeverity != "corrected" || ev.Resolution != "IGNORE" || ev.Health != gpu.HealthOK {
		t.Errorf("corrected AER event = %+v (want the second fatal line to be the same episode)", ev)
	}
	select {
	case ev := <-got:
		t.Errorf("unexpected event %+v", ev)
	case <-time.After(100 * time.Millisecond):
	}
	if g := collect(t, c).GPUs[5]; g.Health != gpu.HealthFailed || g.Resolution != "RESTART_BM" || len(g.NewFindings) != 0 {
		t.Errorf("GPU 5 with a fatal AER error held: %s %q %s", g.Health, g.HealthReasons, g.Resolution)
	}
	clock.Advance(90 * time.Second) // 110 s after the last fatal line: still held
	if g := collect(t, c).GPUs[5]; g.Health != gpu.HealthFailed {
		t.Errorf("within the hold: %s", g.Health)
	}
	clock.Advance(20 * time.Second)
	if g := collect(t, c).GPUs[5]; g.Health != gpu.HealthOK || g.Resolution != "" {
		t.Errorf("after the hold: %s %q %s", g.Health, g.HealthReasons, g.Resolution)
	}
}
