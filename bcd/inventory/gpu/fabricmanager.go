package gpu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/xid"
)

// FabricManagerUnit is the systemd unit of NVIDIA's fabric manager, which
// registers the GPUs of an NVSwitch system with the NVLink fabric.
const FabricManagerUnit = "nvidia-fabricmanager.service"

// fabricManagerProps are the unit properties read, in `systemctl show
// --property=` form. None needs root: systemctl asks systemd over D-Bus,
// which answers any user's reads.
const fabricManagerProps = "ActiveState,SubState,LoadState,NRestarts,ActiveEnterTimestampMonotonic"

// Runner runs a program and returns its standard output. The Collector
// reads the fabric manager's unit through it (`systemctl show`), so tests
// replay recorded outputs instead of asking systemd.
type Runner interface {
	Output(ctx context.Context, name string, args ...string) ([]byte, error)
}

// execRunner runs programs with os/exec, each bounded by a timeout.
type execRunner struct{ timeout time.Duration }

func (r execRunner) Output(ctx context.Context, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).Output()
	if err != nil {
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && len(ee.Stderr) > 0 {
			return nil, fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(string(ee.Stderr)))
		}
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return out, nil
}

// readFabricManager asks systemd for the fabric manager unit's state
// (`systemctl show nvidia-fabricmanager.service --property=...`).
func (c *Collector) readFabricManager(ctx context.Context) (*FabricManager, error) {
	out, err := c.runner.Output(ctx, "systemctl", "show", FabricManagerUnit, "--property="+fabricManagerProps)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", FabricManagerUnit, err)
	}
	fm, err := ParseSystemctlShow(out)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", FabricManagerUnit, err)
	}
	return fm, nil
}

// ParseSystemctlShow reads the output of `systemctl show UNIT
// --property=ActiveState,SubState,LoadState,NRestarts,ActiveEnterTimestampMonotonic`:
// one KEY=VALUE per line, in systemd's order, unknown keys ignored. An
// output without ActiveState, or with a count that is not a number, is an
// error naming the line.
func ParseSystemctlShow(out []byte) (*FabricManager, error) {
	var fm FabricManager
	sc := bufio.NewScanner(bytes.NewReader(out))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("systemctl show: line %d: want KEY=VALUE, got %q", n, line)
		}
		var err error
		switch k {
		case "ActiveState":
			fm.ActiveState = v
		case "SubState":
			fm.SubState = v
		case "LoadState":
			fm.LoadState = v
		case "NRestarts":
			if v != "" && v != "[not set]" {
				fm.Restarts, err = strconv.ParseUint(v, 10, 64)
			}
		case "ActiveEnterTimestampMonotonic":
			if v != "" {
				fm.ActiveEnterMonotonic, err = strconv.ParseUint(v, 10, 64)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("systemctl show: line %d: %s: %q is not a count", n, k, v)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("systemctl show: %w", err)
	}
	if fm.ActiveState == "" {
		return nil, errors.New("systemctl show: no ActiveState in the output")
	}
	return &fm, nil
}

// fabricManagerState is what the Collector remembers of the fabric
// manager's unit between scans: its restarts within the window, since when
// it is down, and whether a finding's episode is open.
type fabricManagerState struct {
	read      bool   // a reading was taken before
	lastN     uint64 // NRestarts at the previous reading
	lastEnter uint64 // ActiveEnterTimestampMonotonic at the previous reading
	// total counts every restart bcd has seen (never falls), and samples
	// holds its readings of the window, for windowDelta.
	total   uint64
	samples []nvlinkSample
	// downSince is when the unit was first read down, zero while up.
	downSince time.Time
	// trouble is the last time a restart was seen or the unit read down;
	// open reports a finding's episode, which ends once the unit has been
	// up, without a restart, for the window since trouble.
	trouble time.Time
	open    bool
	// last is the last reading taken, at lastAt: a scan whose systemctl
	// fails judges it again for up to the window, so one failed call
	// neither ends an episode nor sends its finding again.
	last   *FabricManager
	lastAt time.Time
}

