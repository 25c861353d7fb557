package gpu_test

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/better-compute/better-compute/bcd/inventory/gpu"
	"github.com/better-compute/better-compute/bcd/inventory/gpu/gputest"
)

// TestPersistenceModeFinding: a GPU whose persistence mode
// (nvmlDeviceGetPersistenceMode) reads disabled is a degraded finding
// calling for IGNORE, reported once; the first scan that reads it enabled
// ends it; Thresholds.IgnorePersistenceMode turns it off; a GPU that does
// not report the mode has none.
func TestPersistenceModeFinding(t *testing.T) {
	t.Parallel()
	s := newDGXA100()
	var mu sync.Mutex
	mode := nvml.FEATURE_DISABLED
	device(s, 2).GetPersistenceModeFunc = func() (nvml.EnableState, nvml.Return) {
		mu.Lock()
		defer mu.Unlock()
		return mode, nvml.SUCCESS
	}
	c := newCollector(t, gpu.Config{NVML: s})
	rep := collect(t, c)
	g := rep.GPUs[2]
	if g.Health != gpu.HealthDegraded || g.Resolution != "IGNORE" || g.PersistenceMode == nil || *g.PersistenceMode ||
		len(g.NewFindings) != 1 || g.NewFindings[0].Kind != gpu.EventKindPersistence ||
		g.NewFindings[0].Severity != gpu.SeverityWarning || g.NewFindings[0].Source != gpu.SourceScan {
		t.Fatalf("persistence off: %s %q %+v", g.Health, g.HealthReasons, g.NewFindings)
	}
	if o := rep.GPUs[3]; o.PersistenceMode != nil || o.Health != gpu.HealthOK {
		t.Errorf("GPU 3 does not report the mode: %v %s", o.PersistenceMode, o.Health)
	}
	if g := collect(t, c).GPUs[2]; len(g.NewFindings) != 0 || g.Health != gpu.HealthDegraded {
		t.Errorf("still off: want the finding held, not sent again: %s %+v", g.Health, g.NewFindings)
	}
	mu.Lock()
	mode = nvml.FEATURE_ENABLED
	mu.Unlock()
	if g := collect(t, c).GPUs[2]; g.Health != gpu.HealthOK || !*g.PersistenceMode {
		t.Errorf("enabled: %s %q", g.Health, g.HealthReasons)
	}
	mu.Lock()
	mode = nvml.FEATURE_DISABLED
	mu.Unlock()
	if g := collect(t, c).GPUs[2]; len(g.NewFindings) != 1 {
		t.Errorf("off again: want the finding sent again, got %+v", g.NewFindings)
	}
	c.SetThresholds(gpu.Thresholds{IgnorePersistenceMode: true})
	if g := collect(t, c).GPUs[2]; g.Health != gpu.HealthOK {
		t.Errorf("ignorePersistenceMode: %s %q", g.Health, g.HealthReasons)
	}
}

// fabricSystem is a mock DGX A100 whose GPUs 0 and 1 have a completed
// NVLink fabric (an NVSwitch system), read through a fake systemctl on an
// injected clock.
func fabricSystem(t *testing.T, th gpu.Thresholds) (*gpu.Collector, *gputest.FabricManager, *fakeClock) {
	t.Helper()
	s := newDGXA100()
	for _, i := range []int{0, 1} {
		device(s, i).GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
			return nvml.GpuFabricInfo{State: nvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(nvml.SUCCESS)}, nvml.SUCCESS
		}
	}
	fm := gputest.NewFabricManager()
	clock := &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	return newCollector(t, gpu.Config{NVML: s, Now: clock.Now, Runner: fm, Thresholds: th}), fm, clock
}

// fmFinding returns GPU i's fabric-manager health reason ("" for none) and
// its new fabric-manager findings.
func fmFinding(g gpu.GPU) (string, []gpu.Event) {
	var reason string
	for _, r := range g.HealthReasons {
		if strings.Contains(r, gpu.FabricManagerUnit) {
			reason = r
		}
	}
	var evs []gpu.Event
	for _, ev := range g.NewFindings {
		if ev.Kind == gpu.EventKindFabricManager {
			evs = append(evs, ev)
		}
	}
	return reason, evs
}

