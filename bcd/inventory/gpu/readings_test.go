package gpu_test

import (
	"encoding/binary"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/better-compute/better-compute/bcd/inventory/gpu"
)

// fields answers nvmlDeviceGetFieldValues from a settable table; a field
// not in it is answered NOT_SUPPORTED, as an older driver does.
type fields struct {
	mu  sync.Mutex
	val map[uint32]uint64
}

func (f *fields) set(id uint32, v uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.val[id] = v
}

func (f *fields) get(vals []nvml.FieldValue) nvml.Return {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range vals {
		v, ok := f.val[vals[i].FieldId]
		if !ok {
			vals[i].NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
			continue
		}
		vals[i].NvmlReturn = uint32(nvml.SUCCESS)
		vals[i].ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_LONG_LONG)
		if vals[i].FieldId == nvml.FI_DEV_GET_GPU_RECOVERY_ACTION {
			vals[i].ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
		}
		binary.LittleEndian.PutUint64(vals[i].Value[:], v)
	}
	return nvml.SUCCESS
}

// Throttling, the driver's recovery action, row remapping and NVLink error
// rises are judged anew at each Collect: health follows the readings and
// recovers when they clear.
func TestCollectReadingsComeAndGo(t *testing.T) {
	t.Parallel()
	s := newDGXA100()
	f := &fields{val: map[uint32]uint64{}}
	var throttle uint64
	var mu sync.Mutex
	pending := false
	for i := range s.Devices {
		d := device(s, i)
		d.GetFieldValuesFunc = f.get
		if i != 4 {
			continue
		}
		d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) {
			mu.Lock()
			defer mu.Unlock()
			return throttle, nvml.SUCCESS
		}
		d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
			mu.Lock()
			defer mu.Unlock()
			return 1, 0, pending, false, nvml.SUCCESS
		}
	}
	clock := &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	c := newCollector(t, gpu.Config{NVML: s, Now: clock.Now, NVLinkWindow: 10 * time.Minute, NVLinkErrorThreshold: 100})
	gpu4 := func() gpu.GPU { return collect(t, c).GPUs[4] }

	f.set(nvml.FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, 5000) // old errors: a baseline, not a rise
	if g := gpu4(); g.Health != gpu.HealthOK || g.NVLinkErrors == nil || g.NVLinkErrors.Replay != 5000 || g.RecoveryAction != "" {
		t.Fatalf("quiet GPU: %+v", g)
	}
	mu.Lock()
	throttle = nvml.ClocksThrottleReasonHwThermalSlowdown | nvml.ClocksEventReasonSwPowerCap
	mu.Unlock()
	if g := gpu4(); g.Health != gpu.HealthDegraded || g.Resolution != "CHECK_MECHANICALS" || len(g.HealthReasons) != 1 {
		t.Errorf("thermal slowdown: %s %q %s", g.Health, g.HealthReasons, g.Resolution)
	}
	mu.Lock()
	throttle = nvml.ClocksEventReasonSwPowerCap // at the power limit: normal
	pending = true
	mu.Unlock()
	if g := gpu4(); g.Health != gpu.HealthDegraded || g.Resolution != "RESET_GPU" || len(g.HealthReasons) != 1 {
		t.Errorf("row remapping pending: %s %q %s", g.Health, g.HealthReasons, g.Resolution)
	}
	mu.Lock()
	pending = false
	mu.Unlock()
	f.set(nvml.FI_DEV_GET_GPU_RECOVERY_ACTION, uint64(nvml.GPU_RECOVERY_ACTION_NODE_REBOOT))
	if g := gpu4(); g.Health != gpu.HealthFailed || g.Resolution != "RESTART_BM" || g.RecoveryAction != "NODE_REBOOT" {
		t.Errorf("driver asks for a reboot: %s %q %s", g.Health, g.HealthReasons, g.Resolution)
	}
	f.set(nvml.FI_DEV_GET_GPU_RECOVERY_ACTION, uint64(nvml.GPU_RECOVERY_ACTION_NONE))
	clock.Advance(5 * time.Minute)
	f.set(nvml.FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, 5150)
	if g := gpu4(); g.Health != gpu.HealthDegraded || g.Resolution != "ESCALATE" ||
		!slices.ContainsFunc(g.HealthReasons, func(r string) bool { return r == "NVLink errors rose by 150 within 10m0s" }) {
		t.Errorf("NVLink errors rising: %s %q %s", g.Health, g.HealthReasons, g.Resolution)
	}
	clock.Advance(11 * time.Minute) // the window moves past the rise
	if g := gpu4(); g.Health != gpu.HealthOK || g.Resolution != "" {
		t.Errorf("after the window: %s %q %s", g.Health, g.HealthReasons, g.Resolution)
	}
}
