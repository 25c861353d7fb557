package ib

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
)

// Bounds of Read.
const (
	// MaxPorts is how many ports Read returns at most, over all devices
	// (a large GPU system has 8 to 10 adapters of one or two ports).
	MaxPorts = 64
	// MaxFileSize is how many bytes of each sysfs file are read.
	MaxFileSize = 4096
)

// The port states that make a port up: the logical state ACTIVE (4) and
// the physical state LinkUp (5), as the IBTA's PortInfo numbers them and
// sysfs writes them ("4: ACTIVE", "5: LinkUp").
const (
	StateActive = 4
	PhysLinkUp  = 5
)

// Counters are a port's error counters (sysfs counters/<name>), as the
// kernel reports them.
type Counters struct {
	// LinkDowned counts the times the link went down after its error
	// recovery failed (8-bit, saturating, on many devices).
	LinkDowned uint64 `json:"link_downed"`
	// LinkErrorRecovery counts successful link error recoveries.
	LinkErrorRecovery uint64 `json:"link_error_recovery"`
	// SymbolError counts minor link errors on the physical lanes.
	SymbolError uint64 `json:"symbol_error"`
	// PortRcvErrors counts received packets with errors.
	PortRcvErrors uint64 `json:"port_rcv_errors"`
	// ExcessiveBufferOverrunErrors counts receive buffer overruns.
	ExcessiveBufferOverrunErrors uint64 `json:"excessive_buffer_overrun_errors"`
}

// errorTotal is the sum the errors finding judges (link_downed is judged
// as flaps).
func (c Counters) errorTotal() uint64 {
	return c.LinkErrorRecovery + c.SymbolError + c.PortRcvErrors + c.ExcessiveBufferOverrunErrors
}

// Map is c by sysfs name, the evidence of a finding.
func (c Counters) Map() map[string]uint64 {
	return map[string]uint64{"link_downed": c.LinkDowned, "link_error_recovery": c.LinkErrorRecovery,
		"symbol_error": c.SymbolError, "port_rcv_errors": c.PortRcvErrors,
		"excessive_buffer_overrun_errors": c.ExcessiveBufferOverrunErrors}
}

// counterFiles are the counters read, by file name.
var counterFiles = []string{"link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors", "excessive_buffer_overrun_errors"}

// Port is one port of an RDMA device, as read and judged.
type Port struct {
	// Device is the RDMA device, for example "mlx5_0".
	Device string `json:"device"`
	// Port is the port number, from 1.
	Port int `json:"port"`
	// PCIBusID is the device's PCI address, lower case, for example
	// "0000:3b:00.0"; empty when sysfs does not say.
	PCIBusID string `json:"pci_bus_id,omitempty"`
	// State and StateNum are the logical state ("ACTIVE", 4); PhysState
	// and PhysStateNum the physical state ("LinkUp", 5). Empty and 0 when
	// unread.
	State        string `json:"state,omitempty"`
	StateNum     int    `json:"state_num,omitempty"`
	PhysState    string `json:"phys_state,omitempty"`
	PhysStateNum int    `json:"phys_state_num,omitempty"`
	// Rate is the link's rate as written, for example "400 Gb/sec (4X NDR)".
	Rate string `json:"rate,omitempty"`
	// LinkLayer is "InfiniBand" or "Ethernet" (RoCE).
	LinkLayer string `json:"link_layer,omitempty"`
	// Counters are readings: Digest leaves them out.
	Counters Counters `json:"counters"`
	// Unread has bit i set when counterFiles[i] was missing or malformed in
	// this reading (its Counters field then reads 0, which is no count):
	// the Monitor judges no rise of a counter across readings that differ
	// in it.
	Unread uint8 `json:"-"`
	// Health is the port's health, judged by a Monitor; HealthOK from Read.
	Health Health `json:"health"`
	// HealthReasons lists each current finding, one short phrase each.
	HealthReasons []string `json:"health_reasons,omitempty"`
	// Resolution is the strongest resolution of the current findings;
	// empty when ok.
	Resolution string `json:"resolution,omitempty"`
	// NewFindings are the findings this Collect saw first (to be sent).
	NewFindings []Finding `json:"-"`
}

// Up reports whether the port is ACTIVE and LinkUp.
func (p *Port) Up() bool { return p.StateNum == StateActive && p.PhysStateNum == PhysLinkUp }

// Key names the port, "mlx5_0/1".
func (p *Port) Key() string { return p.Device + "/" + strconv.Itoa(p.Port) }

// RawPort is the text of a port's sysfs files, as ParsePort takes it.
type RawPort struct {
	State, PhysState, Rate, LinkLayer string
	// Counters by file name (link_downed, ...); a missing one reads 0.
	Counters map[string]string
}

// ErrMalformed is wrapped by ParsePort's errors.
var ErrMalformed = errors.New("malformed InfiniBand port file")

