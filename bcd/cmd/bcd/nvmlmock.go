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
//	<gpu index> pcie-replay <n>           the PCIe replay counter
//	<gpu index> pcie-width <n>            the PCIe link's width (0: its maximum, 16)
//	<gpu index> fabric <n>                NVML's GPU fabric state (1 not started, 2 in
//	                                      progress, 3 completed)
//	<gpu index> remove                    the GPU falls off the bus: NVML no longer
//	                                      enumerates it (the count drops by one)
//	<gpu index> restore                   NVML enumerates it again
//	<gpu index> aer <severity>            appends the kernel's AER line for the GPU's
//	                                      address (severity corrected, non-fatal or
//	                                      fatal) to the mock's kernel log
//	<gpu index> persistence on|off        the GPU's persistence mode (on by default)
//	fabric-manager <state>                what `systemctl show nvidia-fabricmanager`
//	                                      answers: running (the default), failed,
//	                                      not-found, or restart <n> (running after n
//	                                      more automatic restarts)
//
// Readings take effect at bcd's next scan (--inventory-interval, or an
// XID's). The mock's kernel log is <data-dir>/nvmlmock-kmsg, emptied at
// start and read like /dev/kmsg (records stamped with CLOCK_MONOTONIC).
// Production builds (no tag) do not contain this file.

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
	"sync"
	"syscall"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"golang.org/x/sys/unix"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/inventory/gpu"
	"github.com/better-compute/better-compute/bcd/inventory/gpu/gputest"
)

// mockXIDFile is the file in the data directory SIGUSR1 reads XIDs from.
const mockXIDFile = "nvmlmock-xids"

// mockKmsgFile is the mock's kernel log in the data directory.
const mockKmsgFile = "nvmlmock-kmsg"

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
	bus := enumerate(nv)
	fm := gputest.NewFabricManager()
	c, err := gpu.New(gpu.Config{NVML: nv, Logger: log, Runner: fm})
	if err != nil {
		return nil, nil, err
	}
	kmsgPath := filepath.Join(dataDir, mockKmsgFile)
	if err := os.WriteFile(kmsgPath, nil, 0o600); err != nil {
		return nil, nil, err
	}
	klog := &mockKernelLog{path: kmsgPath}
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
				if err := raiseXIDs(ctx, log, path, nv.Devices, readings, set, klog, bus, fm); err != nil {
					log.WarnContext(ctx, "Mock XIDs not raised", logkey.Err, err)
				}
			}
		}
	}()
	log.InfoContext(ctx, "NVML is go-nvml's mock DGX A100 (test build nvmlmock); SIGUSR1 raises the XIDs of "+path,
		"gpus", len(nv.Devices))
	return c, gpu.DeviceLog{Path: kmsgPath}, nil
}

