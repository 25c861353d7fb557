package inventory_test

import (
	"slices"
	"testing"

	"github.com/better-compute/better-compute/bcd/inventory"
	"github.com/better-compute/better-compute/bcd/inventory/gpu"
	"github.com/better-compute/better-compute/bcd/inventory/ib"
)

func sampleHost() *inventory.Host {
	corrected := uint64(0)
	return &inventory.Host{
		Hostname:      "gpu-node-17",
		MachineID:     "0123456789abcdef0123456789abcdef",
		BootID:        "5f0d2c4e-6b1a-4a3e-9a55-0c8f4f8e2d11",
		UptimeSeconds: 100,
		OS:            inventory.OS{Name: "Ubuntu", Version: "24.04", Kernel: "6.8.0-45-generic"},
		CPU:           inventory.CPU{Model: "Xeon", Sockets: 2, Cores: 112, Threads: 224, Flags: []string{"avx2", "avx512f"}},
		Memory:        inventory.Memory{TotalBytes: 1 << 40, AvailableBytes: 1 << 39},
		Disks:         []inventory.Disk{{Name: "nvme0n1", SizeBytes: 1 << 42}, {Name: "nvme1n1", SizeBytes: 1 << 42}},
		NICs: []inventory.NIC{
			{Name: "eth0", MAC: "b8:3f:d2:11:22:33", Addresses: []string{"10.1.2.3/24", "fe80::1/64"}},
			{Name: "lo", Addresses: []string{"127.0.0.1/8"}},
		},
		GPUs: []gpu.GPU{
			{Index: 0, UUID: "GPU-a", TemperatureC: 40, PowerDrawMilliwatts: 70_000, MemoryUsedBytes: 1 << 20,
				SMClockMHz: 1410, MemoryClockMHz: 1593, Health: gpu.HealthOK, ECC: &gpu.ECC{VolatileCorrected: &corrected}},
			{Index: 1, UUID: "GPU-b", Health: gpu.HealthOK},
		},
		IBPorts: []ib.Port{
			{Device: "mlx5_0", Port: 1, State: "ACTIVE", StateNum: 4, PhysState: "LinkUp", PhysStateNum: 5, Rate: "400 Gb/sec (4X NDR)",
				LinkLayer: "InfiniBand", Counters: ib.Counters{SymbolError: 3}},
			{Device: "mlx5_1", Port: 1, State: "ACTIVE", StateNum: 4, PhysState: "LinkUp", PhysStateNum: 5},
		},
	}
}

func TestDigest(t *testing.T) {
	t.Parallel()
	base := sampleHost().Digest()
	if len(base) != 64 {
		t.Fatalf("Digest = %q, want 64 hex digits", base)
	}

	same := map[string]func(h *inventory.Host){
		"uptime":            func(h *inventory.Host) { h.UptimeSeconds = 999_999 },
		"available memory":  func(h *inventory.Host) { h.Memory.AvailableBytes = 12345 },
		"gpu temperature":   func(h *inventory.Host) { h.GPUs[0].TemperatureC = 80 },
		"gpu power":         func(h *inventory.Host) { h.GPUs[0].PowerDrawMilliwatts = 400_000 },
		"gpu memory used":   func(h *inventory.Host) { h.GPUs[0].MemoryUsedBytes = 1 << 35 },
		"gpu clocks":        func(h *inventory.Host) { h.GPUs[0].SMClockMHz, h.GPUs[0].MemoryClockMHz = 210, 405 },
		"disk order":        func(h *inventory.Host) { slices.Reverse(h.Disks) },
		"nic order":         func(h *inventory.Host) { slices.Reverse(h.NICs) },
		"address order":     func(h *inventory.Host) { slices.Reverse(h.NICs[0].Addresses) },
		"flag order":        func(h *inventory.Host) { slices.Reverse(h.CPU.Flags) },
		"gpu order":         func(h *inventory.Host) { slices.Reverse(h.GPUs) },
		"nil vs empty list": func(h *inventory.Host) { h.GPUs[1].HealthReasons = []string{} },
		"ib counters": func(h *inventory.Host) {
			h.IBPorts[0].Counters = ib.Counters{LinkDowned: 2, SymbolError: 900, PortRcvErrors: 7, LinkErrorRecovery: 1,
				ExcessiveBufferOverrunErrors: 4}
		},
		"ib port order": func(h *inventory.Host) { slices.Reverse(h.IBPorts) },
	}
	for name, mutate := range same {
		h := sampleHost()
		mutate(h)
		if got := h.Digest(); got != base {
			t.Errorf("%s changed the digest", name)
		}
	}

	changed := map[string]func(h *inventory.Host){
		"disk added":   func(h *inventory.Host) { h.Disks = append(h.Disks, inventory.Disk{Name: "sda"}) },
		"address":      func(h *inventory.Host) { h.NICs[0].Addresses[0] = "10.1.2.4/24" },
		"boot id":      func(h *inventory.Host) { h.BootID = "other" },
		"total memory": func(h *inventory.Host) { h.Memory.TotalBytes /= 2 },
		"gpu health": func(h *inventory.Host) {
			h.GPUs[1].Health, h.GPUs[1].HealthReasons = gpu.HealthFailed, []string{"XID 79: GPU has fallen off the bus"}
		},
		"gpu ecc":  func(h *inventory.Host) { n := uint64(1); h.GPUs[0].ECC.VolatileCorrected = &n },
		"gpu gone": func(h *inventory.Host) { h.GPUs, h.GPUStatus = nil, "NVIDIA kernel driver not loaded" },
		"ib port down": func(h *inventory.Host) {
			h.IBPorts[1].State, h.IBPorts[1].StateNum, h.IBPorts[1].PhysState, h.IBPorts[1].PhysStateNum = "DOWN", 1, "Polling", 2
		},
		"ib port health": func(h *inventory.Host) {
			h.IBPorts[0].Health, h.IBPorts[0].HealthReasons = ib.HealthDegraded, []string{"link flapping"}
		},
	}
	for name, mutate := range changed {
		h := sampleHost()
		mutate(h)
		if h.Digest() == base {
			t.Errorf("%s did not change the digest", name)
		}
	}

	// Digest leaves its receiver alone.
	h := sampleHost()
	slices.Reverse(h.NICs)
	h.Digest()
	if h.NICs[0].Name != "lo" || h.UptimeSeconds != 100 || h.GPUs[0].TemperatureC != 40 {
		t.Errorf("Digest modified the host: %+v", *h)
	}
}
