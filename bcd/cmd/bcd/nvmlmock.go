//go:build nvmlmock

// The nvmlmock build of bcd (go build -tags nvmlmock ./bcd/cmd/bcd), for
// end-to-end tests on machines without NVIDIA GPUs (docs/gpu-health.md,
// "Test hook"): bcd node reads go-nvml's mock DGX A100 (package gputest)
// instead of libnvidia-ml, a fresh one each start, with no XID and every
// counter reading zero, and reads no kernel log. On SIGUSR1 it reads
// <data-dir>/nvmlmock-xids, removes the file and acts on each line:
//
//	<gpu index> <xid>                     NVML's XID event for that GPU
//	<gpu index> ecc-event                 NVML's double-bit ECC event
//	<gpu index> ecc-corrected <n>         the volatile corrected ECC count
//	<gpu index> ecc-uncorrected <n>       the volatile uncorrected ECC count
//	<gpu index> row-remap-failure         a failed row remapping (9 rows)
//	<gpu index> row-remap-pending         a remapping waiting for a reset
//	<gpu index> recovery <n>              the driver's recovery action (nvmlDeviceGpuRecoveryAction_t)
//	<gpu index> clocks <mask>             the clock event reasons
//	<gpu index> nvlink <n>                the NVLink replay error total
//	<gpu index> retired-pages-pending     pages waiting to be retired
//	<gpu index> lost                      queries answer ERROR_GPU_IS_LOST
//
// Readings take effect at bcd's next scan (--inventory-interval, or an
// XID's). Production builds (no tag) do not contain this file.

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/inventory/gpu"
	"github.com/better-compute/better-compute/bcd/inventory/gpu/gputest"
)

// mockXIDFile is the file in the data directory SIGUSR1 reads XIDs from.
const mockXIDFile = "nvmlmock-xids"

func init() { testGPUs = mockGPUs }

// mockGPUs returns a collector on a fresh mock DGX A100 whose XIDs come from
// dataDir's mockXIDFile on SIGUSR1, and a kernel log with nothing in it.
func mockGPUs(ctx context.Context, log *slog.Logger, dataDir string) (*gpu.Collector, gpu.KernelLog, error) {
	nv := gputest.NewDGXA100()
	set := gputest.NewEventSet()
	registered := gputest.WireEvents(nv, set)
	readings := make([]*gputest.Readings, len(nv.Devices))
	for i, d := range nv.Devices {
		readings[i] = gputest.WireReadings(d.(*dgxa100.Device))
	}
	c, err := gpu.New(gpu.Config{NVML: nv, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	path := filepath.Join(dataDir, mockXIDFile)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	go func() {
		defer signal.Stop(sig)
		for {
			select {
			case <-ctx.Done():
				return
			case <-registered: // each (re)start of the event watch registers every GPU
			case <-sig:
				if err := raiseXIDs(ctx, log, path, nv.Devices, readings, set); err != nil {
					log.WarnContext(ctx, "Mock XIDs not raised", logkey.Err, err)
				}
			}
		}
	}()
	log.InfoContext(ctx, "NVML is go-nvml's mock DGX A100 (test build nvmlmock); SIGUSR1 raises the XIDs of "+path,
		"gpus", len(nv.Devices))
	return c, emptyKernelLog{}, nil
}

// raiseXIDs reads path's lines (see the file's comment), removes it, and
// sends each XID or ECC event as NVML's event or sets the reading.
func raiseXIDs(ctx context.Context, log *slog.Logger, path string, devices []nvml.Device, readings []*gputest.Readings,
	set *gputest.EventSet) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		var idx, code int
		if len(f) >= 2 {
			idx, err = strconv.Atoi(f[0])
		}
		if len(f) < 2 || err != nil {
			return fmt.Errorf("%s:%d: want \"<gpu index> <xid>\" or \"<gpu index> <reading> [value]\", got %q", path, line, sc.Text())
		}
		if idx < 0 || idx >= len(devices) {
			return fmt.Errorf("%s:%d: no GPU %d (the mock has %d)", path, line, idx, len(devices))
		}
		if code, err = strconv.Atoi(f[1]); err != nil {
			if err := setReading(ctx, devices[idx], readings[idx], set, f[1:]); err != nil {
				return fmt.Errorf("%s:%d: %w", path, line, err)
			}
			log.InfoContext(ctx, "Mock reading set", "gpu_index", idx, "reading", strings.Join(f[1:], " "))
			continue
		}
		if len(f) != 2 || code <= 0 {
			return fmt.Errorf("%s:%d: want \"<gpu index> <xid>\", got %q", path, line, sc.Text())
		}
		select {
		case set.C <- gputest.XID(devices[idx], uint64(code)):
		case <-ctx.Done():
			return ctx.Err()
		}
		log.InfoContext(ctx, "Mock XID raised", "gpu_index", idx, "xid", code)
	}
	return sc.Err()
}

// setReading acts on one reading line's words after the GPU index.
func setReading(ctx context.Context, dev nvml.Device, r *gputest.Readings, set *gputest.EventSet, w []string) error {
	var n uint64
	if len(w) == 2 {
		var err error
		if n, err = strconv.ParseUint(w[1], 0, 64); err != nil {
			return fmt.Errorf("reading %s: bad value %q", w[0], w[1])
		}
	}
	valued := map[string]bool{"ecc-corrected": true, "ecc-uncorrected": true, "recovery": true, "clocks": true, "nvlink": true}
	if valued[w[0]] != (len(w) == 2) || len(w) > 2 {
		return fmt.Errorf("reading %q: wrong number of values", strings.Join(w, " "))
	}
	switch w[0] {
	case "ecc-event":
		select {
		case set.C <- gputest.ECCEvent(dev):
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	case "ecc-corrected":
		r.Set(func(v *gputest.ReadingValues) { v.ECCCorrected = n })
	case "ecc-uncorrected":
		r.Set(func(v *gputest.ReadingValues) { v.ECCUncorrected = n })
	case "row-remap-failure":
		r.Set(func(v *gputest.ReadingValues) { v.RemapFailure, v.RemapUncorrectedRows = true, 9 })
	case "row-remap-pending":
		r.Set(func(v *gputest.ReadingValues) { v.RemapPending = true })
	case "recovery":
		r.Set(func(v *gputest.ReadingValues) { v.RecoveryAction = n })
	case "clocks":
		r.Set(func(v *gputest.ReadingValues) { v.ClocksEventReasons = n })
	case "nvlink":
		r.Set(func(v *gputest.ReadingValues) { v.NVLinkReplay = n })
	case "retired-pages-pending":
		r.Set(func(v *gputest.ReadingValues) { v.RetiredPagesPending = true })
	case "lost":
		r.Set(func(v *gputest.ReadingValues) { v.Lost = true })
	default:
		return fmt.Errorf("unknown reading %q", w[0])
	}
	return nil
}

// emptyKernelLog is a kernel log without records: the host's own is not
// the mock GPUs'.
type emptyKernelLog struct{}

func (emptyKernelLog) FollowKernelLog(ctx context.Context, _ func(string)) error {
	<-ctx.Done()
	return nil
}