// raiseXIDs reads path's lines (see the file's comment), removes it, and
// sends each XID or ECC event as NVML's event or sets the reading.
func raiseXIDs(ctx context.Context, log *slog.Logger, path string, devices []nvml.Device, readings []*gputest.Readings,
	set *gputest.EventSet, klog *mockKernelLog, bus *mockBus, fm *gputest.FabricManager) error {
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
		if f[0] == "fabric-manager" {
			if err := setFabricManager(fm, f[1:]); err != nil {
				return fmt.Errorf("%s:%d: %w", path, line, err)
			}
			log.InfoContext(ctx, "Mock reading set", "reading", strings.Join(f, " "))
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
			if f[1] == "remove" || f[1] == "restore" {
				bus.set(idx, f[1] == "restore")
			} else if err := setReading(ctx, devices[idx], readings[idx], set, klog, f[1:]); err != nil {
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
func setReading(ctx context.Context, dev nvml.Device, r *gputest.Readings, set *gputest.EventSet, klog *mockKernelLog,
	w []string) error {
	if w[0] == "aer" {
		if len(w) != 2 {
			return fmt.Errorf("reading %q: want \"aer corrected|non-fatal|fatal\"", strings.Join(w, " "))
		}
		return klog.aer(dev, w[1])
	}
	if w[0] == "persistence" {
		if len(w) != 2 || w[1] != "on" && w[1] != "off" {
			return fmt.Errorf("reading %q: want \"persistence on|off\"", strings.Join(w, " "))
		}
		r.Set(func(v *gputest.ReadingValues) { v.PersistenceOff = w[1] == "off" })
		return nil
	}
	var n uint64
	if len(w) == 2 {
		var err error
		if n, err = strconv.ParseUint(w[1], 0, 64); err != nil {
			return fmt.Errorf("reading %s: bad value %q", w[0], w[1])
		}
	}
	valued := map[string]bool{"ecc-corrected": true, "ecc-uncorrected": true, "recovery": true, "clocks": true, "nvlink": true,
		"pcie-replay": true, "pcie-width": true, "fabric": true}
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
	case "pcie-replay":
		r.Set(func(v *gputest.ReadingValues) { v.PCIeReplays = n })
	case "fabric":
		r.Set(func(v *gputest.ReadingValues) { v.FabricState = uint8(min(n, 3)) })
	case "pcie-width":
		r.Set(func(v *gputest.ReadingValues) { v.PCIeWidth = int(min(n, 64)) })
	default:
		return fmt.Errorf("unknown reading %q", w[0])
	}
	return nil
}

// setFabricManager sets what the mock's systemctl answers for
// nvidia-fabricmanager: w is "running", "failed", "not-found" or
// "restart N".
func setFabricManager(fm *gputest.FabricManager, w []string) error {
	outs := map[string]string{"running": gputest.FabricManagerRunning, "failed": gputest.FabricManagerFailed,
		"not-found": gputest.FabricManagerNotFound}
	if len(w) == 1 && outs[w[0]] != "" {
		fm.Set(outs[w[0]])
		return nil
	}
	if len(w) == 2 && w[0] == "restart" {
		n, err := strconv.Atoi(w[1])
		if err != nil || n < 1 || n > 1000 {
			return fmt.Errorf("fabric-manager restart: bad count %q: want 1 to 1000", w[1])
		}
		fm.Restart(n)
		return nil
	}
	return fmt.Errorf("fabric-manager %q: want running, failed, not-found or restart N", strings.Join(w, " "))
}

// mockBus is which of the mock's GPUs NVML enumerates: a removed one has
// fallen off the bus (it is skipped by count and index, and its UUID is not
// found).
type mockBus struct {
	mu      sync.Mutex
	devices []nvml.Device
	removed map[int]bool
}

// enumerate makes nv enumerate its devices through a mockBus.
func enumerate(nv *dgxa100.Server) *mockBus {
	b := &mockBus{devices: nv.Devices, removed: map[int]bool{}}
	nv.DeviceGetCountFunc = func() (int, nvml.Return) { return len(b.present()), nvml.SUCCESS }
	nv.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		p := b.present()
		if i < 0 || i >= len(p) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		return p[i], nvml.SUCCESS
	}
	nv.DeviceGetHandleByUUIDFunc = func(uuid string) (nvml.Device, nvml.Return) {
		for _, d := range b.present() {
			if u, _ := d.GetUUID(); u == uuid {
				return d, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	return b
}

func (b *mockBus) set(i int, present bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.removed[i] = !present
}

func (b *mockBus) present() []nvml.Device {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []nvml.Device
	for i, d := range b.devices {
		if !b.removed[i] {
			out = append(out, d)
		}
	}
	return out
}

// mockKernelLog appends records to the mock's kernel log file: the host's
// own log is not the mock GPUs'.
type mockKernelLog struct {
	mu   sync.Mutex
	path string
	seq  uint64
}

// aer appends the kernel's AER line of severity sev for dev's PCI address,
// stamped with the time since boot as the kernel would.
func (k *mockKernelLog) aer(dev nvml.Device, sev string) error {
	words := map[string]string{"corrected": "Corrected", "non-fatal": "Uncorrected (Non-Fatal)", "fatal": "Uncorrected (Fatal)"}
	word, ok := words[sev]
	if !ok {
		return fmt.Errorf("aer: severity %q: want corrected, non-fatal or fatal", sev)
	}
	p, ret := dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("aer: pci info: %v", ret)
	}
	bus := strings.ToLower(strings.TrimPrefix(cString(p.BusId[:]), "0000")) // "0000:07:00.0"
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.seq++
	rec := fmt.Sprintf("3,%d,%d,-;nvidia %s: AER: PCIe Bus Error: severity=%s, type=Transaction Layer, (Requester ID)\n",
		k.seq, ts.Nano()/1000, bus, word)
	f, err := os.OpenFile(k.path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(rec)
	return errors.Join(err, f.Close())
}

func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}
