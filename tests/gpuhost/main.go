// Command gpuhost runs bcd's GPU inventory and each of its health readers
// once on this machine's real NVIDIA driver and prints what each saw (run
// by tests/gpu-host.sh; docs/gpu-health.md, "On a real GPU host"):
// NVML's inventory with every reading (ECC, row remapping, clocks, NVLink,
// recovery action, PCIe link and replays) and the health judged from it,
// the InfiniBand/RoCE ports under /sys/class/infiniband (package ib), then
// the kernel log's NVRM Xid and PCIe AER lines for these GPUs and the
// mlx5_core error lines of those ports (the look-back, for -kmsg-for).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/better-compute/better-compute/bcd/inventory/gpu"
	"github.com/better-compute/better-compute/bcd/inventory/ib"
)

func main() {
	kmsgFor := flag.Duration("kmsg-for", 2*time.Second, "how long to read the kernel log")
	flag.Parse()
	if err := run(*kmsgFor); err != nil {
		fmt.Fprintln(os.Stderr, "gpuhost:", err)
		os.Exit(1)
	}
}

func run(kmsgFor time.Duration) error {
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	c, err := gpu.New(gpu.Config{Logger: log})
	if err != nil {
		return err
	}
	start := time.Now()
	rep, err := c.Collect(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("== inventory (one scan, %v): %d GPUs, status %q\n", time.Since(start).Round(time.Microsecond), len(rep.GPUs), rep.Status)
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	for _, g := range rep.GPUs {
		if err := enc.Encode(g); err != nil {
			return err
		}
	}
	switch fm := rep.FabricManager; {
	case fm != nil:
		fmt.Printf("== %s: %s (%s), load %s, %d restarts\n", gpu.FabricManagerUnit, fm.ActiveState, fm.SubState, fm.LoadState, fm.Restarts)
	default:
		fmt.Printf("== %s: not read (no GPU on an NVLink fabric, or systemctl did not answer)\n", gpu.FabricManagerUnit)
	}
	for _, g := range rep.GPUs {
		fmt.Printf("== health GPU %d %s: %s %s %q\n", g.Index, g.UUID, g.Health, g.Resolution, g.HealthReasons)
		for _, f := range g.NewFindings {
			fmt.Printf("   finding %s: %s\n", f.Kind, f.Message)
		}
	}
	mon := ib.New(ib.Config{})
	start = time.Now()
	ports, err := mon.Collect(ctx)
	fmt.Printf("== InfiniBand/RoCE ports (one read of /sys/class/infiniband, %v): %d, err %v\n",
		time.Since(start).Round(time.Microsecond), len(ports), err)
	for _, p := range ports {
		fmt.Printf("   %s %s %s/%s %q %s counters %+v health %s %q\n", p.Key(), p.PCIBusID, p.State, p.PhysState, p.Rate,
			p.LinkLayer, p.Counters, p.Health, p.HealthReasons)
	}
	fmt.Printf("== kernel log (NVRM Xid and PCIe AER lines of these GPUs, mlx5_core errors, %v)\n", kmsgFor)
	kctx, cancel := context.WithTimeout(ctx, kmsgFor)
	defer cancel()
	n := 0
	src := teeLog{mon: mon, found: func(f ib.Finding) {
		n++
		fmt.Printf("   %s ib.port %s %s: %s\n", f.Time.Format(time.RFC3339), f.Device, f.Resolution, f.LogLine)
	}}
	err = c.WatchKernelLog(kctx, src, func(ev gpu.Event) {
		n++
		fmt.Printf("   %s %s %s: %s\n", ev.Time.Format(time.RFC3339), ev.Kind, ev.Resolution, ev.LogLine)
	})
	if err != nil {
		fmt.Printf("   not readable: %v\n", err)
	} else {
		fmt.Printf("   %d lines\n", n)
	}
	return nil
}

// teeLog reads /dev/kmsg and hands each record to the InfiniBand monitor
// before the GPU collector, as bcd's agent does.
type teeLog struct {
	mon   *ib.Monitor
	found func(ib.Finding)
}

func (l teeLog) FollowKernelLog(ctx context.Context, fn func(string)) error {
	return gpu.DeviceLog{}.FollowKernelLog(ctx, func(r string) {
		if f, ok := l.mon.KernelRecord(r); ok {
			l.found(f)
		}
		fn(r)
	})
}