// TestFabricManagerServiceDown: the nvidia-fabricmanager unit read failed
// (recorded `systemctl show` output) is no finding within
// gpuHealth.fabricGrace, then a degraded ESCALATE cause of every GPU with
// a fabric (and none of the others), sent once as a node's finding (naming
// no GPU, from the first GPU with a fabric); back up, it holds
// through the stabilisation window and ends after it. A machine without a
// fabric never runs systemctl.
func TestFabricManagerServiceDown(t *testing.T) {
	t.Parallel()
	c, fm, clock := fabricSystem(t, gpu.Thresholds{FabricGrace: time.Minute, FabricManagerWindow: 10 * time.Minute})
	rep := collect(t, c)
	if rep.FabricManager == nil || !rep.FabricManager.Up() || rep.GPUs[0].Health != gpu.HealthOK {
		t.Fatalf("running: %+v %s %q", rep.FabricManager, rep.GPUs[0].Health, rep.GPUs[0].HealthReasons)
	}
	fm.Set(gputest.FabricManagerFailed)
	if r, _ := fmFinding(collect(t, c).GPUs[0]); r != "" {
		t.Fatalf("down within the grace: %q", r)
	}
	clock.Advance(61 * time.Second)
	rep = collect(t, c)
	for i, g := range rep.GPUs {
		r, evs := fmFinding(g)
		if i > 1 {
			if r != "" || len(evs) != 0 {
				t.Errorf("GPU %d has no fabric: %q %+v", i, r, evs)
			}
			continue
		}
		if g.Health != gpu.HealthDegraded || g.Resolution != "ESCALATE" || len(evs) != 1-i ||
			!strings.Contains(r, "not running: failed (failed)") {
			t.Fatalf("GPU %d, down past the grace: %s %q %+v", i, g.Health, g.HealthReasons, evs)
		}
		if i == 1 {
			continue
		}
		ev := evs[0]
		if ev.FabricManager == nil || ev.FabricManager.ActiveState != "failed" || ev.FabricManagerDownFor < time.Minute ||
			ev.Severity != gpu.SeverityWarning || ev.GPUUUID != "" || ev.PCIBusID != "" ||
			!strings.HasPrefix(ev.Message, gpu.FabricManagerUnit+" not running") {
			t.Errorf("the node's event: %+v", ev)
		}
	}
	if _, evs := fmFinding(collect(t, c).GPUs[0]); len(evs) != 0 {
		t.Errorf("still down: sent again %+v", evs)
	}
	// One systemctl call fails mid-episode: the last reading stands, the
	// finding is neither ended nor sent again.
	fm.Fail(errors.New("systemctl: Failed to connect to bus: Connection refused"))
	if r, evs := fmFinding(collect(t, c).GPUs[0]); !strings.Contains(r, "not running") || len(evs) != 0 {
		t.Errorf("systemctl failed once mid-episode: %q %+v, want the finding held, nothing sent", r, evs)
	}
	fm.Set(gputest.FabricManagerFailed)
	if r, evs := fmFinding(collect(t, c).GPUs[0]); !strings.Contains(r, "not running") || len(evs) != 0 {
		t.Errorf("read again after a failed call: %q %+v, want the finding held, nothing sent again", r, evs)
	}

	fm.Set(gputest.FabricManagerRunning)
	clock.Advance(time.Minute)
	if r, evs := fmFinding(collect(t, c).GPUs[0]); !strings.Contains(r, "stabilisation window") || len(evs) != 0 {
		t.Errorf("up again, within the stabilisation window: %q %+v", r, evs)
	}
	clock.Advance(10 * time.Minute)
	if g := collect(t, c).GPUs[0]; g.Health != gpu.HealthOK {
		t.Errorf("up for the stabilisation window: %s %q", g.Health, g.HealthReasons)
	}

	fm.Set(gputest.FabricManagerNotFound)
	collect(t, c)
	clock.Advance(2 * time.Minute)
	if r, evs := fmFinding(collect(t, c).GPUs[0]); !strings.Contains(r, "not installed") || len(evs) != 1 {
		t.Errorf("unit not found: %q %+v", r, evs)
	}

	// Without a fabric, systemctl is not asked.
	plain := newDGXA100()
	other := gputest.NewFabricManager()
	if rep := collect(t, newCollector(t, gpu.Config{NVML: plain, Runner: other})); rep.FabricManager != nil || other.Calls() != 0 {
		t.Errorf("no fabric: read %+v, %d calls", rep.FabricManager, other.Calls())
	}
}

