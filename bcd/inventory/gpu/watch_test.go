package gpu_test

import (
	"context"
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

	want := gpu.Event{Kind: gpu.EventKindXID, GPUUUID: stableUUID(3), XID: 79,
		Severity: gpu.SeverityCritical, Time: clock.Now()}
	ev.Message, want.Message = "", ""
	if ev != want {
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

func TestWatchDegradedXIDExpires(t *testing.T) {
	defer goleak.VerifyNone(t)
	s := newDGXA100()
	set := newFakeEvents()
	wireEvents(s, set)
	clock := &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	c := newCollector(t, gpu.Config{NVML: s, Now: clock.Now, EventWaitTimeout: 20 * time.Millisecond,
		DegradedXIDWindow: time.Hour})

	w := startWatch(t, c)
	set.C <- xidEvent(s.Devices[1], 13)
	if ev := w.next(); ev.Severity != gpu.SeverityWarning || ev.XID != 13 {
		t.Errorf("XID 13 event = %+v, want a warning", ev)
	}
	set.C <- xidEvent(s.Devices[2], 999) // not in the table
	if ev := w.next(); ev.Severity != gpu.SeverityInfo || ev.GPUUUID != stableUUID(2) {
		t.Errorf("XID 999 event = %+v, want info for GPU 2", ev)
	}
	set.C <- nvml.EventData{Device: s.Devices[4], EventType: nvml.EventTypeSingleBitEccError}
	set.C <- nvml.EventData{Device: s.Devices[5], EventType: nvml.EventTypeDoubleBitEccError}
	if ev := w.next(); ev.Kind != gpu.EventKindECCUncorrected || ev.GPUUUID != stableUUID(5) {
		t.Errorf("double-bit event = %+v, want %s for GPU 5", ev, gpu.EventKindECCUncorrected)
	}
	if n := len(w.stop()); n != 3 {
		t.Errorf("got %d events, want 3 (single-bit ECC events are not reported)", n)
	}

	health := func() []gpu.Health {
		var hs []gpu.Health
		for _, g := range collect(t, c).GPUs {
			hs = append(hs, g.Health)
		}
		return hs
	}
	got := health()
	if got[1] != gpu.HealthDegraded || got[2] != gpu.HealthOK || got[4] != gpu.HealthOK || got[5] != gpu.HealthFailed {
		t.Errorf("health before the window = %v, want GPU 1 degraded, 5 failed", got)
	}
	clock.Advance(time.Hour + time.Second)
	got = health()
	if got[1] != gpu.HealthOK || got[5] != gpu.HealthFailed {
		t.Errorf("health after the window = %v, want GPU 1 ok again, 5 still failed", got)
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
