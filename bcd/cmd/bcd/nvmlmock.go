//go:build nvmlmock

// The nvmlmock build of bcd (go build -tags nvmlmock ./bcd/cmd/bcd), for
// end-to-end tests on machines without NVIDIA GPUs (docs/gpu-health.md,
// "Test hook"): bcd node reads go-nvml's mock DGX A100 (package gputest)
// instead of libnvidia-ml, a fresh one each start, with no XID, and reads no
// kernel log. On SIGUSR1 it reads <data-dir>/nvmlmock-xids, lines
// "<gpu index> <xid>", removes the file and delivers each XID as NVML's
// event for that GPU. Production builds (no tag) do not contain this file.

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
				if err := raiseXIDs(ctx, log, path, nv.Devices, set); err != nil {
					log.WarnContext(ctx, "Mock XIDs not raised", logkey.Err, err)
				}
			}
		}
	}()
	log.InfoContext(ctx, "NVML is go-nvml's mock DGX A100 (test build nvmlmock); SIGUSR1 raises the XIDs of "+path,
		"gpus", len(nv.Devices))
	return c, emptyKernelLog{}, nil
}

// raiseXIDs reads path's "<gpu index> <xid>" lines, removes it and sends
// each XID as NVML's event.
func raiseXIDs(ctx context.Context, log *slog.Logger, path string, devices []nvml.Device, set *gputest.EventSet) error {
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
		if len(f) == 2 {
			idx, err = strconv.Atoi(f[0])
			if err == nil {
				code, err = strconv.Atoi(f[1])
			}
		}
		if len(f) != 2 || err != nil || code <= 0 {
			return fmt.Errorf("%s:%d: want \"<gpu index> <xid>\", got %q", path, line, sc.Text())
		}
		if idx < 0 || idx >= len(devices) {
			return fmt.Errorf("%s:%d: no GPU %d (the mock has %d)", path, line, idx, len(devices))
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

// emptyKernelLog is a kernel log without records: the host's own is not
// the mock GPUs'.
type emptyKernelLog struct{}

func (emptyKernelLog) FollowKernelLog(ctx context.Context, _ func(string)) error {
	<-ctx.Done()
	return nil
}
