package inventory

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"slices"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	"github.com/better-compute/better-compute/bcd/inventory/gpu"
	"github.com/better-compute/better-compute/bcd/inventory/ib"
)

// GPUCollector collects GPU inventory; *gpu.Collector implements it.
type GPUCollector interface {
	// Collect returns the GPUs, or a Report.Status saying why there are
	// none.
	Collect(ctx context.Context) (gpu.Report, error)
}

// IBCollector reads the InfiniBand and RoCE ports; *ib.Monitor implements
// it.
type IBCollector interface {
	// Collect returns the ports, judged; none on a host without RDMA
	// devices.
	Collect(ctx context.Context) ([]ib.Port, error)
}

// Config configures a [Scanner]. The zero value scans the running host
// without GPUs.
type Config struct {
	// Root is the file system holding /proc, /sys and /etc, with paths
	// relative to "/" (for example "proc/cpuinfo"). It must support
	// symbolic links (fs.ReadLinkFS) for NIC drivers to be found. Defaults
	// to os.DirFS("/"); tests pass a fixture tree.
	Root fs.FS
	// InterfaceAddrs returns each network interface's IP addresses in CIDR
	// form, by interface name. Defaults to asking the kernel through
	// net.Interfaces; tests that use a fixture Root should set it too.
	InterfaceAddrs func() (map[string][]string, error)
	// GPU collects GPUs into Host.GPUs. Defaults to none: Host.GPUs stays
	// empty.
	GPU GPUCollector
	// IB reads the InfiniBand/RoCE ports into Host.IBPorts. Defaults to
	// none: Host.IBPorts stays empty.
	IB IBCollector
	// Logger receives the scanner's logs. Defaults to discarding them.
	Logger *slog.Logger
}

// Scanner reads a host's inventory. It holds no state between scans and is
// safe for concurrent use.
type Scanner struct {
	root  fs.FS
	addrs func() (map[string][]string, error)
	gpu   GPUCollector
	ib    IBCollector
	log   *slog.Logger
}

// NewScanner returns a Scanner for cfg with defaults filled in.
func NewScanner(cfg Config) *Scanner {
	if cfg.Root == nil {
		cfg.Root = os.DirFS("/")
	}
	if cfg.InterfaceAddrs == nil {
		cfg.InterfaceAddrs = interfaceAddrs
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Scanner{root: cfg.Root, addrs: cfg.InterfaceAddrs, gpu: cfg.GPU, ib: cfg.IB, log: cfg.Logger}
}

// Scan reads the host's inventory. Files that cannot be read leave their
// fields empty and are not errors; a failed GPU collection or address
// lookup is logged at warn level and noted in Host.GPUStatus or leaves the
// addresses empty. Scan returns an error only when ctx is done.
func (s *Scanner) Scan(ctx context.Context) (*Host, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("scan host: %w", err)
	}
	h := &Host{
		Hostname:      readLine(s.root, "proc/sys/kernel/hostname"),
		MachineID:     firstLine(s.root, "etc/machine-id", "var/lib/dbus/machine-id"),
		BootID:        readLine(s.root, "proc/sys/kernel/random/boot_id"),
		UptimeSeconds: readUptime(s.root),
		OS:            readOS(s.root),
		CPU:           readCPU(s.root),
		Memory:        readMemory(s.root),
		Disks:         readDisks(s.root),
		DMI:           readDMI(s.root),
	}
	h.NICs = readNICs(s.root)
	if len(h.NICs) > 0 {
		addrs, err := s.addrs()
		if err != nil {
			s.log.WarnContext(ctx, "List interface addresses", logkey.Err, err)
		}
		for i := range h.NICs {
			h.NICs[i].Addresses = addrs[h.NICs[i].Name]
		}
	}
	if s.gpu != nil {
		rep, err := s.gpu.Collect(ctx)
		switch {
		case ctx.Err() != nil:
			return nil, fmt.Errorf("scan host: %w", ctx.Err())
		case err != nil:
			s.log.WarnContext(ctx, "Collect GPUs", logkey.Err, err)
			h.GPUStatus = "GPU collection failed: " + err.Error()
		default:
			h.GPUs, h.GPUStatus = rep.GPUs, rep.Status
		}
	}
	if s.ib != nil {
		ports, err := s.ib.Collect(ctx)
		switch {
		case ctx.Err() != nil:
			return nil, fmt.Errorf("scan host: %w", ctx.Err())
		case err != nil:
			s.log.WarnContext(ctx, "Collect InfiniBand ports", logkey.Err, err)
		default:
			h.IBPorts = ports
		}
	}
	return h, nil
}

// interfaceAddrs lists the kernel's interface addresses in CIDR form.
func interfaceAddrs() (map[string][]string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	out := make(map[string][]string, len(ifs))
	for _, ifc := range ifs {
		as, err := ifc.Addrs()
		if err != nil {
			return out, fmt.Errorf("list addresses of %s: %w", ifc.Name, err)
		}
		for _, a := range as {
			out[ifc.Name] = append(out[ifc.Name], a.String())
		}
		slices.Sort(out[ifc.Name])
	}
	return out, nil
}
