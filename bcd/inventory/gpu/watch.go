package gpu

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/inventory/gpu/xid"
)

// watchedEvents are the NVML event types Watch asks for; each GPU gets the
// subset it supports.
const watchedEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError

// eventRetryMin is the first backoff after a failed event wait.
const eventRetryMin = 100 * time.Millisecond

// watched is a GPU registered in Watch's event set.
type watched struct {
	dev   nvml.Device
	index int
	uuid  string
	// serial and pci are the GPU's board serial and PCI bus id, in the
	// maps Collect builds; empty in Watch's registrations.
	serial, pci string
}

// Watch registers every GPU for XID and ECC events (XID critical errors,
// double-bit and single-bit ECC errors, each where the GPU supports it) and
// waits for events until ctx is done, then returns nil.
//
// Each XID event is classified by NVIDIA's catalogue (package xid), updates
// that GPU's health as seen by later Collect calls (see the table in the
// package documentation) and calls fn once with an [EventKindXID] Event,
// unless the same code on the same GPU was reported within
// Config.XIDDedupWindow (by this or by WatchKernelLog); each double-bit ECC
// event marks the GPU failed until it is reset and calls fn once with an
// [EventKindECCUncorrected] Event. Single-bit ECC
// events are only logged at debug level: Collect reports their counts and
// flags spikes. fn runs on Watch's goroutine and should return quickly.
//
// Without an NVIDIA driver (as in [Collector.Collect]), or when no GPU
// supports events, Watch logs it at info level and returns nil at once.
// Failed waits are logged and retried with jittered exponential backoff up
// to Config.EventRetryMax. Watch returns an error only when NVML fails to
// initialise for another reason or the GPUs cannot be enumerated.
func (c *Collector) Watch(ctx context.Context, fn func(Event)) error {
	if ctx.Err() != nil {
		return nil
	}
	ret := c.nvml.Init()
	if status, ok := unavailable(ret); ok {
		c.noteUnavailable(ctx, status)
		return nil
	}
	if ret != nvml.SUCCESS {
		return fmt.Errorf("watch gpu events: init nvml: %w", ret)
	}
	defer c.shutdown(ctx)

	set, ret := c.nvml.EventSetCreate()
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
		c.log.InfoContext(ctx, "GPU events not supported", logkey.Err, error(ret))
		return nil
	default:
		return fmt.Errorf("watch gpu events: create event set: %w", ret)
	}
	defer func() {
		if ret := set.Free(); ret != nvml.SUCCESS {
			c.log.WarnContext(ctx, "Free NVML event set", logkey.Err, error(ret))
		}
	}()

	gpus, err := c.register(ctx, set)
	if err != nil {
		return fmt.Errorf("watch gpu events: %w", err)
	}
	if len(gpus) == 0 {
		c.log.InfoContext(ctx, "GPU events not supported by any GPU")
		return nil
	}
	c.log.InfoContext(ctx, "Watching GPU events", attrGPUs, len(gpus))

	timeoutMs := uint32(c.waitTimeout / time.Millisecond)
	var backoff time.Duration
	for ctx.Err() == nil {
		data, ret := set.Wait(timeoutMs)
		switch ret {
		case nvml.SUCCESS:
			backoff = 0
			c.handleEvent(ctx, data, gpus, fn)
		case nvml.ERROR_TIMEOUT:
			backoff = 0
		default:
			backoff = min(max(2*backoff, eventRetryMin), c.retryMax)
			wait := backoff/2 + rand.N(backoff/2+1)
			c.log.WarnContext(ctx, "Wait for GPU events", logkey.Err, error(ret), attrRetryIn, wait)
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
			case <-t.C:
			}
		}
	}
	return nil
}

