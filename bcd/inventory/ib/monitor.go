package ib

import (
	"cmp"
	"context"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/better-compute/better-compute/bcd/inventory/gpu/kmsg"
)

// Health is a port's health, in the words of a GPU's (gpu.Health).
type Health int

// The healths, weakest first.
const (
	HealthOK Health = iota
	HealthDegraded
	HealthFailed
)

// String names h: "ok", "degraded" or "failed".
func (h Health) String() string {
	switch h {
	case HealthDegraded:
		return "degraded"
	case HealthFailed:
		return "failed"
	}
	return "ok"
}

// MarshalText writes h's name.
func (h Health) MarshalText() ([]byte, error) { return []byte(h.String()), nil }

// The causes of a finding (Finding.Cause, InfiniBandSignal.cause).
const (
	CauseDown   = "down"
	CauseErrors = "errors"
	CauseFlap   = "flap"
	CauseMlx5   = "mlx5"
)

// The resolutions of the findings: a link's finding needs hands on the
// cable, transceiver or port (NVIDIA's word, as in the XID catalogue); an
// adapter's firmware error needs a person.
const (
	ResolutionCheckMechanicals = "CHECK_MECHANICALS"
	ResolutionEscalate         = "ESCALATE"
)

// The sources of a finding's evidence, as gpu.Event's.
const (
	SourceScan = "scan"
	SourceKmsg = "kmsg"
)

// Finding is one finding of a port (or, Port 0, of a device from the
// kernel log), to be sent as a typed GPUFinding with an InfiniBandSignal.
type Finding struct {
	// Device, Port and PCIBusID name the port; Device is "" for a kernel-log
	// line of an address no device has.
	Device   string
	Port     int
	PCIBusID string
	// Cause is one of the Cause* constants.
	Cause string
	// State and PhysState are the port's when seen.
	State, PhysState string
	// Errors is the rise of the error counters within Window (CauseErrors).
	Errors uint64
	// Window is the error window (CauseErrors) or the stabilisation window
	// (CauseFlap).
	Window time.Duration
	// LinkDowned is how much link_downed rose at the flap that started the
	// episode (CauseFlap).
	LinkDowned uint64
	// Health and Resolution are what the finding implies while it holds.
	Health     Health
	Resolution string
	// Source is SourceScan or SourceKmsg; LogLine the kernel's line for
	// SourceKmsg.
	Source  string
	LogLine string
	// Counters are the port's counters when seen (SourceScan).
	Counters map[string]uint64
	// Message is one line for people.
	Message string
	// Time is when it was seen (a kernel-log line: when it was logged).
	Time time.Time
}

// Thresholds are the limits of the judgement, the control plane's
// gpuHealth.ib* and gpuHealth.logFindingHold (sent in Welcome). A zero
// field keeps the default.
type Thresholds struct {
	// ErrorThreshold is the rise of the error counters within ErrorWindow
	// that degrades a port. Default 10 (our heuristic: 0 on a healthy
	// link).
	ErrorThreshold uint64
	// ErrorWindow defaults to 10 min.
	ErrorWindow time.Duration
	// FlapWindow is the stabilisation window of a flap episode. Default
	// 5 min (our heuristic).
	FlapWindow time.Duration
	// DownGrace is how long a port that was up may stay down before it is
	// a finding. Default 1 min (our heuristic).
	DownGrace time.Duration
	// LogHold is how long an mlx5 kernel-log finding holds after its last
	// line (gpuHealth.logFindingHold). Default 10 min.
	LogHold time.Duration
}

// DefaultThresholds are the Thresholds a zero field stands for.
var DefaultThresholds = Thresholds{ErrorThreshold: 10, ErrorWindow: 10 * time.Minute, FlapWindow: 5 * time.Minute,
	DownGrace: time.Minute, LogHold: 10 * time.Minute}

func (t Thresholds) withDefaults() Thresholds {
	d := DefaultThresholds
	t.ErrorThreshold = cmp.Or(t.ErrorThreshold, d.ErrorThreshold)
	t.ErrorWindow = cmp.Or(max(t.ErrorWindow, 0), d.ErrorWindow)
	t.FlapWindow = cmp.Or(max(t.FlapWindow, 0), d.FlapWindow)
	t.DownGrace = cmp.Or(max(t.DownGrace, 0), d.DownGrace)
	t.LogHold = cmp.Or(max(t.LogHold, 0), d.LogHold)
	return t
}

// Config configures a Monitor. Zero values take the defaults.
type Config struct {
	// SysFS is the sysfs root. Defaults to os.DirFS("/sys").
	SysFS fs.FS
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// BootTime returns when the machine booted, on Now's clock, to date
	// kernel-log records. Defaults to kmsg.BootTime(Now()).
	BootTime func() time.Time
	// Thresholds are the starting thresholds (SetThresholds replaces
	// them).
	Thresholds Thresholds
}

