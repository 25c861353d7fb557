package inventory

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"

	"github.com/better-compute/better-compute/bcd/inventory/gpu"
	"github.com/better-compute/better-compute/bcd/inventory/ib"
)

// Host is the inventory of one machine, as reported by [Scanner.Scan].
// Values that could not be read (a file absent in a container, DMI serials
// unreadable without root) are left at their zero value.
type Host struct {
	// Hostname is the kernel host name (/proc/sys/kernel/hostname).
	Hostname string `json:"hostname,omitempty"`
	// MachineID is the systemd machine id (/etc/machine-id), 32 hex digits.
	MachineID string `json:"machine_id,omitempty"`
	// BootID is the kernel's random id of the current boot
	// (/proc/sys/kernel/random/boot_id); it changes on every reboot.
	BootID string `json:"boot_id,omitempty"`
	// UptimeSeconds is the time since boot in whole seconds (/proc/uptime).
	// Volatile: excluded from Digest.
	UptimeSeconds uint64 `json:"uptime_seconds,omitempty"`
	// OS is the operating system and kernel.
	OS OS `json:"os"`
	// CPU is the processor summary.
	CPU CPU `json:"cpu"`
	// Memory is the main memory.
	Memory Memory `json:"memory"`
	// Disks lists the block devices, sorted by name, without loop, ram and
	// zram devices.
	Disks []Disk `json:"disks,omitempty"`
	// NICs lists every network interface in /sys/class/net, sorted by name.
	NICs []NIC `json:"nics,omitempty"`
	// DMI is the firmware's description of the machine.
	DMI DMI `json:"dmi"`
	// GPUs lists the NVIDIA GPUs; empty when GPUStatus says why or when the
	// Scanner has no GPU collector.
	GPUs []gpu.GPU `json:"gpus,omitempty"`
	// GPUStatus explains an empty GPUs list (see gpu.Report.Status), or
	// says why GPU collection failed.
	GPUStatus string `json:"gpu_status,omitempty"`
	// IBPorts lists the InfiniBand and RoCE ports (package ib), ordered by
	// device and port; empty when there are none or the Scanner has no IB
	// collector. Their counters are readings (excluded from Digest); their
	// state, rate and health are not.
	IBPorts []ib.Port `json:"ib_ports,omitempty"`
}

// CPU summarises the processors (/proc/cpuinfo).
type CPU struct {
	// Model is the first processor's model name, for example
	// "AMD EPYC 7763 64-Core Processor".
	Model string `json:"model,omitempty"`
	// Sockets is the number of physical packages.
	Sockets int `json:"sockets,omitempty"`
	// Cores is the number of physical cores over all sockets.
	Cores int `json:"cores,omitempty"`
	// Threads is the number of logical CPUs (hardware threads) online.
	Threads int `json:"threads,omitempty"`
	// Flags lists, sorted, the feature flags that matter for scheduling
	// (vector extensions, AES, virtualisation, whether this is a guest),
	// for example "avx2", "avx512f", "hypervisor". Other flags are dropped.
	Flags []string `json:"flags,omitempty"`
}

// Memory is the main memory (/proc/meminfo).
type Memory struct {
	// TotalBytes is the usable RAM in bytes (MemTotal).
	TotalBytes uint64 `json:"total_bytes,omitempty"`
	// AvailableBytes is the memory available to new work without swapping,
	// in bytes (MemAvailable). Volatile: excluded from Digest.
	AvailableBytes uint64 `json:"available_bytes,omitempty"`
}

// Disk is one block device (/sys/block/NAME).
type Disk struct {
	// Name is the kernel name, for example "nvme0n1" or "sda".
	Name string `json:"name"`
	// SizeBytes is the capacity in bytes.
	SizeBytes uint64 `json:"size_bytes,omitempty"`
	// Model is the device's model string, when the driver exposes one.
	Model string `json:"model,omitempty"`
	// Serial is the device's serial number, when the driver exposes one.
	Serial string `json:"serial,omitempty"`
	// Rotational reports a spinning disk (queue/rotational). Virtual disks
	// often claim to rotate.
	Rotational bool `json:"rotational"`
}

