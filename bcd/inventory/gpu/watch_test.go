package gpu_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.uber.org/goleak"

	"github.com/better-compute/better-compute/bcd/inventory/gpu"
)

// watcher runs c.Watch in the background and records its events.
type watcher struct {
	t      *testing.T
	cancel context.CancelFunc
	done   chan error
	got    chan gpu.Event // every event, in order

	mu     sync.Mutex
	events []gpu.Event
}

func startWatch(t *testing.T, c *gpu.Collector) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	w := &watcher{t: t, cancel: cancel, done: make(chan error, 1), got: make(chan gpu.Event, 64)}
	go func() {
		w.done <- c.Watch(ctx, func(ev gpu.Event) {
			w.mu.Lock()
			w.events = append(w.events, ev)
			w.mu.Unlock()
			w.got <- ev
		})
	}()
	return w
}

// next waits for the next event.
func (w *watcher) next() gpu.Event {
	w.t.Helper()
	select {
	case ev := <-w.got:
		return ev
	case <-time.After(10 * time.Second):
		w.t.Fatal("no event within 10 s")
		return gpu.Event{}
	}
}

// stop cancels Watch, waits for it to return and returns every event.
func (w *watcher) stop() []gpu.Event {
	w.t.Helper()
	w.cancel()
	select {
	case err := <-w.done:
		if err != nil {
			w.t.Errorf("Watch: %v", err)
		}
	case <-time.After(10 * time.Second):
		w.t.Fatal("Watch did not return within 10 s of cancellation")
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.events
}

func TestWatchXID79FailsThatGPU(t *testing.T) {
	defer goleak.VerifyNone(t)
	s := newDGXA100()
	set := newFakeEvents()
	registered := wireEvents(s, set)
	clock := &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	c := newCollector(t, gpu.Config{NVML: s, Now: clock.Now, EventWaitTimeout: 20 * time.Millisecond})

	w := startWatch(t, c)
	set.C <- xidEvent(s.Devices[3], 79)
	ev := w.next()

	rep := collect(t, c)
	events := w.stop()

	want := gpu.Event{Kind: gpu.EventKindXID, GPUUUID: stableUUID(3), XID: 79, XIDMnemonic: "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS",
		Resolution: "RESTART_BM", Immediate: "RESTART_BM", Investigatory: "CONTACT_SUPPORT", Health: gpu.HealthFailed,
		Source: gpu.SourceNVML, Severity: gpu.SeverityCritical, Time: clock.Now()}
	ev.Message, want.Message = "", ""
	if !reflect.DeepEqual(ev, want) {
		t.Errorf("event = %+v, want %+v", ev, want)
	}
	if len(events) != 1 || !strings.Contains(events[0].Message, "XID 79") {
		t.Errorf("got %d events %+v, want exactly one about XID 79", len(events), events)
	}
	for i, g := range rep.GPUs {
		switch {
		case i == 3:
			if g.Health != gpu.HealthFailed || len(g.HealthReasons) != 1 || !strings.Contains(g.HealthReasons[0], "XID 79") {
				t.Errorf("GPU 3: health %s %q, want failed for XID 79", g.Health, g.HealthReasons)
			}
		case g.Health != gpu.HealthOK:
			t.Errorf("GPU %d: health %s %q, want ok", i, g.Health, g.HealthReasons)
		}
	}
	close(registered)
	n := 0
	for mask := range registered {
		n++
		if want := uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError); mask != want {
			t.Errorf("registered mask %#x, want %#x", mask, want)
		}
	}
	if n != 8 {
		t.Errorf("%d GPUs registered, want 8", n)
	}
	if got, want := len(s.ShutdownCalls()), len(s.InitCalls()); got != want {
		t.Errorf("Shutdown called %d times for %d Inits", got, want)
	}
	if len(set.FreeCalls()) != 1 {
		t.Errorf("event set freed %d times, want once", len(set.FreeCalls()))
	}
}