// Monitor reads the ports and keeps their history between Collects. It is
// safe for concurrent use.
type Monitor struct {
	sysfs fs.FS
	now   func() time.Time
	boot  func() time.Time

	mu    sync.Mutex
	th    Thresholds
	ports map[string]*portState // by Port.Key
	byPCI map[string]string     // device by PCI address, from the last Collect
	mlx5  map[string]heldLine   // held kernel-log findings by device (or address) and severity
}

// portState is what a Monitor remembers of a port.
type portState struct {
	seen       bool
	up         bool // at the last Collect
	everUp     bool // since the Monitor started
	linkDowned uint64
	unread     uint8     // Port.Unread at the last Collect
	downSince  time.Time // first Collect that read it down after it was up; zero while up
	downFound  bool      // the down finding holds
	errs       []sample  // error totals in the window
	flapStart  time.Time // the open episode's first flap; zero when none
	flapLast   time.Time
	flapFirst  Finding  // the open episode's finding
	reported   []string // the finding keys of the last Collect
}

type sample struct {
	at    time.Time
	total uint64
}

type heldLine struct {
	at   time.Time
	line string
	sev  string
	dev  string
	addr string
}

// New returns a Monitor for cfg.
func New(cfg Config) *Monitor {
	if cfg.SysFS == nil {
		cfg.SysFS = os.DirFS("/sys")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.BootTime == nil {
		now := cfg.Now
		cfg.BootTime = func() time.Time { return kmsg.BootTime(now()) }
	}
	return &Monitor{sysfs: cfg.SysFS, now: cfg.Now, boot: cfg.BootTime, th: cfg.Thresholds.withDefaults(),
		ports: map[string]*portState{}, byPCI: map[string]string{}, mlx5: map[string]heldLine{}}
}

// SetThresholds replaces the thresholds (zero fields keep the defaults);
// the next Collect and kernel-log line use them.
func (m *Monitor) SetThresholds(t Thresholds) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.th = t.withDefaults()
}

// Thresholds returns the thresholds in force.
func (m *Monitor) Thresholds() Thresholds {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.th
}

