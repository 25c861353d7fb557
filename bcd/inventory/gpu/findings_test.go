package gpu_test

import (
	"testing"

	"github.com/better-compute/better-compute/bcd/inventory/gpu"
	"github.com/better-compute/better-compute/bcd/inventory/gpu/gputest"
)

// A finding of a reading is in GPU.NewFindings once, at the first Collect
// that sees it, and again only after it cleared; its Event names the GPU,
// the signal, the resolution and the readings.
func TestCollectNewFindingsOnce(t *testing.T) {
	t.Parallel()
	s := newDGXA100()
	readings := make([]*gputest.Readings, len(s.Devices))
	for i := range s.Devices {
		readings[i] = gputest.WireReadings(device(s, i))
	}
	c := newCollector(t, gpu.Config{NVML: s})
	news := func() map[int][]gpu.Event {
		out := map[int][]gpu.Event{}
		for _, g := range collect(t, c).GPUs {
			if len(g.NewFindings) > 0 {
				out[g.Index] = g.NewFindings
			}
		}
		return out
	}
	if n := news(); len(n) != 0 {
		t.Fatalf("quiet GPUs: new findings %+v", n)
	}
	readings[4].Set(func(v *gputest.ReadingValues) { v.RemapFailure, v.RemapUncorrectedRows = true, 9 })
	n := news()
	if len(n) != 1 || len(n[4]) != 1 {
		t.Fatalf("row remapping failure: new findings %+v, want one on GPU 4", n)
	}
	ev := n[4][0]
	if ev.Kind != gpu.EventKindRowRemap || ev.RemappedRows == nil || !ev.RemappedRows.Failure || ev.RemappedRows.Uncorrected != 9 ||
		ev.GPUUUID != gputest.UUID(4) || ev.Serial != gputest.Serial(gputest.UUID(4)) || ev.PCIBusID == "" ||
		ev.Resolution != "CONTACT_SUPPORT" || ev.Immediate != "CONTACT_SUPPORT" || ev.Health != gpu.HealthFailed ||
		ev.Severity != gpu.SeverityCritical || ev.Source != gpu.SourceScan || ev.Counters["remappedRowsUncorrectable"] != 9 ||
		ev.Time.IsZero() || ev.Message == "" {
		t.Errorf("row remapping failure event = %+v", ev)
	}
	if n := news(); len(n) != 0 {
		t.Errorf("the same failure again: new findings %+v, want none", n)
	}
	readings[4].Set(func(v *gputest.ReadingValues) { v.RemapFailure = false })
	readings[6].Set(func(v *gputest.ReadingValues) { v.ClocksEventReasons = 64 })
	n = news()
	if len(n) != 1 || len(n[6]) != 1 || n[6][0].Kind != gpu.EventKindClocks || n[6][0].ClocksEventReasons != 64 {
		t.Errorf("cleared failure, throttled clocks: new findings %+v, want the clocks of GPU 6 only", n)
	}
	readings[4].Set(func(v *gputest.ReadingValues) { v.RemapFailure = true })
	if n := news(); len(n) != 1 || len(n[4]) != 1 || n[4][0].Kind != gpu.EventKindRowRemap {
		t.Errorf("the failure back: new findings %+v, want it again", n)
	}
}
