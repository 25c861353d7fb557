package gpu

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/kmsg"
)

// KernelLog is where WatchKernelLog reads the kernel log from: kmsg.Follow
// on /dev/kmsg when bcd may read it ([DeviceLog]), the root helper's
// "kmsg.xid" operation when bcd runs unprivileged (helper.Client).
type KernelLog interface {
	// FollowKernelLog passes raw /dev/kmsg records to fn, from the oldest
	// the kernel holds, then new ones until ctx ends (nil then). It may
	// pass only the NVRM Xid records.
	FollowKernelLog(ctx context.Context, fn func(record string)) error
}

// DeviceLog reads the kernel log device itself (needs root or CAP_SYSLOG).
type DeviceLog struct {
	// Path is the device. Defaults to kmsg.DefaultPath (/dev/kmsg).
	Path string
}

// FollowKernelLog implements KernelLog with kmsg.Follow.
func (d DeviceLog) FollowKernelLog(ctx context.Context, fn func(record string)) error {
	return kmsg.Follow(ctx, d.Path, fn)
}

// WatchKernelLog reads NVRM Xid lines from src until ctx ends (nil then):
// first every line the kernel still holds (the look-back, which sees XIDs
// raised before bcd started or where NVML's event API is not available),
// then new ones. Each line's PCI address is mapped to a GPU through the
// latest Collect, the line is dated by Config.BootTime plus its time since
// boot, and it is handled as Watch handles an NVML XID event: classified,
// held in the GPU's health, and passed to fn as an [EventKindXID] Event with
// Source [SourceKernelLog], unless the same code on the same GPU was
// reported within Config.XIDDedupWindow. A line for a GPU that was reset
// after it was logged (ResetDone) is history and ignored. It returns the
// error of src when src fails (cannot open the log, helper refused).
func (c *Collector) WatchKernelLog(ctx context.Context, src KernelLog, fn func(Event)) error {
	boot := c.bootTime()
	err := src.FollowKernelLog(ctx, func(record string) {
		r, err := kmsg.ParseRecord(record)
		if err != nil {
			return
		}
		x, ok := kmsg.ParseXid(r.Message)
		if !ok {
			c.aerLine(ctx, r, boot, fn)
			return
		}
		c.mu.Lock()
		w, known := c.byPCI[x.PCIKey()]
		c.mu.Unlock()
		label := "GPU at PCI " + x.PCIKey()
		if known {
			label = fmt.Sprintf("GPU %d (%s)", w.index, w.uuid)
		} else {
			w.index = -1
		}
		ev, pass := c.noteXID(w.uuid, label, uint64(x.Code), boot.Add(r.SinceBoot), SourceKernelLog)
		if !pass {
			return
		}
		ev.PID, ev.Process, ev.LogLine = x.PID, x.Name, r.Message
		if !known {
			ev.Message += " (PCI " + x.PCIKey() + ")"
			ev.PCIBusID = x.PCIKey()
		}
		c.report(ctx, w.index, ev, fn)
	})
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("watch kernel log: %w", err)
	}
	return nil
}

// aerLine handles a kernel-log record that may be a PCIe AER error of one
// of the GPUs of the latest Collect (an AER line of another device, such
// as a root port or a NIC, is not the GPU reader's).
func (c *Collector) aerLine(ctx context.Context, r kmsg.Record, boot time.Time, fn func(Event)) {
	a, ok := kmsg.ParseAER(r.Message)
	if !ok {
		return
	}
	c.mu.Lock()
	w, known := c.byPCI[a.PCIKey()]
	c.mu.Unlock()
	if !known || w.uuid == "" {
		return
	}
	ev, pass := c.noteAER(w.uuid, fmt.Sprintf("GPU %d (%s)", w.index, w.uuid), a, r.Message, boot.Add(r.SinceBoot))
	if pass {
		c.report(ctx, w.index, ev, fn)
	}
}

