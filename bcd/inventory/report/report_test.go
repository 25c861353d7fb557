package report_test

import (
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/inventory"
	"github.com/better-compute/better-compute/bcd/inventory/gpu"
	"github.com/better-compute/better-compute/bcd/inventory/report"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

func TestInventory(t *testing.T) {
	one := uint64(1)
	h := &inventory.Host{
		Hostname: "gpu-01", MachineID: "m", CPU: inventory.CPU{Model: "EPYC", Sockets: 2, Cores: 128, Threads: 256},
		Memory: inventory.Memory{TotalBytes: 1 << 40},
		NICs:   []inventory.NIC{{Name: "eth0", MAC: "aa:bb:cc:dd:ee:ff", SpeedMbps: 100000}},
		GPUs: []gpu.GPU{
			{Index: 0, Name: "NVIDIA A100-SXM4-40GB", UUID: "GPU-0", MemoryTotalBytes: 40 << 30, Health: gpu.HealthOK},
			{Index: 1, Name: "NVIDIA A100-SXM4-40GB", UUID: "GPU-1", Health: gpu.HealthFailed, HealthReasons: []string{"XID 79: GPU has fallen off the bus"},
				ECC: &gpu.ECC{VolatileUncorrected: &one}, MIG: &gpu.MIG{Enabled: true}},
		},
	}
	inv := report.Inventory(h, []*sessionv1.PluginInfo{{Name: "ipmi", Version: "0.1.0", Healthy: true}}, time.Unix(1, 0))
	if inv.Digest != h.Digest() || inv.Host.Hostname != "gpu-01" || inv.Host.Cpu.Threads != 256 || len(inv.Host.Nics) != 1 || len(inv.Plugins) != 1 {
		t.Fatalf("inventory = %v", inv)
	}
	if len(inv.Gpus) != 2 || inv.Gpus[0].MemoryTotalBytes != 40<<30 || inv.Gpus[0].Health.State != sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK {
		t.Fatalf("gpu 0 = %v", inv.Gpus[0])
	}
	g := inv.Gpus[1]
	if g.Health.State != sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED || g.Health.Reasons[0] != "XID 79: GPU has fallen off the bus" ||
		g.EccVolatileUncorrected != 1 || g.MigMode != sessionv1.MIGMode_MIG_MODE_ENABLED {
		t.Fatalf("gpu 1 = %v", g)
	}
}