// Collect reads the ports (Read) and judges each against its history: its
// Health, HealthReasons and Resolution, and the NewFindings to send. It
// fails only when ctx is done or the class directory cannot be listed.
func (m *Monitor) Collect(ctx context.Context) ([]Port, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("collect InfiniBand ports: %w", err)
	}
	ports, err := Read(m.sysfs)
	if err != nil {
		return nil, fmt.Errorf("collect InfiniBand ports: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	live := make(map[string]bool, len(ports))
	clear(m.byPCI)
	for i := range ports {
		p := &ports[i]
		live[p.Key()] = true
		if p.PCIBusID != "" {
			m.byPCI[p.PCIBusID] = p.Device
		}
		st := m.ports[p.Key()]
		if st == nil {
			st = &portState{}
			m.ports[p.Key()] = st
		}
		m.judge(p, st, now)
	}
	for k := range m.ports {
		if !live[k] {
			delete(m.ports, k)
		}
	}
	for k, h := range m.mlx5 {
		if now.Sub(h.at) > m.th.LogHold {
			delete(m.mlx5, k)
		}
	}
	for i := range ports {
		m.mlx5Health(&ports[i])
	}
	return ports, nil
}

// keyed is a finding that holds, with the key it is reported by.
type keyed struct {
	key string
	f   Finding
}

// judge updates st with p's reading at now and sets p's health and new
// findings.
func (m *Monitor) judge(p *Port, st *portState, now time.Time) {
	th := m.th
	up := p.Up()
	base := Finding{Device: p.Device, Port: p.Port, PCIBusID: p.PCIBusID, State: p.State, PhysState: p.PhysState,
		Health: HealthDegraded, Resolution: ResolutionCheckMechanicals, Source: SourceScan, Counters: p.Counters.Map(), Time: now}
	var fs []keyed

	// Flaps: the episode ends FlapWindow after its last flap; a flap is
	// link_downed rising on a port up now, or a port up again within
	// DownGrace of going down. A port that came back after its down
	// finding recovered; it did not flap. A flap seen at this scan
	// happened after the last one, so it continues an open episode even
	// when the scans are FlapWindow or more apart: the episode ends only
	// at a scan that sees no flap.
	//
	// A scan that could not read the port's states (a file missing or
	// malformed) judges neither a flap nor a drop, and leaves the history
	// as it was; one that could not read link_downed, or read the counters
	// unlike the last scan (Port.Unread), judges no rise of them.
	known := p.StateNum != 0 && p.PhysStateNum != 0
	sameCounters := st.seen && p.Unread == st.unread
	flapped := false
	if st.seen && known {
		var rose uint64
		if sameCounters && p.Unread&1 == 0 && p.Counters.LinkDowned > st.linkDowned {
			rose = p.Counters.LinkDowned - st.linkDowned
		}
		if up && !st.downFound && (rose > 0 || (!st.up && st.everUp)) {
			flapped = true
			if st.flapStart.IsZero() {
				st.flapStart = now
				f := base
				f.Cause, f.Window, f.LinkDowned = CauseFlap, th.FlapWindow, rose
				f.Message = fmt.Sprintf("InfiniBand port %s flapped (link_downed +%d); the episode ends after %v without another flap",
					p.Key(), rose, th.FlapWindow)
				st.flapFirst = f
			}
			st.flapLast = now
		}
	}
	if !flapped && !st.flapStart.IsZero() && now.Sub(st.flapLast) >= th.FlapWindow {
		st.flapStart = time.Time{}
	}
	if !st.flapStart.IsZero() {
		fs = append(fs, keyed{key: CauseFlap + "/" + strconv.FormatInt(st.flapStart.UnixNano(), 10), f: st.flapFirst})
	}

	// Down: a port that was up, down for DownGrace.
	switch {
	case !known:
		if st.downFound {
			f := base
			f.Cause, f.Message = CauseDown, fmt.Sprintf("InfiniBand port %s is down and its state unreadable", p.Key())
			fs = append(fs, keyed{key: CauseDown, f: f})
		}
	case up:
		st.downSince, st.downFound = time.Time{}, false
		st.everUp = true
	case st.everUp:
		if st.downSince.IsZero() {
			st.downSince = now
		}
		if now.Sub(st.downSince) >= th.DownGrace {
			st.downFound = true
			f := base
			f.Cause = CauseDown
			f.Message = fmt.Sprintf("InfiniBand port %s is down (%s, %s) for %v after having been up", p.Key(), p.State,
				p.PhysState, now.Sub(st.downSince).Round(time.Second))
			fs = append(fs, keyed{key: CauseDown, f: f})
		}
	}

	// Errors: the rise of the error total within ErrorWindow, counted
	// again from this scan when the counters read differently from the
	// last one (a file unreadable reads 0, which is no fall and no rise).
	if !sameCounters {
		st.errs = nil
	}
	if d := windowDelta(&st.errs, p.Counters.errorTotal(), now, th.ErrorWindow); d >= th.ErrorThreshold {
		f := base
		f.Cause, f.Errors, f.Window = CauseErrors, d, th.ErrorWindow
		f.Message = fmt.Sprintf("InfiniBand port %s: error counters rose by %d within %v", p.Key(), d, th.ErrorWindow)
		fs = append(fs, keyed{key: CauseErrors, f: f})
	}

	if known {
		st.seen, st.up = true, up
		if p.Unread&1 == 0 {
			st.linkDowned = p.Counters.LinkDowned
		}
	}
	st.unread = p.Unread
	keys := make([]string, 0, len(fs))
	for _, k := range fs {
		keys = append(keys, k.key)
		p.add(k.f)
		if !slices.Contains(st.reported, k.key) {
			p.NewFindings = append(p.NewFindings, k.f)
		}
	}
	st.reported = keys
}

// add makes f one of p's health's causes.
func (p *Port) add(f Finding) {
	p.Health = max(p.Health, f.Health)
	p.HealthReasons = append(p.HealthReasons, reason(f))
	if rank(f.Resolution) > rank(p.Resolution) {
		p.Resolution = f.Resolution
	}
}

func reason(f Finding) string {
	switch f.Cause {
	case CauseDown:
		return "port down after having been up"
	case CauseErrors:
		return fmt.Sprintf("error counters rose by %d within %v", f.Errors, f.Window)
	case CauseFlap:
		return "link flapping"
	}
	return "mlx5_core error"
}

// rank orders the resolutions of this package: ESCALATE (a person) over
// CHECK_MECHANICALS, as xid.Rank does.
func rank(r string) int {
	switch r {
	case ResolutionCheckMechanicals:
		return 1
	case ResolutionEscalate:
		return 2
	}
	return 0
}

// windowDelta adds total at now to samples and returns its rise since the
// newest sample at or before the window's start (the oldest one kept); a
// fall starts the window again (gpu's NVLink and PCIe replay rule).
func windowDelta(samples *[]sample, total uint64, now time.Time, window time.Duration) uint64 {
	s := *samples
	if k := len(s); k > 0 && total < s[k-1].total {
		s = nil
	}
	s = append(s, sample{at: now, total: total})
	start := now.Add(-window)
	for len(s) > 1 && !s[1].at.After(start) {
		s = s[1:]
	}
	*samples = s
	return total - s[0].total
}
