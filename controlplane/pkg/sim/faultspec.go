package sim

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// FaultFile is the file in dev's data directory whose faults `dev --sim N`
// applies on SIGUSR2 (Fleet.ApplyFaults).
const FaultFile = "sim-faults"

// Fault is one fault for daemons of a Fleet, as ParseFault reads it.
type Fault struct {
	// Op is "xid", "ecc", "lose-gpu", "pcie", "fabric", "persistence",
	// "fabric-manager", "remove-gpu", "restore-gpu", "versions", "ib",
	// "ib-clear", "hang",
	// "disconnect", "recovery" or "clear".
	Op string
	// Daemon names the daemons: a hostname ("sim-00003"), an index into
	// Fleet.Daemons ("3"), or "all".
	Daemon string
	// GPU is the GPU index (xid, ecc, lose-gpu, pcie, fabric,
	// persistence, remove-gpu, restore-gpu), or the InfiniBand port index
	// (ib, ib-clear).
	GPU int
	// Cause is the InfiniBand fault (ib): down, errors, flap or mlx5.
	Cause string
	// Code is the XID (xid); Count the uncorrectable ECC errors (ecc).
	Code  uint32
	Count uint64
	// For is how long a disconnect lasts (0: until clear).
	For time.Duration
	// Recovery is the recovery settings (recovery).
	Recovery Recovery
	// PCIe is the PCIe fault (pcie); the zero value ends it.
	PCIe PCIeFault
	// State is the fabric state (fabric), "on" or "off" (persistence), or
	// the fabric manager unit's ActiveState (fabric-manager).
	State string
	// Driver and CUDA are the versions (versions; "" keeps the default).
	Driver, CUDA string
}

// ErrBadFault is wrapped by ParseFault's errors.
var ErrBadFault = errors.New("bad fault")

