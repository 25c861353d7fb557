package sim

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Shape of the simulated machine: an NVIDIA DGX A100.
const (
	simGPUs      = 8
	simGPUName   = "NVIDIA A100-SXM4-40GB"
	simGPUMemory = 40 << 30
	simMemory    = 1 << 40
)

// simulatedInventory returns the inventory of a DGX A100 named name, with
// its Digest set. Everything derives from name, so the digest is stable.
func simulatedInventory(name string) *sessionv1.Inventory {
	inv := &sessionv1.Inventory{
		Host: &sessionv1.HostInfo{
			Hostname:      name,
			MachineId:     hex.EncodeToString(derive(name, "machine-id", 16)),
			UptimeSeconds: 86400,
			Os:            &sessionv1.OS{Name: "Ubuntu", Version: "22.04", Kernel: "5.15.0-sim"},
			Cpu: &sessionv1.CPU{
				Model: "AMD EPYC 7742 64-Core Processor", Sockets: 2, Cores: 128, Threads: 256,
				Flags: []string{"avx2", "sse4_2"},
			},
			Memory: &sessionv1.Memory{TotalBytes: simMemory, AvailableBytes: simMemory * 9 / 10},
			Disks: []*sessionv1.Disk{
				{Name: "nvme0n1", SizeBytes: 1920 << 30, Model: "SAMSUNG MZ1LB1T9HALS", Serial: hex.EncodeToString(derive(name, "disk0", 6))},
				{Name: "nvme1n1", SizeBytes: 3840 << 30, Model: "SAMSUNG MZWLJ3T8HBLS", Serial: hex.EncodeToString(derive(name, "disk1", 6))},
			},
			Nics: []*sessionv1.NIC{
				{Name: "enp226s0", Mac: mac(name, "nic0"), SpeedMbps: 100000, Driver: "mlx5_core"},
				{Name: "ibp12s0", Mac: mac(name, "nic1"), SpeedMbps: 200000, Driver: "mlx5_core"},
			},
			Dmi: &sessionv1.DMI{
				SystemVendor: "NVIDIA", ProductName: "DGXA100",
				ProductSerial: hex.EncodeToString(derive(name, "serial", 8)), BiosVersion: "1.25",
			},
		},
	}
	for i := range simGPUs {
		inv.Gpus = append(inv.Gpus, &sessionv1.GPU{
			Index:             uint32(i),
			Name:              simGPUName,
			Uuid:              "GPU-" + uuid(derive(name, fmt.Sprintf("gpu%d", i), 16)),
			Serial:            hex.EncodeToString(derive(name, fmt.Sprintf("gpu-serial%d", i), 7)),
			PciBusId:          fmt.Sprintf("00000000:%02X:00.0", 0x07+i*0x10),
			MemoryTotalBytes:  simGPUMemory,
			DriverVersion:     "550.54.15",
			CudaDriverVersion: "12.4",
			TemperatureC:      34,
			PowerLimitMw:      400000,
			MigMode:           sessionv1.MIGMode_MIG_MODE_DISABLED,
			Health:            &sessionv1.GPUHealth{State: sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK},
		})
	}
	for _, g := range inv.Gpus {
		inv.GpusSeen = append(inv.GpusSeen, g.GetUuid()) // bcd's record of the GPUs it has seen
	}
	// One InfiniBand port per GPU, as on a DGX A100 (mlx5_0..mlx5_7, the
	// compute fabric's HCAs), up.
	for i := range simGPUs {
		inv.IbPorts = append(inv.IbPorts, &sessionv1.InfiniBandPort{Device: fmt.Sprintf("mlx5_%d", i), Port: 1,
			PciBusId: fmt.Sprintf("0000:%02x:00.0", 0x0c+i*0x10), State: "ACTIVE", PhysState: "LinkUp",
			Rate: "200 Gb/sec (4X HDR)", LinkLayer: "InfiniBand",
			Health: &sessionv1.GPUHealth{State: sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK}})
	}
	// The digest is over the deterministic encoding, which is stable here
	// because nothing in the simulated inventory changes.
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(inv)
	if err != nil {
		panic(fmt.Sprintf("sim: marshal inventory: %v", err)) // only plain fields: cannot fail
	}
	sum := sha256.Sum256(b)
	inv.Digest = hex.EncodeToString(sum[:])
	return inv
}

// mac returns a locally administered unicast MAC derived from name.
func mac(name, purpose string) string {
	b := derive(name, purpose, 6)
	b[0] = b[0]&0xfc | 0x02
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3], b[4], b[5])
}
