package gpucount_test

import (
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/gpucount"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

func inv(present []string, seen ...string) *sessionv1.Inventory {
	i := &sessionv1.Inventory{GpusSeen: seen}
	for _, u := range present {
		i.Gpus = append(i.Gpus, &sessionv1.GPU{Uuid: u})
	}
	return i
}

func TestGPUCountMissing(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	all := []string{"GPU-0", "GPU-1", "GPU-2"}
	if fs := gpucount.Missing(inv(all, all...), 3, now); len(fs) != 0 {
		t.Errorf("all present: %v", fs)
	}
	fs := gpucount.Missing(inv([]string{"GPU-0", "GPU-2"}, all...), 3, now)
	if len(fs) != 1 || fs[0].GetGpuUuid() != "GPU-1" || fs[0].GetResolution() != "RESTART_BM" ||
		fs[0].GetGpuMissing().GetExpected() != 3 || fs[0].GetGpuMissing().GetPresent() != 2 ||
		fs[0].GetHealth() != sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED || !fs[0].GetObservedAt().AsTime().Equal(now) {
		t.Errorf("GPU-1 missing: %v", fs)
	}
	if fs := gpucount.Missing(inv([]string{"GPU-0"}), 3, now); len(fs) != 1 || fs[0].GetGpuUuid() != "" {
		t.Errorf("missing without a record: %v", fs)
	}
	if fs := gpucount.Missing(&sessionv1.Inventory{GpuStatus: "NVIDIA kernel driver not loaded"}, 3, now); len(fs) != 0 {
		t.Errorf("no driver is not a missing GPU: %v", fs)
	}
	for labels, want := range map[string]int{"8": 8, "0": 0, "x": -1, "-1": -1, "65": -1} {
		n, ok := gpucount.Expected(map[string]string{gpucount.Label: labels})
		if (want < 0) == ok || ok && n != want {
			t.Errorf("Expected(%q) = %d, %v", labels, n, ok)
		}
	}
	if _, ok := gpucount.Expected(nil); ok {
		t.Error("Expected without the label is ok")
	}
}