// ParseFault reads one fault line, words separated by blanks:
//
//	xid DAEMON GPU CODE          raise XID CODE on GPU (RaiseXID)
//	ecc DAEMON GPU [COUNT]       uncorrectable ECC errors (RaiseECC; COUNT defaults to 1)
//	lose-gpu DAEMON GPU          the GPU falls off the bus (LoseGPU)
//	pcie DAEMON GPU replays=N|width=N|aer=SEVERITY|ok
//	                             a PCIe fault (RaisePCIe; SEVERITY corrected, non-fatal or fatal), ok ends it (ClearPCIe)
//	fabric DAEMON GPU STATE      the NVLink fabric state: NOT_STARTED, IN_PROGRESS or COMPLETED (SetFabricState)
//	persistence DAEMON GPU on|off persistence mode (SetPersistenceMode)
//	fabric-manager DAEMON STATE  nvidia-fabricmanager's ActiveState: active, failed, inactive, ... (SetFabricManager)
//	remove-gpu DAEMON GPU        the GPU is no longer listed (RemoveGPU); restore-gpu lists it again (RestoreGPU)
//	versions DAEMON DRIVER [CUDA] the driver and CUDA versions every GPU reports (SetVersions)
//	ib DAEMON PORT CAUSE         InfiniBand port PORT's fault: down, errors, flap or mlx5 (RaiseIBPortFault)
//	ib-clear DAEMON PORT         the port's fault ends (ClearIBPortFault)
//	hang DAEMON                  stop answering, session open (Hang)
//	disconnect DAEMON [DURATION] drop off the network for DURATION, or until clear (Disconnect)
//	recovery DAEMON [reset=DURATION] [reboot=DURATION] [reset-fails] [reboot-hangs] [diag-fails]
//	                             how gpu.reset, reboot and gpu.diag recover (SetRecovery)
//	clear DAEMON                 end every fault (ClearFaults)
//
// DAEMON is a hostname, an index into Fleet.Daemons, or "all"; DURATION is
// Go's (30s, 2m). Errors wrap ErrBadFault.
func ParseFault(line string) (Fault, error) {
	w := strings.Fields(line)
	if len(w) < 2 {
		return Fault{}, fmt.Errorf("%w: %q: want OP DAEMON ...", ErrBadFault, line)
	}
	f := Fault{Op: w[0], Daemon: w[1]}
	args := w[2:]
	need := func(min, max int) error {
		if len(args) < min || len(args) > max {
			return fmt.Errorf("%w: %q: %s takes %d to %d arguments after DAEMON", ErrBadFault, line, f.Op, min, max)
		}
		return nil
	}
	gpu := func() error {
		n, err := strconv.Atoi(args[0])
		if err != nil || n < 0 {
			return fmt.Errorf("%w: %q: GPU %q is not an index", ErrBadFault, line, args[0])
		}
		f.GPU = n
		return nil
	}
	var err error
	switch f.Op {
	case "xid":
		if err = need(2, 2); err == nil {
			if err = gpu(); err == nil {
				var c uint64
				if c, err = strconv.ParseUint(args[1], 10, 32); err != nil {
					err = fmt.Errorf("%w: %q: XID %q is not a number", ErrBadFault, line, args[1])
				}
				f.Code = uint32(c)
			}
		}
	case "ecc":
		if err = need(1, 2); err == nil {
			f.Count = 1
			if err = gpu(); err == nil && len(args) == 2 {
				if f.Count, err = strconv.ParseUint(args[1], 10, 64); err != nil {
					err = fmt.Errorf("%w: %q: count %q is not a number", ErrBadFault, line, args[1])
				}
			}
		}
	case "lose-gpu", "remove-gpu", "restore-gpu", "ib-clear":
		if err = need(1, 1); err == nil {
			err = gpu()
		}
	case "pcie":
		if err = need(2, 2); err == nil {
			if err = gpu(); err == nil {
				err = parsePCIe(args[1], &f.PCIe)
			}
		}
		if err != nil && !errors.Is(err, ErrBadFault) {
			err = fmt.Errorf("%w: %q: %v", ErrBadFault, line, err)
		}
	case "fabric", "persistence":
		if err = need(2, 2); err == nil {
			if err = gpu(); err == nil {
				f.State = args[1]
				if f.Op == "persistence" && f.State != "on" && f.State != "off" {
					err = fmt.Errorf("%w: %q: want on or off", ErrBadFault, line)
				}
			}
		}
	case "fabric-manager":
		if err = need(1, 1); err == nil {
			f.State = args[0]
			// systemd's ActiveState values (systemd.unit(5), org.freedesktop.systemd1).
			if !slices.Contains([]string{"active", "reloading", "inactive", "failed", "activating", "deactivating",
				"maintenance", "refreshing"}, f.State) {
				err = fmt.Errorf("%w: %q: %q is no systemd ActiveState (active, failed, inactive, activating, ...)", ErrBadFault, line, f.State)
			}
		}
	case "versions":
		if err = need(1, 2); err == nil {
			f.Driver = args[0]
			if len(args) == 2 {
				f.CUDA = args[1]
			}
		}
	case "ib":
		if err = need(2, 2); err == nil {
			if err = gpu(); err == nil {
				f.Cause = args[1]
			}
		}
	case "hang", "clear":
		err = need(0, 0)
	case "disconnect":
		if err = need(0, 1); err == nil && len(args) == 1 {
			if f.For, err = time.ParseDuration(args[0]); err != nil || f.For < 0 {
				err = fmt.Errorf("%w: %q: duration %q", ErrBadFault, line, args[0])
			}
		}
	case "recovery":
		for _, a := range args {
			k, v, _ := strings.Cut(a, "=")
			var d time.Duration
			switch k {
			case "reset", "reboot":
				if d, err = time.ParseDuration(v); err != nil || d < 0 {
					return Fault{}, fmt.Errorf("%w: %q: %s duration %q", ErrBadFault, line, k, v)
				}
			}
			switch k {
			case "reset":
				f.Recovery.ResetDelay = d
			case "reboot":
				f.Recovery.RebootDelay = d
			case "reset-fails":
				f.Recovery.ResetFails = true
			case "reboot-hangs":
				f.Recovery.RebootHangs = true
			case "diag-fails":
				f.Recovery.DiagFails = true
			default:
				return Fault{}, fmt.Errorf("%w: %q: unknown recovery setting %q", ErrBadFault, line, a)
			}
		}
		err = nil
	default:
		err = fmt.Errorf("%w: %q: unknown operation %q", ErrBadFault, line, f.Op)
	}
	if err != nil {
		return Fault{}, err
	}
	return f, nil
}

