package gpu_test

import (
	"testing"

	"github.com/better-compute/better-compute/bcd/inventory/gpu"
	"github.com/better-compute/better-compute/bcd/inventory/gpu/gputest"
)

// The built-in check passes a quiet DGX A100, fails the GPU whose driver asks
// for a recovery or that counted an uncorrectable ECC error, and a GPU the
// case names that NVML does not list; it takes no finding from Collect.
func TestCheck(t *testing.T) {
	t.Parallel()
	s := newDGXA100()
	readings := make([]*gputest.Readings, len(s.Devices))
	for i := range s.Devices {
		readings[i] = gputest.WireReadings(device(s, i))
	}
	c := newCollector(t, gpu.Config{NVML: s})
	r, err := c.Check(t.Context(), gputest.UUID(2))
	if err != nil || !r.Passed() || r.Tests != 3*len(s.Devices) || r.Tool != "nvml" {
		t.Fatalf("quiet: %+v, %v", r, err)
	}
	readings[2].Set(func(v *gputest.ReadingValues) { v.RecoveryAction = 1 }) // GPU_RESET
	readings[5].Set(func(v *gputest.ReadingValues) { v.ECCUncorrected = 2 })
	r, err = c.Check(t.Context(), "")
	if err != nil || len(r.Failures) != 2 {
		t.Fatalf("two faults: %+v, %v", r, err)
	}
	if f := r.Failures[0]; f.Test != gpu.CheckRecoveryAction || f.GPU != gputest.UUID(2) {
		t.Errorf("first failure %+v", f)
	}
	if f := r.Failures[1]; f.Test != gpu.CheckECC || f.GPU != gputest.UUID(5) {
		t.Errorf("second failure %+v", f)
	}
	// The check read the faults without taking them from the next scan.
	seen := 0
	for _, g := range collect(t, c).GPUs {
		seen += len(g.NewFindings)
	}
	if seen != 2 {
		t.Errorf("the scan after the check found %d new findings, want the 2", seen)
	}
	readings[2].Set(func(v *gputest.ReadingValues) { v.RecoveryAction = 0 })
	readings[5].Set(func(v *gputest.ReadingValues) { v.ECCUncorrected = 0 })
	if r, _ = c.Check(t.Context(), "GPU-not-here"); len(r.Failures) != 1 || r.Failures[0].Test != gpu.CheckEnumerate {
		t.Fatalf("unlisted GPU: %+v", r)
	}
}