// XIDs are classified by NVIDIA's catalogue: 13 (RESTART_APP) and 63
// (IGNORE) only raise events, 95 (RESET_GPU) and a double-bit ECC event
// fail the GPU until it is reset, and then it is healthy again.
func TestWatchXIDClassesAndReset(t *testing.T) {
	defer goleak.VerifyNone(t)
	s := newDGXA100()
	set := newFakeEvents()
	wireEvents(s, set)
	clock := &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	c := newCollector(t, gpu.Config{NVML: s, Now: clock.Now, EventWaitTimeout: 20 * time.Millisecond})

	w := startWatch(t, c)
	set.C <- xidEvent(s.Devices[1], 13)
	if ev := w.next(); ev.Severity != gpu.SeverityWarning || ev.XID != 13 || ev.Resolution != "RESTART_APP" || ev.Source != gpu.SourceNVML {
		t.Errorf("XID 13 event = %+v, want a RESTART_APP warning", ev)
	}
	set.C <- xidEvent(s.Devices[2], 63)
	if ev := w.next(); ev.Severity != gpu.SeverityInfo || ev.GPUUUID != stableUUID(2) || ev.Resolution != "IGNORE" {
		t.Errorf("XID 63 event = %+v, want IGNORE info for GPU 2", ev)
	}
	set.C <- xidEvent(s.Devices[3], 95)
	if ev := w.next(); ev.Severity != gpu.SeverityCritical || ev.Resolution != "RESET_GPU" || ev.XIDMnemonic == "" {
		t.Errorf("XID 95 event = %+v, want a critical RESET_GPU", ev)
	}
	set.C <- xidEvent(s.Devices[3], 95) // the same error again, at once: one event
	set.C <- nvml.EventData{Device: s.Devices[4], EventType: nvml.EventTypeSingleBitEccError}
	set.C <- nvml.EventData{Device: s.Devices[5], EventType: nvml.EventTypeDoubleBitEccError}
	if ev := w.next(); ev.Kind != gpu.EventKindECCUncorrected || ev.GPUUUID != stableUUID(5) || ev.Resolution != "RESET_GPU" {
		t.Errorf("double-bit event = %+v, want %s for GPU 5", ev, gpu.EventKindECCUncorrected)
	}
	if n := len(w.stop()); n != 4 {
		t.Errorf("got %d events, want 4 (a repeated XID and single-bit ECC events are not reported)", n)
	}

	rep := collect(t, c)
	for i, want := range []gpu.Health{gpu.HealthOK, gpu.HealthOK, gpu.HealthOK, gpu.HealthFailed, gpu.HealthOK, gpu.HealthFailed, gpu.HealthOK, gpu.HealthOK} {
		if g := rep.GPUs[i]; g.Health != want {
			t.Errorf("GPU %d: %s %q, want %s", i, g.Health, g.HealthReasons, want)
		}
	}
	if g := rep.GPUs[3]; g.Resolution != "RESET_GPU" || g.XID != 95 || g.XIDMnemonic == "" {
		t.Errorf("GPU 3: resolution %q xid %d %q, want RESET_GPU for XID 95", g.Resolution, g.XID, g.XIDMnemonic)
	}
	clock.Advance(24 * time.Hour)
	if g := collect(t, c).GPUs[3]; g.Health != gpu.HealthFailed {
		t.Errorf("GPU 3 a day later without a reset: %s, want still failed", g.Health)
	}
	c.ResetDone(stableUUID(3))
	c.ResetDone(stableUUID(5))
	for i, g := range collect(t, c).GPUs {
		if g.Health != gpu.HealthOK || g.Resolution != "" || g.XID != 0 {
			t.Errorf("GPU %d after the reset: %s %q %q", i, g.Health, g.HealthReasons, g.Resolution)
		}
	}
}

// fakeLog is a KernelLog that hands out fixed records, then waits.
type fakeLog struct{ records []string }

func (f fakeLog) FollowKernelLog(ctx context.Context, fn func(string)) error {
	for _, r := range f.records {
		fn(r)
	}
	<-ctx.Done()
	return nil
}