// noteXID records XID code on the GPU uuid ("" when unknown), seen at at
// from source, and returns its Event and whether to pass it on: false for
// a sighting within the dedup window of the last one of that code on that
// GPU, or one from before the GPU's last reset.
func (c *Collector) noteXID(uuid, label string, code uint64, at time.Time, source string) (Event, bool) {
	e := c.catalog.Classify(uint32(code))
	ev := Event{Kind: EventKindXID, GPUUUID: uuid, XID: code, XIDMnemonic: e.Mnemonic, Resolution: e.Resolution,
		Immediate: e.Immediate, Investigatory: e.Investigatory, Health: xidHealth(e.Resolution),
		Severity: xidSeverity(e.Resolution), Source: source, Time: at,
		Message: fmt.Sprintf("XID %d on %s: %s", code, label, xidReason(e))}
	if uuid == "" || code > 1<<32-1 {
		return ev, true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.stateLocked(uuid)
	if at.Before(st.resetAt) {
		return ev, false
	}
	if xidHealth(e.Resolution) != HealthOK {
		if s, ok := st.xids[e.Code]; !ok || at.After(s.at) {
			st.xids[e.Code] = seenXID{entry: e, at: at}
		}
	}
	if last, ok := st.reported[e.Code]; ok && absDuration(at.Sub(last)) < c.dedup {
		return ev, false
	}
	st.reported[e.Code] = at
	return ev, true
}

func absDuration(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// ResetDone tells the Collector that the GPU uuid was reset successfully
// (bcd's gpu.reset): the XIDs and ECC events that held its health end, and
// kernel-log lines logged before now are history. Readings (ECC counts,
// row remapping, the driver's recovery action) are judged anew at the next
// Collect.
func (c *Collector) ResetDone(uuid string) { c.ResetDoneAt(uuid, c.now()) }

// ResetDoneAt is ResetDone for a reset that succeeded at at: a restarted
// bcd tells its new Collector of the resets the journal records for this
// boot, so that the kernel log's look-back does not bring back the XIDs
// they cleared. What was seen after at stays.
func (c *Collector) ResetDoneAt(uuid string, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.stateLocked(uuid)
	if at.After(st.resetAt) {
		st.resetAt = at
	}
	maps.DeleteFunc(st.xids, func(_ uint32, s seenXID) bool { return !s.at.After(at) })
	maps.DeleteFunc(st.reported, func(_ uint32, t time.Time) bool { return !t.After(at) })
	if !st.uncorrectedEvent.After(at) {
		st.uncorrectedEvent = time.Time{}
	}
	st.lastCorrected, st.nvlink = nil, nil
}

// ErrUnknownGPU reports a GPU UUID that is not one of this node's GPUs.
var ErrUnknownGPU = errors.New("no such GPU on this node")

// Processes returns the ids of the processes using the GPU uuid (compute
// and graphics), sorted, without repeats. A GPU that does not report its
// processes gives none. Errors: ErrUnknownGPU when NVML knows no GPU of
// that UUID; NVML failures otherwise.
func (c *Collector) Processes(ctx context.Context, uuid string) ([]int, error) {
	ret := c.nvml.Init()
	if _, ok := unavailable(ret); ok {
		return nil, fmt.Errorf("processes of %s: %w (no NVIDIA driver)", uuid, ErrUnknownGPU)
	}
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("processes of %s: init nvml: %w", uuid, ret)
	}
	defer c.shutdown(ctx)
	dev, ret := c.nvml.DeviceGetHandleByUUID(uuid)
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_FOUND, nvml.ERROR_INVALID_ARGUMENT:
		return nil, fmt.Errorf("processes of %s: %w", uuid, ErrUnknownGPU)
	default:
		return nil, fmt.Errorf("processes of %s: %w", uuid, ret)
	}
	var pids []int
	for _, get := range []func() ([]nvml.ProcessInfo, nvml.Return){dev.GetComputeRunningProcesses, dev.GetGraphicsRunningProcesses} {
		ps, ret := get()
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
			continue
		default:
			return nil, fmt.Errorf("processes of %s: %w", uuid, ret)
		}
		for _, p := range ps {
			pids = append(pids, int(p.Pid))
		}
	}
	slices.Sort(pids)
	return slices.Compact(pids), nil
}