// parsePCIe reads a pcie fault's word: replays=N, width=N, aer=SEVERITY or
// ok (the zero PCIeFault).
func parsePCIe(w string, p *PCIeFault) error {
	if w == "ok" {
		return nil
	}
	k, v, _ := strings.Cut(w, "=")
	switch k {
	case "replays":
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == 0 {
			return fmt.Errorf("replays %q: want a count above 0", v)
		}
		p.Replays = n
	case "width":
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n >= simPCIeWidth {
			return fmt.Errorf("width %q: want 1 to %d lanes", v, simPCIeWidth-1)
		}
		p.Width = n
	case "aer":
		if _, ok := aerRules[v]; !ok {
			return fmt.Errorf("aer %q: want corrected, non-fatal or fatal", v)
		}
		p.AER = v
	default:
		return fmt.Errorf("%q: want replays=N, width=N, aer=SEVERITY or ok", w)
	}
	return nil
}

// Apply applies ft to the daemons it names and returns them. Errors: no
// daemon of that name or index (wrapping ErrBadFault), or the daemon's
// (ErrNoSuchGPU).
func (f *Fleet) Apply(ft Fault) ([]*FakeDaemon, error) {
	var ds []*FakeDaemon
	switch i, err := strconv.Atoi(ft.Daemon); {
	case ft.Daemon == "all":
		ds = f.daemons
	case err == nil && i >= 0 && i < len(f.daemons):
		ds = f.daemons[i : i+1]
	default:
		for _, d := range f.daemons {
			if d.Name() == ft.Daemon {
				ds = append(ds, d)
			}
		}
	}
	if len(ds) == 0 {
		return nil, fmt.Errorf("%w: no simulated daemon %q", ErrBadFault, ft.Daemon)
	}
	for _, d := range ds {
		var err error
		switch ft.Op {
		case "xid":
			err = d.RaiseXID(ft.GPU, ft.Code)
		case "ecc":
			err = d.RaiseECC(ft.GPU, ft.Count)
		case "lose-gpu":
			err = d.LoseGPU(ft.GPU)
		case "pcie":
			if ft.PCIe == (PCIeFault{}) {
				err = d.ClearPCIe(ft.GPU)
			} else {
				err = d.RaisePCIe(ft.GPU, ft.PCIe)
			}
		case "fabric":
			err = d.SetFabricState(ft.GPU, ft.State)
		case "persistence":
			err = d.SetPersistenceMode(ft.GPU, ft.State == "on")
		case "fabric-manager":
			d.SetFabricManager(ft.State)
		case "remove-gpu":
			err = d.RemoveGPU(ft.GPU)
		case "restore-gpu":
			err = d.RestoreGPU(ft.GPU)
		case "versions":
			d.SetVersions(ft.Driver, ft.CUDA)
		case "ib":
			err = d.RaiseIBPortFault(ft.GPU, ft.Cause)
		case "ib-clear":
			err = d.ClearIBPortFault(ft.GPU)
		case "hang":
			d.Hang()
		case "disconnect":
			d.Disconnect(ft.For)
		case "recovery":
			d.SetRecovery(ft.Recovery)
		case "clear":
			d.ClearFaults()
		default:
			err = fmt.Errorf("%w: unknown operation %q", ErrBadFault, ft.Op)
		}
		if err != nil {
			return nil, err
		}
	}
	return ds, nil
}

// ApplyFaults reads fault lines from r (ParseFault; blank lines and lines
// starting with "#" skipped) and applies each; it stops at the first bad
// line, naming its number, and returns how many it applied.
func (f *Fleet) ApplyFaults(r io.Reader) (int, error) {
	sc := bufio.NewScanner(r)
	n, line := 0, 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		ft, err := ParseFault(text)
		if err == nil {
			_, err = f.Apply(ft)
		}
		if err != nil {
			return n, fmt.Errorf("line %d: %w", line, err)
		}
		n++
	}
	if err := sc.Err(); err != nil {
		return n, fmt.Errorf("read faults: %w", err)
	}
	return n, nil
}
