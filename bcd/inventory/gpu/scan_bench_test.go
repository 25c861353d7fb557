package gpu_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/better-compute/better-compute/bcd/inventory/gpu"
	"github.com/better-compute/better-compute/bcd/inventory/gpu/gputest"
)

// BenchmarkScanDGXA100 is one bcd scan (Collect) of the mock DGX A100's 8
// GPUs with every reading wired (gputest.WireReadings: ECC, row remapping,
// clocks, NVLink and recovery fields, retired pages and, since issue 43, the
// PCIe replay counter and link), reporting the CPU time (user plus system)
// per scan beside the wall time. The mock answers at once: this is bcd's
// own cost per scan, not the driver's.
//
//	go test -run '^$' -bench BenchmarkScanDGXA100 -benchtime 2000x ./bcd/inventory/gpu
func BenchmarkScanDGXA100(b *testing.B) {
	s := gputest.NewDGXA100()
	for _, d := range s.Devices {
		gputest.WireReadings(d.(*dgxa100.Device))
	}
	c, err := gpu.New(gpu.Config{NVML: s, Runner: gputest.NewFabricManager()})
	if err != nil {
		b.Fatal(err)
	}
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	b.ReportAllocs()
	start := cpu()
	for b.Loop() {
		rep, err := c.Collect(b.Context())
		if err != nil || len(rep.GPUs) != 8 {
			b.Fatalf("Collect = %d GPUs, %v", len(rep.GPUs), err)
		}
	}
	b.ReportMetric(float64(cpu()-start)/float64(b.N), "cpu-ns/op")
}
