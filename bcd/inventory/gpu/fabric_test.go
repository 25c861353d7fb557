package gpu_test

import (
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/better-compute/better-compute/bcd/inventory/gpu"
)

// TestFabricManagerState: a GPU whose NVLink fabric state (NVML's GPU
// fabric info) stays short of completed past the grace is a degraded
// finding calling for ESCALATE, reported once; within the grace (the
// fabric manager training at boot) it is none; completed with a failed
// status is one at once; completed and successful ends it. A GPU without
// a fabric (NOT_SUPPORTED) reads none.
func TestFabricManagerState(t *testing.T) {
	t.Parallel()
	s := newDGXA100()
	var mu sync.Mutex
	info := nvml.GpuFabricInfo{State: nvml.GPU_FABRIC_STATE_IN_PROGRESS}
	device(s, 1).GetGpuFabricInfoFunc = func() (nvml.GpuFabricInfo, nvml.Return) {
		mu.Lock()
		defer mu.Unlock()
		return info, nvml.SUCCESS
	}
	set := func(state uint8, status nvml.Return) {
		mu.Lock()
		defer mu.Unlock()
		info = nvml.GpuFabricInfo{State: state, Status: uint32(status)}
	}
	clock := &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	c := newCollector(t, gpu.Config{NVML: s, Now: clock.Now, Thresholds: gpu.Thresholds{FabricGrace: time.Minute}})
	gpu1 := func() gpu.GPU { return collect(t, c).GPUs[1] }

	if g := gpu1(); g.Health != gpu.HealthOK || g.Fabric == nil || g.Fabric.State != "IN_PROGRESS" {
		t.Fatalf("training at boot, within the grace: %s %+v", g.Health, g.Fabric)
	}
	clock.Advance(61 * time.Second)
	g := gpu1()
	if g.Health != gpu.HealthDegraded || g.Resolution != "ESCALATE" || len(g.NewFindings) != 1 ||
		g.NewFindings[0].Kind != gpu.EventKindFabric || g.NewFindings[0].Fabric.State != "IN_PROGRESS" || g.NewFindings[0].FabricFor < time.Minute {
		t.Fatalf("past the grace: %s %q %+v", g.Health, g.HealthReasons, g.NewFindings)
	}
	if g := gpu1(); len(g.NewFindings) != 0 {
		t.Errorf("reported again: %+v", g.NewFindings)
	}
	set(nvml.GPU_FABRIC_STATE_COMPLETED, nvml.SUCCESS)
	if g := gpu1(); g.Health != gpu.HealthOK {
		t.Errorf("completed: %s %q", g.Health, g.HealthReasons)
	}
	set(nvml.GPU_FABRIC_STATE_COMPLETED, nvml.ERROR_NOT_READY)
	if g := gpu1(); g.Health != gpu.HealthDegraded || len(g.HealthReasons) != 1 ||
		g.HealthReasons[0] != "NVLink fabric registration failed: ERROR_NOT_READY" {
		t.Errorf("completed with an error: %s %q", g.Health, g.HealthReasons)
	}
	if g := collect(t, c).GPUs[2]; g.Fabric != nil {
		t.Errorf("GPU 2 has no fabric, read %+v", g.Fabric)
	}
}