// NIC is one network interface (/sys/class/net/NAME).
type NIC struct {
	// Name is the interface name, for example "eth0".
	Name string `json:"name"`
	// MAC is the hardware address as the kernel prints it,
	// "aa:bb:cc:dd:ee:ff"; empty for interfaces without one.
	MAC string `json:"mac,omitempty"`
	// SpeedMbps is the negotiated link speed in megabits per second; 0 when
	// the link is down or the driver does not report it.
	SpeedMbps uint32 `json:"speed_mbps,omitempty"`
	// Addresses lists the interface's IP addresses in CIDR form, for
	// example "10.0.0.5/24" or "fe80::1/64", sorted.
	Addresses []string `json:"addresses,omitempty"`
	// Driver is the kernel driver bound to the device, for example "mlx5_core";
	// empty for virtual interfaces.
	Driver string `json:"driver,omitempty"`
}

// OS is the operating system (/etc/os-release) and kernel.
type OS struct {
	// Name is the distribution name (NAME), for example "Debian GNU/Linux".
	Name string `json:"name,omitempty"`
	// Version is the distribution version (VERSION_ID), for example "12".
	Version string `json:"version,omitempty"`
	// Kernel is the kernel release (uname -r), for example "6.1.0-18-amd64".
	Kernel string `json:"kernel,omitempty"`
}

// DMI is what the firmware says about the machine (/sys/class/dmi/id).
// Serials are readable by root only; absent on most virtual machines and
// non-x86 boards.
type DMI struct {
	// SystemVendor is the manufacturer (sys_vendor).
	SystemVendor string `json:"system_vendor,omitempty"`
	// ProductName is the model (product_name).
	ProductName string `json:"product_name,omitempty"`
	// ProductSerial is the chassis serial number (product_serial).
	ProductSerial string `json:"product_serial,omitempty"`
	// BIOSVersion is the firmware version (bios_version).
	BIOSVersion string `json:"bios_version,omitempty"`
}

// Digest returns a stable fingerprint of h: the lower-case hex SHA-256 of
// its canonical JSON, leaving out the volatile fields (UptimeSeconds,
// Memory.AvailableBytes, each GPU's temperature, power draw, used
// memory and clocks, and each InfiniBand port's counters) and ignoring the order of lists. Two scans of an
// unchanged machine give the same digest, so the daemon can send the
// inventory only when it changed. Digest does not modify h.
func (h *Host) Digest() string {
	c := *h
	c.UptimeSeconds = 0
	c.Memory.AvailableBytes = 0
	c.CPU.Flags = sortedCopy(c.CPU.Flags)
	c.Disks = slices.Clone(c.Disks)
	slices.SortFunc(c.Disks, func(a, b Disk) int { return strings.Compare(a.Name, b.Name) })
	c.NICs = slices.Clone(c.NICs)
	for i := range c.NICs {
		c.NICs[i].Addresses = sortedCopy(c.NICs[i].Addresses)
	}
	slices.SortFunc(c.NICs, func(a, b NIC) int { return strings.Compare(a.Name, b.Name) })
	c.GPUs = slices.Clone(c.GPUs)
	for i := range c.GPUs {
		g := &c.GPUs[i]
		g.TemperatureC, g.PowerDrawMilliwatts, g.MemoryUsedBytes = 0, 0, 0
		g.SMClockMHz, g.MemoryClockMHz = 0, 0
	}
	slices.SortFunc(c.GPUs, func(a, b gpu.GPU) int { return a.Index - b.Index })
	c.IBPorts = slices.Clone(c.IBPorts)
	for i := range c.IBPorts {
		c.IBPorts[i].Counters = ib.Counters{}
	}
	slices.SortFunc(c.IBPorts, func(a, b ib.Port) int { return strings.Compare(a.Key(), b.Key()) })

	b, err := json.Marshal(&c)
	if err != nil {
		// Host holds only strings, integers, booleans, slices and structs
		// of them: encoding cannot fail.
		panic("inventory: encode host for digest: " + err.Error())
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func sortedCopy(s []string) []string {
	if s == nil {
		return nil
	}
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