// judge takes the reading fm at now and returns the fabric manager's
// finding, nil when there is none. The rules (docs/gpu-health.md, "Fabric
// manager"): the unit down (ActiveState other than active or reloading,
// a unit not installed included) for Thresholds.FabricGrace, or restarted
// Thresholds.FabricManagerFlapRestarts times within
// Thresholds.FabricManagerWindow, opens an episode: degraded, ESCALATE
// (the service needs a person: its log, the NVSwitches). The episode ends
// at the first reading up after the unit has stayed up, with no restart,
// for FabricManagerWindow: a flapping service is not cleared by its next
// good reading.
func (s *fabricManagerState) judge(fm *FabricManager, now time.Time, th Thresholds) *finding {
	var restarted uint64
	if s.read {
		switch {
		case fm.Restarts > s.lastN:
			restarted = fm.Restarts - s.lastN
		case fm.ActiveEnterMonotonic != 0 && s.lastEnter != 0 && fm.ActiveEnterMonotonic != s.lastEnter:
			restarted = 1 // started again by hand (NRestarts counts systemd's own restarts only)
		}
	}
	s.read, s.lastN, s.lastEnter = true, fm.Restarts, fm.ActiveEnterMonotonic
	s.total += restarted
	inWindow := windowDelta(&s.samples, s.total, now, th.FabricManagerWindow)

	var down time.Duration
	if fm.Up() {
		s.downSince = time.Time{}
	} else {
		if s.downSince.IsZero() {
			s.downSince = now
		}
		down = now.Sub(s.downSince)
	}
	if restarted > 0 || !fm.Up() {
		s.trouble = now
	}
	flapping := inWindow >= th.FabricManagerFlapRestarts
	if !fm.Up() && down >= th.FabricGrace || flapping {
		s.open = true
	}
	if !s.open {
		return nil
	}
	if fm.Up() && !flapping && now.Sub(s.trouble) >= th.FabricManagerWindow {
		s.open = false
		return nil
	}
	var reason string
	switch {
	case !fm.Up() && fm.LoadState == "not-found":
		reason = fmt.Sprintf("%s not installed (unit not found) for %v", FabricManagerUnit, down.Round(time.Second))
	case !fm.Up():
		reason = fmt.Sprintf("%s not running: %s (%s) for %v", FabricManagerUnit, fm.ActiveState, fm.SubState, down.Round(time.Second))
	case flapping:
		reason = fmt.Sprintf("%s flapping: restarted %d times within %v", FabricManagerUnit, inWindow, th.FabricManagerWindow)
	default:
		reason = fmt.Sprintf("%s up for %v of the %v stabilisation window", FabricManagerUnit,
			now.Sub(s.trouble).Round(time.Second), th.FabricManagerWindow)
	}
	c := *fm
	return &finding{health: HealthDegraded, resolution: xid.Escalate, reason: reason, key: EventKindFabricManager,
		signal: &Event{Kind: EventKindFabricManager, FabricManager: &c, FabricManagerRestarts: inWindow,
			FabricManagerWindow: th.FabricManagerWindow, FabricManagerDownFor: down}}
}

// persistenceFinding judges persistence mode: off is a degraded finding
// calling for IGNORE (no automatic action: the GPU works, but the driver
// may unload between jobs, losing its settings and slowing the next
// start; gpud warns of it too), unless Thresholds.IgnorePersistenceMode.
// It ends at the first scan that reads it on.
func persistenceFinding(on *bool, th Thresholds) []finding {
	if on == nil || *on || th.IgnorePersistenceMode {
		return nil
	}
	return []finding{{health: HealthDegraded, resolution: xid.Ignore, reason: "persistence mode off",
		key: EventKindPersistence, signal: &Event{Kind: EventKindPersistence}}}
}
