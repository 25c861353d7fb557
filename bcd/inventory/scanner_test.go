package inventory_test

import (
	"bufio"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/better-compute/better-compute/bcd/inventory"
	"github.com/better-compute/better-compute/bcd/inventory/gpu"
)

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func scan(t *testing.T, cfg inventory.Config) *inventory.Host {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	h, err := inventory.NewScanner(cfg).Scan(t.Context())
	if err != nil {
		t.Fatalf("Scan: %v", err)
	}
	return h
}

// TestScanThisHost checks a scan of the machine running the test against
// the kernel's files, read independently here.
func TestScanThisHost(t *testing.T) {
	t.Parallel()
	h := scan(t, inventory.Config{})

	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Fatal(err)
	}
	var processors int
	var model string
	for line := range strings.Lines(string(cpuinfo)) {
		k, v, _ := strings.Cut(line, ":")
		switch strings.TrimSpace(k) {
		case "processor":
			processors++
		case "model name":
			if model == "" {
				model = strings.TrimSpace(v)
			}
		}
	}
	if h.CPU.Threads != processors {
		t.Errorf("CPU.Threads = %d, /proc/cpuinfo has %d processor lines", h.CPU.Threads, processors)
	}
	if model != "" && h.CPU.Model != model {
		t.Errorf("CPU.Model = %q, want %q", h.CPU.Model, model)
	}
	if h.CPU.Sockets < 1 || h.CPU.Cores < h.CPU.Sockets || h.CPU.Cores > h.CPU.Threads {
		t.Errorf("implausible topology: %+v", h.CPU)
	}

	if want := memTotal(t) * 1024; h.Memory.TotalBytes != want {
		t.Errorf("Memory.TotalBytes = %d, want MemTotal×1024 = %d", h.Memory.TotalBytes, want)
	}
	if h.Memory.AvailableBytes == 0 || h.Memory.AvailableBytes > h.Memory.TotalBytes {
		t.Errorf("Memory.AvailableBytes = %d of %d", h.Memory.AvailableBytes, h.Memory.TotalBytes)
	}

	ents, err := os.ReadDir("/sys/class/net")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if fi, err := os.Stat(filepath.Join("/sys/class/net", e.Name())); err == nil && fi.IsDir() {
			names = append(names, e.Name()) // not bonding_masters, a plain file
		}
	}
	var got []string
	for _, n := range h.NICs {
		got = append(got, n.Name)
		mac, err := os.ReadFile(filepath.Join("/sys/class/net", n.Name, "address"))
		if err != nil {
			t.Errorf("%s: %v", n.Name, err)
		} else if want := strings.TrimSpace(string(mac)); n.MAC != want {
			t.Errorf("%s: MAC = %q, want %q", n.Name, n.MAC, want)
		}
	}
	if !slices.Equal(got, names) {
		t.Errorf("NICs = %q, /sys/class/net has %q", got, names)
	}
	if i := slices.IndexFunc(h.NICs, func(n inventory.NIC) bool { return n.Name == "lo" }); i >= 0 &&
		!slices.Contains(h.NICs[i].Addresses, "127.0.0.1/8") {
		t.Errorf("lo addresses = %q, want 127.0.0.1/8 among them", h.NICs[i].Addresses)
	}

	var uts syscall.Utsname
	if err := syscall.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	if want := utsString(uts.Release[:]); h.OS.Kernel != want {
		t.Errorf("OS.Kernel = %q, uname says %q", h.OS.Kernel, want)
	}
	if hn, _ := os.Hostname(); h.Hostname != hn {
		t.Errorf("Hostname = %q, want %q", h.Hostname, hn)
	}
	if len(h.BootID) != 36 || h.UptimeSeconds == 0 {
		t.Errorf("BootID = %q, UptimeSeconds = %d", h.BootID, h.UptimeSeconds)
	}
	for _, d := range h.Disks {
		if strings.HasPrefix(d.Name, "loop") || strings.HasPrefix(d.Name, "ram") || strings.HasPrefix(d.Name, "zram") {
			t.Errorf("disk %s should have been skipped", d.Name)
		}
	}
	t.Logf("host: %+v", *h)
}

func memTotal(t *testing.T) uint64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "MemTotal:" {
			n, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no MemTotal in /proc/meminfo")
	return 0
}