// TestFabricManagerServiceFlapping: restarts of the unit (systemd's
// NRestarts rising) reaching gpuHealth.fabricManagerFlapRestarts within
// the window are one finding for the episode, however often it restarts
// again; the finding ends only once the unit has stayed up, with no
// restart, for the window after the last one. systemctl failing (no
// systemd) judges nothing.
func TestFabricManagerServiceFlapping(t *testing.T) {
	t.Parallel()
	c, fm, clock := fabricSystem(t, gpu.Thresholds{FabricManagerFlapRestarts: 3, FabricManagerWindow: 10 * time.Minute})
	collect(t, c)
	for i := range 2 {
		clock.Advance(time.Minute)
		fm.Restart(1)
		if r, _ := fmFinding(collect(t, c).GPUs[0]); r != "" {
			t.Fatalf("restart %d, below the flap count: %q", i+1, r)
		}
	}
	clock.Advance(time.Minute)
	fm.Restart(1)
	g := collect(t, c).GPUs[0]
	r, evs := fmFinding(g)
	if !strings.Contains(r, "flapping: restarted 3 times within 10m0s") || len(evs) != 1 || evs[0].FabricManagerRestarts != 3 ||
		evs[0].FabricManagerWindow != 10*time.Minute || g.Health != gpu.HealthDegraded {
		t.Fatalf("third restart within the window: %q %+v", r, evs)
	}
	clock.Advance(time.Minute)
	fm.Restart(2)
	if r, evs := fmFinding(collect(t, c).GPUs[0]); r == "" || len(evs) != 0 {
		t.Errorf("flapping on: want the same episode, got %q %+v", r, evs)
	}
	// Up from now on: the restarts leave the window, and the finding holds
	// until 10 min after the last one.
	clock.Advance(9 * time.Minute)
	if r, _ := fmFinding(collect(t, c).GPUs[0]); r == "" {
		t.Errorf("9 min after the last restart: want it held")
	}
	clock.Advance(time.Minute)
	if g := collect(t, c).GPUs[0]; g.Health != gpu.HealthOK {
		t.Errorf("10 min up: %s %q", g.Health, g.HealthReasons)
	}
	clock.Advance(time.Minute)
	fm.Restart(1)
	if r, _ := fmFinding(collect(t, c).GPUs[0]); r != "" {
		t.Errorf("one restart after the episode: %q", r)
	}

	// systemctl failing from now on: the last reading stands for the
	// window, then nothing is judged.
	fm.Fail(errors.New("System has not been booted with systemd as init system (PID 1)"))
	if rep := collect(t, c); rep.FabricManager == nil || !rep.FabricManager.Up() || rep.GPUs[0].Health != gpu.HealthOK {
		t.Errorf("systemctl failing, within the window: %+v %s, want the last reading (up)", rep.FabricManager, rep.GPUs[0].Health)
	}
	clock.Advance(10 * time.Minute)
	if rep := collect(t, c); rep.FabricManager != nil || rep.GPUs[0].Health != gpu.HealthOK {
		t.Errorf("systemctl failing past the window: %+v %s, want no reading", rep.FabricManager, rep.GPUs[0].Health)
	}
}

// TestParseSystemctlShow: systemd's output in its own order, older
// systemd without NRestarts, and bad outputs named.
func TestParseSystemctlShow(t *testing.T) {
	t.Parallel()
	fm, err := gpu.ParseSystemctlShow([]byte(gputest.FabricManagerAutoRestart))
	if err != nil || *fm != (gpu.FabricManager{ActiveState: "activating", SubState: "auto-restart", LoadState: "loaded",
		Restarts: 1, ActiveEnterMonotonic: 8123456}) {
		t.Errorf("auto-restart: %+v, %v", fm, err)
	}
	if fm, err := gpu.ParseSystemctlShow([]byte("ActiveState=active\nSubState=running\n")); err != nil || !fm.Up() {
		t.Errorf("no NRestarts: %+v, %v", fm, err)
	}
	for _, bad := range []string{"", "SubState=running\n", "ActiveState=active\nNRestarts=many\n", "ActiveState active\n"} {
		if _, err := gpu.ParseSystemctlShow([]byte(bad)); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}