// The kernel log's look-back finds an XID raised before bcd started, maps
// its PCI address to the GPU, dates it by the boot time, and an NVML event
// of the same error is not reported again.
func TestWatchKernelLog(t *testing.T) {
	defer goleak.VerifyNone(t)
	s := newDGXA100()
	set := newFakeEvents()
	wireEvents(s, set)
	boot := time.Date(2026, 3, 1, 11, 0, 0, 0, time.UTC)
	clock := &fakeClock{t: boot.Add(time.Hour)}
	c := newCollector(t, gpu.Config{NVML: s, Now: clock.Now, EventWaitTimeout: 20 * time.Millisecond,
		BootTime: func() time.Time { return boot }})
	rep := collect(t, c)                                // the PCI map comes from a Collect
	_, bus, _ := strings.Cut(rep.GPUs[6].PCIBusID, ":") // "06:00.0" of "00000000:06:00.0"
	short := "0000:" + strings.ToLower(bus[:5])         // as the driver writes it
	atBoot := 3600*time.Second - 2*time.Second          // two seconds before "now"
	log := fakeLog{records: []string{
		"6,10,5000000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15",
		fmt.Sprintf("3,11,%d,-;NVRM: Xid (PCI:%s): 79, pid=77, name=trainer, GPU has fallen off the bus.", atBoot/time.Microsecond, short),
		"3,12,3600000000,-;NVRM: Xid (PCI:0000:ee:00): 13, Graphics Exception",
		"not a record",
	}}
	ctx, cancel := context.WithCancel(t.Context())
	got := make(chan gpu.Event, 8)
	done := make(chan error, 1)
	go func() { done <- c.WatchKernelLog(ctx, log, func(ev gpu.Event) { got <- ev }) }()
	next := func() gpu.Event {
		t.Helper()
		select {
		case ev := <-got:
			return ev
		case <-time.After(10 * time.Second):
			t.Fatal("no event within 10 s")
			return gpu.Event{}
		}
	}
	ev := next()
	if ev.XID != 79 || ev.GPUUUID != stableUUID(6) || ev.Source != gpu.SourceKernelLog || ev.PID != 77 || ev.Process != "trainer" ||
		!ev.Time.Equal(boot.Add(atBoot)) || ev.Resolution != "RESTART_BM" || ev.XIDMnemonic != "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS" {
		t.Errorf("kernel-log event = %+v", ev)
	}
	if ev := next(); ev.XID != 13 || ev.GPUUUID != "" || !strings.Contains(ev.Message, "0000:EE:00") {
		t.Errorf("event of an unknown GPU = %+v", ev)
	}

	w := startWatch(t, c)
	set.C <- xidEvent(s.Devices[6], 79) // NVML's event of the same error
	set.C <- xidEvent(s.Devices[6], 62)
	if ev := w.next(); ev.XID != 62 {
		t.Errorf("after the kernel log's XID 79, NVML's event %+v; want only XID 62", ev)
	}
	w.stop()
	cancel()
	if err := <-done; err != nil {
		t.Errorf("WatchKernelLog = %v", err)
	}
	if g := collect(t, c).GPUs[6]; g.Health != gpu.HealthFailed || g.Resolution != "RESTART_BM" || g.XID != 79 || len(g.HealthReasons) != 2 {
		t.Errorf("GPU 6: %s %q %s xid %d, want failed by XIDs 62 and 79, RESTART_BM, XID 79 (as recent as 62, and calls for more)", g.Health, g.HealthReasons, g.Resolution, g.XID)
	}

	// After a reset the look-back of a restarted watch does not bring the
	// old line back.
	c.ResetDone(stableUUID(6))
	ctx, cancel = context.WithCancel(t.Context())
	go func() { done <- c.WatchKernelLog(ctx, log, func(ev gpu.Event) { got <- ev }) }()
	if ev := next(); ev.XID != 13 {
		t.Errorf("after the reset the look-back gave %+v, want only the unknown GPU's XID 13", ev)
	}
	cancel()
	<-done
	if g := collect(t, c).GPUs[6]; g.Health != gpu.HealthOK {
		t.Errorf("GPU 6 after the reset: %s %q", g.Health, g.HealthReasons)
	}
}

// Processes lists who uses a GPU, for gpu.reset's check.
func TestProcesses(t *testing.T) {
	t.Parallel()
	s := newDGXA100()
	device(s, 2).GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 40}, {Pid: 7}}, nvml.SUCCESS
	}
	device(s, 2).GetGraphicsRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: 7}}, nvml.SUCCESS
	}
	c := newCollector(t, gpu.Config{NVML: s})
	if pids, err := c.Processes(t.Context(), stableUUID(2)); err != nil || fmt.Sprint(pids) != "[7 40]" {
		t.Errorf("Processes = %v, %v", pids, err)
	}
	if pids, err := c.Processes(t.Context(), stableUUID(1)); err != nil || len(pids) != 0 {
		t.Errorf("Processes of an idle GPU = %v, %v", pids, err)
	}
	if _, err := c.Processes(t.Context(), "GPU-nope"); !errors.Is(err, gpu.ErrUnknownGPU) {
		t.Errorf("Processes of another GPU = %v", err)
	}
}