func utsString(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

// fixture writes files (path → content) under a new directory and returns
// it. A content starting with "->" makes a symbolic link to the rest.
func fixture(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		if target, ok := strings.CutPrefix(content, "->"); ok {
			err = os.Symlink(target, p)
		} else {
			err = os.WriteFile(p, []byte(content), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// denyFS answers "permission denied" for one path, as /sys does for DMI
// serials when bcd runs unprivileged.
type denyFS struct {
	fs.ReadLinkFS
	deny string
}

func (d denyFS) Open(name string) (fs.File, error) {
	if name == d.deny {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrPermission}
	}
	return d.ReadLinkFS.Open(name)
}

type stubGPU struct {
	rep gpu.Report
	err error
}

func (s stubGPU) Collect(context.Context) (gpu.Report, error) { return s.rep, s.err }

func TestScanFixture(t *testing.T) {
	t.Parallel()
	cpu := func(proc, pkg, core int) string {
		return "processor\t: " + strconv.Itoa(proc) + "\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n" +
			"physical id\t: " + strconv.Itoa(pkg) + "\ncore id\t\t: " + strconv.Itoa(core) + "\ncpu cores\t: 2\n" +
			"flags\t\t: fpu sse4_2 avx avx2 avx512f amx_tile aes vmx hypervisor avx2\n\n"
	}
	var cpuinfo strings.Builder
	proc := 0
	for pkg := range 2 {
		for core := range 2 {
			for range 2 { // hyper-threads
				cpuinfo.WriteString(cpu(proc, pkg, core))
				proc++
			}
		}
	}
	vpd := "\x00\x80\x00\x0e  S3Z9NB0K1234\x00"
	dir := fixture(t, map[string]string{
		"proc/cpuinfo":                   cpuinfo.String(),
		"proc/meminfo":                   "MemTotal:       263846284 kB\nMemFree:  1 kB\nMemAvailable:   250000000 kB\n",
		"proc/uptime":                    "86461.73 1369800.22\n",
		"proc/sys/kernel/hostname":       "gpu-node-17\n",
		"proc/sys/kernel/osrelease":      "6.8.0-45-generic\n",
		"proc/sys/kernel/random/boot_id": "5f0d2c4e-6b1a-4a3e-9a55-0c8f4f8e2d11\n",
		"etc/machine-id":                 "0123456789abcdef0123456789abcdef\n",
		"etc/os-release":                 "PRETTY_NAME=\"Ubuntu 24.04.1 LTS\"\nNAME=\"Ubuntu\"\nVERSION_ID=\"24.04\"\nID=ubuntu\n",

		"sys/block/nvme0n1/size":                                 "7501476528\n",
		"sys/block/nvme0n1/queue/rotational":                     "0\n",
		"sys/block/nvme0n1/device/model":                         "SAMSUNG MZQL23T8HCLS-00A07              \n",
		"sys/block/nvme0n1/device/serial":                        "S64HNE0T512345      \n",
		"sys/block/sda/size":                                     "1875385008\n",
		"sys/block/sda/queue/rotational":                         "1\n",
		"sys/block/sda/device/model":                             "ST1000NM0055-1V4\n",
		"sys/block/sda/device/vpd_pg80":                          vpd,
		"sys/block/loop0/size":                                   "0\n",
		"sys/block/ram0/size":                                    "8192\n",
		"sys/block/zram0/size":                                   "8388608\n",
		"sys/class/dmi/id/sys_vendor":                            "Supermicro\n",
		"sys/class/dmi/id/product_name":                          "SYS-821GE-TNHR\n",
		"sys/class/dmi/id/product_serial":                        "S123456X4A12345\n",
		"sys/class/dmi/id/bios_version":                          "2.1\n",
		"sys/devices/pci0000:00/0000:17:00.0/net/ens1f0/address": "b8:3f:d2:11:22:33\n",
		"sys/devices/pci0000:00/0000:17:00.0/net/ens1f0/ifindex": "2\n",
		"sys/devices/pci0000:00/0000:17:00.0/net/ens1f0/speed":   "100000\n",
		"sys/devices/pci0000:00/0000:17:00.0/net/ens1f0/device":  "->../../../0000:17:00.0",
		"sys/devices/pci0000:00/0000:17:00.0/driver":             "->../../../bus/pci/drivers/mlx5_core",
		"sys/class/net/ens1f0":                                   "->../../devices/pci0000:00/0000:17:00.0/net/ens1f0",
		"sys/class/net/lo/address":                               "00:00:00:00:00:00\n",
		"sys/class/net/lo/ifindex":                               "1\n",
		"sys/class/net/docker0/address":                          "02:42:ac:11:00:01\n",
		"sys/class/net/docker0/speed":                            "-1\n",
		"sys/class/net/bonding_masters":                          "\n",
	})
	root := denyFS{ReadLinkFS: os.DirFS(dir).(fs.ReadLinkFS), deny: "sys/class/dmi/id/product_serial"}
	gpus := []gpu.GPU{{Index: 0, Name: "NVIDIA H100 80GB HBM3", UUID: "GPU-1", Health: gpu.HealthOK}}

	h := scan(t, inventory.Config{
		Root: root,
		InterfaceAddrs: func() (map[string][]string, error) {
			return map[string][]string{"ens1f0": {"10.1.2.3/24", "fe80::ba3f:d2ff:fe11:2233/64"}, "lo": {"127.0.0.1/8"}}, nil
		},
		GPU: stubGPU{rep: gpu.Report{GPUs: gpus}},
	})

	want := &inventory.Host{
		Hostname:      "gpu-node-17",
		MachineID:     "0123456789abcdef0123456789abcdef",
		BootID:        "5f0d2c4e-6b1a-4a3e-9a55-0c8f4f8e2d11",
		UptimeSeconds: 86461,
		OS:            inventory.OS{Name: "Ubuntu", Version: "24.04", Kernel: "6.8.0-45-generic"},
		CPU: inventory.CPU{Model: "Intel(R) Xeon(R) Platinum 8480+", Sockets: 2, Cores: 4, Threads: 8,
			Flags: []string{"aes", "amx_tile", "avx", "avx2", "avx512f", "hypervisor", "sse4_2", "vmx"}},
		Memory: inventory.Memory{TotalBytes: 263846284 * 1024, AvailableBytes: 250000000 * 1024},
		Disks: []inventory.Disk{
			{Name: "nvme0n1", SizeBytes: 7501476528 * 512, Model: "SAMSUNG MZQL23T8HCLS-00A07", Serial: "S64HNE0T512345"},
			{Name: "sda", SizeBytes: 1875385008 * 512, Model: "ST1000NM0055-1V4", Serial: "S3Z9NB0K1234", Rotational: true},
		},
		NICs: []inventory.NIC{
			{Name: "docker0", MAC: "02:42:ac:11:00:01"},
			{Name: "ens1f0", MAC: "b8:3f:d2:11:22:33", SpeedMbps: 100000, Driver: "mlx5_core",
				Addresses: []string{"10.1.2.3/24", "fe80::ba3f:d2ff:fe11:2233/64"}},
			{Name: "lo", MAC: "00:00:00:00:00:00", Addresses: []string{"127.0.0.1/8"}},
		},
		DMI:  inventory.DMI{SystemVendor: "Supermicro", ProductName: "SYS-821GE-TNHR", BIOSVersion: "2.1"},
		GPUs: gpus,
	}
	if !reflect.DeepEqual(h, want) {
		t.Errorf("Scan =\n%+v\nwant\n%+v", *h, *want)
	}

	// GPU and address failures are noted, not fatal.
	h = scan(t, inventory.Config{
		Root:           root,
		InterfaceAddrs: func() (map[string][]string, error) { return nil, errors.New("netlink: boom") },
		GPU:            stubGPU{err: errors.New("init nvml: ERROR_UNKNOWN")},
	})
	if h.GPUStatus == "" || len(h.GPUs) != 0 || h.NICs[1].Addresses != nil || h.CPU.Threads != 8 {
		t.Errorf("with failures: GPUStatus %q, GPUs %d, ens1f0 %+v", h.GPUStatus, len(h.GPUs), h.NICs[1])
	}
}

func TestScanEmptyRoot(t *testing.T) {
	t.Parallel()
	h := scan(t, inventory.Config{
		Root:           os.DirFS(t.TempDir()),
		InterfaceAddrs: func() (map[string][]string, error) { return nil, nil },
		GPU:            stubGPU{rep: gpu.Report{Status: "NVML library not found: no NVIDIA driver installed"}},
	})
	want := &inventory.Host{GPUStatus: "NVML library not found: no NVIDIA driver installed"}
	if !reflect.DeepEqual(h, want) {
		t.Errorf("Scan of an empty tree = %+v, want only the GPU status", *h)
	}
}

func TestScanCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := inventory.NewScanner(inventory.Config{}).Scan(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Scan with a cancelled context: err = %v, want context.Canceled", err)
	}
}

func BenchmarkScan(b *testing.B) {
	s := inventory.NewScanner(inventory.Config{})
	for b.Loop() {
		if _, err := s.Scan(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScanSystemNVML scans as bcd node does: with a GPU collector on
// the system's NVML, which on a host without NVIDIA driver tries to load
// the library on every scan and reports why there are no GPUs.
func BenchmarkScanSystemNVML(b *testing.B) {
	c, err := gpu.New(gpu.Config{})
	if err != nil {
		b.Fatal(err)
	}
	s := inventory.NewScanner(inventory.Config{GPU: c})
	for b.Loop() {
		if _, err := s.Scan(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
}