// register adds every GPU that supports any watched event type to set.
func (c *Collector) register(ctx context.Context, set nvml.EventSet) ([]watched, error) {
	n, ret := c.nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("count devices: %w", ret)
	}
	var gpus []watched
	for i := range n {
		dev, ret := c.nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			c.log.WarnContext(ctx, "Open GPU for events", attrIndex, i, logkey.Err, error(ret))
			continue
		}
		uuid, _ := dev.GetUUID() // best effort: the UUID only labels events
		mask := uint64(watchedEvents)
		if supported, ret := dev.GetSupportedEventTypes(); ret == nvml.SUCCESS {
			mask &= supported
		}
		if mask == 0 {
			c.log.DebugContext(ctx, "GPU supports no watched events", attrIndex, i, attrUUID, uuid)
			continue
		}
		ret = dev.RegisterEvents(mask, set)
		if ret == nvml.ERROR_NOT_SUPPORTED && mask != nvml.EventTypeXidCriticalError {
			mask = nvml.EventTypeXidCriticalError
			ret = dev.RegisterEvents(mask, set)
		}
		switch ret {
		case nvml.SUCCESS:
			gpus = append(gpus, watched{dev: dev, index: i, uuid: uuid})
		case nvml.ERROR_NOT_SUPPORTED:
			c.log.DebugContext(ctx, "GPU supports no watched events", attrIndex, i, attrUUID, uuid)
		default:
			c.log.WarnContext(ctx, "Register GPU events", attrIndex, i, attrUUID, uuid, logkey.Err, error(ret))
		}
	}
	return gpus, nil
}

// handleEvent records one NVML event in the GPU's state and reports it.
func (c *Collector) handleEvent(ctx context.Context, data nvml.EventData, gpus []watched, fn func(Event)) {
	w := identify(data.Device, gpus)
	label := "unknown GPU"
	if w.index >= 0 {
		label = fmt.Sprintf("GPU %d (%s)", w.index, w.uuid)
	}
	now := c.now()
	var ev Event
	switch {
	case data.EventType&nvml.EventTypeXidCriticalError != 0:
		var pass bool
		if ev, pass = c.noteXID(w.uuid, label, data.EventData, now, SourceNVML); !pass {
			c.log.DebugContext(ctx, "GPU event already reported", attrIndex, w.index, attrUUID, w.uuid, attrXID, data.EventData)
			return
		}
	case data.EventType&nvml.EventTypeDoubleBitEccError != 0:
		if w.uuid != "" {
			c.mu.Lock()
			c.stateLocked(w.uuid).uncorrectedEvent = now
			c.mu.Unlock()
		}
		ev = Event{Kind: EventKindECCUncorrected, GPUUUID: w.uuid, Severity: SeverityCritical, Resolution: xid.ResetGPU,
			Immediate: xid.ResetGPU, Health: HealthFailed,
			Source: SourceNVML, Message: "uncorrectable ECC error on " + label, Time: now}
	default:
		c.log.DebugContext(ctx, "GPU event", attrIndex, w.index, attrUUID, w.uuid, attrEventType, data.EventType)
		return
	}
	c.report(ctx, w.index, ev, fn)
}

// report logs ev at its severity's level and passes it to fn, with the
// GPU's serial and PCI bus id from the latest Collect.
func (c *Collector) report(ctx context.Context, index int, ev Event, fn func(Event)) {
	if ev.GPUUUID != "" {
		c.mu.Lock()
		if id, ok := c.byUUID[ev.GPUUUID]; ok {
			ev.Serial, ev.PCIBusID = id.serial, cmp.Or(id.pci, ev.PCIBusID)
		}
		c.mu.Unlock()
	}
	level := slog.LevelInfo
	switch ev.Severity {
	case SeverityWarning:
		level = slog.LevelWarn
	case SeverityCritical:
		level = slog.LevelError
	}
	c.log.Log(ctx, level, "GPU error event", attrIndex, index, attrUUID, ev.GPUUUID, attrXID, ev.XID, attrStatus, ev.Message)
	fn(ev)
}

// identify finds the registered GPU an event came from. It compares
// handles first (a GPU that fell off the bus can no longer answer GetUUID),
// then asks the handle for its UUID. The index is -1 when unknown.
func identify(dev nvml.Device, gpus []watched) watched {
	if dev == nil {
		return watched{index: -1}
	}
	if t := reflect.TypeOf(dev); t.Comparable() {
		for _, w := range gpus {
			if reflect.TypeOf(w.dev) == t && w.dev == dev {
				return w
			}
		}
	}
	if uuid, ret := dev.GetUUID(); ret == nvml.SUCCESS {
		for _, w := range gpus {
			if w.uuid == uuid {
				return w
			}
		}
		return watched{index: -1, uuid: uuid}
	}
	return watched{index: -1}
}