func TestWatchRetriesFailedWait(t *testing.T) {
	defer goleak.VerifyNone(t)
	s := newDGXA100()
	set := newFakeEvents()
	wireEvents(s, set)
	wait := set.WaitFunc
	var mu sync.Mutex
	failures := 2
	set.WaitFunc = func(ms uint32) (nvml.EventData, nvml.Return) {
		mu.Lock()
		defer mu.Unlock()
		if failures > 0 {
			failures--
			return nvml.EventData{}, nvml.ERROR_UNKNOWN
		}
		return wait(ms)
	}
	c := newCollector(t, gpu.Config{NVML: s, EventWaitTimeout: 20 * time.Millisecond})

	w := startWatch(t, c)
	set.C <- xidEvent(s.Devices[0], 48)
	if ev := w.next(); ev.XID != 48 || ev.Severity != gpu.SeverityCritical {
		t.Errorf("event = %+v, want critical XID 48", ev)
	}
	w.stop()
}

func TestWatchWithoutEventSupport(t *testing.T) {
	defer goleak.VerifyNone(t)
	s := newDGXA100() // EventSetCreate answers NOT_SUPPORTED
	c := newCollector(t, gpu.Config{NVML: s})
	if err := c.Watch(t.Context(), func(gpu.Event) {}); err != nil {
		t.Errorf("Watch: %v", err)
	}

	s = newDGXA100()
	wireEvents(s, newFakeEvents())
	for i := range s.Devices {
		device(s, i).RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }
	}
	c = newCollector(t, gpu.Config{NVML: s})
	if err := c.Watch(t.Context(), func(gpu.Event) {}); err != nil {
		t.Errorf("Watch with no GPU accepting events: %v", err)
	}
}

// XID 154 (GPU_RECOVERY_ACTION_CHANGED, "Informational only regarding
// another Xid") never acts by itself: its event says IGNORE and the GPU
// stays healthy; the driver's recovery action it announces, read at the
// next Collect, is the finding that acts (a GPU_RESET: failed, RESET_GPU),
// and a recovery action of none leaves the GPU healthy with no finding.
func TestWatchXID154IsInformational(t *testing.T) {
	defer goleak.VerifyNone(t)
	s := newDGXA100()
	set := newFakeEvents()
	wireEvents(s, set)
	f := &fields{val: map[uint32]uint64{nvml.FI_DEV_GET_GPU_RECOVERY_ACTION: uint64(nvml.GPU_RECOVERY_ACTION_NONE)}}
	device(s, 2).GetFieldValuesFunc = f.get
	clock := &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	c := newCollector(t, gpu.Config{NVML: s, Now: clock.Now, EventWaitTimeout: 20 * time.Millisecond})

	w := startWatch(t, c)
	set.C <- xidEvent(s.Devices[2], 154)
	if ev := w.next(); ev.XID != 154 || ev.Resolution != "IGNORE" || ev.Health != gpu.HealthOK || ev.Severity != gpu.SeverityInfo ||
		ev.XIDMnemonic != "GPU_RECOVERY_ACTION_CHANGED" {
		t.Errorf("XID 154 event = %+v, want IGNORE info, health ok", ev)
	}
	w.stop()
	if g := collect(t, c).GPUs[2]; g.Health != gpu.HealthOK || g.Resolution != "" || len(g.NewFindings) != 0 {
		t.Errorf("GPU 2 after a lone 154 (recovery action none): %s %q %q findings %+v", g.Health, g.HealthReasons, g.Resolution, g.NewFindings)
	}
	f.set(nvml.FI_DEV_GET_GPU_RECOVERY_ACTION, uint64(nvml.GPU_RECOVERY_ACTION_GPU_RESET))
	g := collect(t, c).GPUs[2]
	if g.Health != gpu.HealthFailed || g.Resolution != "RESET_GPU" || len(g.NewFindings) != 1 ||
		g.NewFindings[0].Kind != gpu.EventKindRecoveryAction || g.NewFindings[0].Resolution != "RESET_GPU" {
		t.Errorf("GPU 2 with recovery action GPU_RESET: %s %q %q findings %+v", g.Health, g.HealthReasons, g.Resolution, g.NewFindings)
	}
}