// ParsePort parses a port's files: the states "N: NAME" (N a number up to
// 255, NAME one word), the rate and link layer as one line of printable
// text, the counters as decimal numbers. It returns what parsed, and an
// error (wrapping ErrMalformed, naming each file at fault) for the rest,
// whose fields stay empty.
func ParsePort(raw RawPort) (Port, error) {
	var p Port
	var errs []error
	var err error
	if raw.State != "" {
		if p.StateNum, p.State, err = parseState(raw.State); err != nil {
			errs = append(errs, fmt.Errorf("state: %w", err))
		}
	}
	if raw.PhysState != "" {
		if p.PhysStateNum, p.PhysState, err = parseState(raw.PhysState); err != nil {
			errs = append(errs, fmt.Errorf("phys_state: %w", err))
		}
	}
	if p.Rate, err = parseLine(raw.Rate); err != nil {
		errs = append(errs, fmt.Errorf("rate: %w", err))
	}
	if p.LinkLayer, err = parseLine(raw.LinkLayer); err != nil {
		errs = append(errs, fmt.Errorf("link_layer: %w", err))
	}
	dst := []*uint64{&p.Counters.LinkDowned, &p.Counters.LinkErrorRecovery, &p.Counters.SymbolError,
		&p.Counters.PortRcvErrors, &p.Counters.ExcessiveBufferOverrunErrors}
	for i, name := range counterFiles {
		s, ok := raw.Counters[name]
		if !ok {
			p.Unread |= 1 << i
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
		if err != nil {
			p.Unread |= 1 << i
			errs = append(errs, fmt.Errorf("counters/%s: %w: %q is not a count", name, ErrMalformed, clip(s)))
			continue
		}
		*dst[i] = v
	}
	return p, errors.Join(errs...)
}

// parseState reads "4: ACTIVE".
func parseState(s string) (int, string, error) {
	s = strings.TrimSpace(s)
	num, name, ok := strings.Cut(s, ":")
	name = strings.TrimSpace(name)
	n, err := strconv.ParseUint(num, 10, 8)
	if !ok || err != nil || name == "" || strings.ContainsFunc(name, notWordRune) {
		return 0, "", fmt.Errorf("%w: %q, want \"N: NAME\"", ErrMalformed, clip(s))
	}
	return int(n), name, nil
}

func notWordRune(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-')
}

// parseLine reads one line of printable ASCII (a trailing newline
// dropped).
func parseLine(s string) (string, error) {
	s = strings.TrimRight(s, "\n")
	if strings.ContainsFunc(s, func(r rune) bool { return r < ' ' || r > '~' }) {
		return "", fmt.Errorf("%w: %q, want one line of printable text", ErrMalformed, clip(s))
	}
	return strings.TrimSpace(s), nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// classDir is the RDMA devices' class directory under the sysfs root.
const classDir = "class/infiniband"

// Read lists the ports under sysfs (a file system rooted at the sysfs
// root, so that "class/infiniband" is /sys/class/infiniband), ordered by
// device and port, at most MaxPorts. No class directory: no ports and no
// error. A device or port directory that cannot be listed is skipped; a
// file that cannot be read or parsed leaves its field empty.
func Read(sysfs fs.FS) ([]Port, error) {
	devs, err := fs.ReadDir(sysfs, classDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", classDir, err)
	}
	var out []Port
	buf := make([]byte, MaxFileSize) // every file is read into it in turn
	read := func(name string) string { return readFile(sysfs, name, buf) }
	for _, d := range devs {
		dir := path.Join(classDir, d.Name())
		ents, err := fs.ReadDir(sysfs, path.Join(dir, "ports"))
		if err != nil {
			continue
		}
		var nums []int
		for _, e := range ents {
			if n, err := strconv.Atoi(e.Name()); err == nil && n > 0 && n < 1<<16 {
				nums = append(nums, n)
			}
		}
		slices.Sort(nums)
		pci := pciAddress(read(path.Join(dir, "device/uevent")))
		for _, n := range nums {
			if len(out) >= MaxPorts {
				return out, nil
			}
			pdir := path.Join(dir, "ports", strconv.Itoa(n))
			raw := RawPort{State: read(pdir + "/state"), PhysState: read(pdir + "/phys_state"),
				Rate: read(pdir + "/rate"), LinkLayer: read(pdir + "/link_layer"),
				Counters: make(map[string]string, len(counterFiles))}
			for _, c := range counterFiles {
				if s := read(pdir + "/counters/" + c); s != "" {
					raw.Counters[c] = s
				}
			}
			p, _ := ParsePort(raw)
			p.Device, p.Port, p.PCIBusID = d.Name(), n, pci
			out = append(out, p)
		}
	}
	return out, nil
}

// readFile returns at most len(buf) bytes of name, read through buf; ""
// when it cannot be read or is not a regular file.
func readFile(fsys fs.FS, name string, buf []byte) string {
	// sysfs attributes are regular files; anything else (a FIFO in a
	// fixture tree would block the open) is not read.
	if fi, err := fs.Stat(fsys, name); err != nil || !fi.Mode().IsRegular() {
		return ""
	}
	f, err := fsys.Open(name)
	if err != nil {
		return ""
	}
	defer f.Close()
	n, err := io.ReadFull(f, buf)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return ""
	}
	return string(buf[:n])
}

// pciAddress is PCI_SLOT_NAME of a device's uevent, lower case; "" when
// none.
func pciAddress(uevent string) string {
	for line := range strings.Lines(uevent) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "PCI_SLOT_NAME="); ok && v != "" && !strings.ContainsFunc(v, notWordRune2) {
			return strings.ToLower(v)
		}
	}
	return ""
}

func notWordRune2(r rune) bool { return notWordRune(r) && r != ':' && r != '.' }
