package inventory_test

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/better-compute/better-compute/bcd/inventory"
	"github.com/better-compute/better-compute/bcd/inventory/gpu"
	"github.com/better-compute/better-compute/bcd/inventory/gpu/gputest"
	"github.com/better-compute/better-compute/bcd/inventory/ib"
)

// BenchmarkScanDGXA100InfiniBand is one bcd scan (Scanner.Scan) of a DGX
// A100: go-nvml's mock 8 GPUs with every reading wired (as
// gpu.BenchmarkScanDGXA100), the host's files from an empty fixture, and,
// in "gpus+ib", 8 InfiniBand ports (mlx5_0..7, one port each, a sysfs
// fixture on the real file system: 4 state files and 5 counters per port
// and one uevent per device, as bcd reads /sys) judged by an ib.Monitor;
// "gpus" is the scan before issue 43's InfiniBand reader. CPU time (user
// plus system) per scan is reported beside the wall time.
//
//	go test -run '^$' -bench BenchmarkScanDGXA100InfiniBand -benchtime 2000x ./bcd/inventory
func BenchmarkScanDGXA100InfiniBand(b *testing.B) {
	sysfs := b.TempDir()
	for i := range 8 {
		dev := filepath.Join(sysfs, "class/infiniband", fmt.Sprintf("mlx5_%d", i))
		files := map[string]string{"device/uevent": fmt.Sprintf("DRIVER=mlx5_core\nPCI_SLOT_NAME=0000:%02x:00.0\n", 0x0c+i*0x10),
			"ports/1/state": "4: ACTIVE\n", "ports/1/phys_state": "5: LinkUp\n", "ports/1/rate": "200 Gb/sec (4X HDR)\n",
			"ports/1/link_layer": "InfiniBand\n"}
		for _, c := range []string{"link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors", "excessive_buffer_overrun_errors"} {
			files["ports/1/counters/"+c] = "0\n"
		}
		for name, content := range files {
			p := filepath.Join(dev, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name  string
		ports int
	}{{"gpus", 0}, {"gpus+ib", 8}} {
		b.Run(tc.name, func(b *testing.B) {
			s := gputest.NewDGXA100()
			for _, d := range s.Devices {
				gputest.WireReadings(d.(*dgxa100.Device))
			}
			c, err := gpu.New(gpu.Config{NVML: s, Runner: gputest.NewFabricManager()}) // systemctl answered by the fake, as in BenchmarkScanDGXA100
			if err != nil {
				b.Fatal(err)
			}
			cfg := inventory.Config{Root: os.DirFS(b.TempDir()), GPU: c,
				InterfaceAddrs: func() (map[string][]string, error) { return nil, nil }}
			if tc.ports > 0 {
				cfg.IB = ib.New(ib.Config{SysFS: os.DirFS(sysfs)})
			}
			sc := inventory.NewScanner(cfg)
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
				h, err := sc.Scan(b.Context())
				if err != nil || len(h.GPUs) != 8 || len(h.IBPorts) != tc.ports {
					b.Fatalf("Scan = %d GPUs, %d ports, %v", len(h.GPUs), len(h.IBPorts), err)
				}
			}
			b.ReportMetric(float64(cpu()-start)/float64(b.N), "cpu-ns/op")
		})
	}
}
