package ib_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/inventory/ib"
)

// fixture is a sysfs tree in a temporary directory.
type fixture struct {
	t    *testing.T
	root string
}

func newFixture(t *testing.T) *fixture { return &fixture{t: t, root: t.TempDir()} }

func (f *fixture) write(rel, content string) {
	f.t.Helper()
	p := filepath.Join(f.root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// port writes a port as the kernel does: "4: ACTIVE\n", "5: LinkUp\n", the
// rate, the link layer and every counter at 0.
func (f *fixture) port(dev string, n int, pci string) {
	f.t.Helper()
	dir := fmt.Sprintf("class/infiniband/%s/ports/%d/", dev, n)
	f.write(fmt.Sprintf("class/infiniband/%s/device/uevent", dev), "DRIVER=mlx5_core\nPCI_CLASS=20700\nPCI_SLOT_NAME="+pci+"\n")
	f.write(dir+"state", "4: ACTIVE\n")
	f.write(dir+"phys_state", "5: LinkUp\n")
	f.write(dir+"rate", "400 Gb/sec (4X NDR)\n")
	f.write(dir+"link_layer", "InfiniBand\n")
	for _, c := range []string{"link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors", "excessive_buffer_overrun_errors"} {
		f.write(dir+"counters/"+c, "0\n")
	}
}

func (f *fixture) set(dev string, n int, file, content string) {
	f.t.Helper()
	f.write(fmt.Sprintf("class/infiniband/%s/ports/%d/%s", dev, n, file), content+"\n")
}

func (f *fixture) down(dev string, n int) {
	f.set(dev, n, "state", "1: DOWN")
	f.set(dev, n, "phys_state", "2: Polling")
}

func (f *fixture) up(dev string, n int) {
	f.set(dev, n, "state", "4: ACTIVE")
	f.set(dev, n, "phys_state", "5: LinkUp")
}

// clock is a settable clock.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time          { return c.now }
func (c *clock) advance(d time.Duration) { c.now = c.now.Add(d) }

var t0 = time.Date(2026, 12, 6, 20, 0, 0, 0, time.UTC)

// monitor is a Monitor of f on a clock at t0, booted an hour before.
func monitor(f *fixture, th ib.Thresholds) (*ib.Monitor, *clock) {
	c := &clock{now: t0}
	return ib.New(ib.Config{SysFS: os.DirFS(f.root), Now: c.Now, Thresholds: th,
		BootTime: func() time.Time { return t0.Add(-time.Hour) }}), c
}

// collect collects and returns the port named key ("mlx5_0/1").
func collect(t *testing.T, m *ib.Monitor, key string) ib.Port {
	t.Helper()
	ports, err := m.Collect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ports {
		if p.Key() == key {
			return p
		}
	}
	t.Fatalf("no port %s among %d", key, len(ports))
	return ib.Port{}
}

func causes(fs []ib.Finding) string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Cause)
	}
	return strings.Join(out, ",")
}

func TestInfiniBandRead(t *testing.T) {
	f := newFixture(t)
	if ports, err := ib.Read(os.DirFS(f.root)); err != nil || ports != nil {
		t.Fatalf("Read without class/infiniband = %v, %v; want no ports and no error", ports, err)
	}
	f.port("mlx5_1", 2, "0000:3B:00.1")
	f.port("mlx5_1", 1, "0000:3B:00.1")
	f.port("mlx5_0", 1, "0000:18:00.0")
	f.set("mlx5_0", 1, "counters/symbol_error", "17")
	f.set("mlx5_0", 1, "counters/link_downed", "3")
	f.set("mlx5_1", 2, "link_layer", "Ethernet")
	f.set("mlx5_1", 2, "state", "garbage")
	ports, err := ib.Read(os.DirFS(f.root))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range ports {
		got = append(got, fmt.Sprintf("%s %s %s/%s %q %s %d/%d", p.Key(), p.PCIBusID, p.State, p.PhysState, p.Rate, p.LinkLayer,
			p.Counters.SymbolError, p.Counters.LinkDowned))
	}
	want := []string{
		`mlx5_0/1 0000:18:00.0 ACTIVE/LinkUp "400 Gb/sec (4X NDR)" InfiniBand 17/3`,
		`mlx5_1/1 0000:3b:00.1 ACTIVE/LinkUp "400 Gb/sec (4X NDR)" InfiniBand 0/0`,
		`mlx5_1/2 0000:3b:00.1 /LinkUp "400 Gb/sec (4X NDR)" Ethernet 0/0`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Read =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !ports[0].Up() || ports[2].Up() {
		t.Errorf("Up: %v %v, want true false", ports[0].Up(), ports[2].Up())
	}

	// Bounded: at most MaxPorts ports over all devices.
	for d := range 10 {
		for n := 1; n <= 8; n++ {
			f.port(fmt.Sprintf("mlx5_%d", d+2), n, "0000:01:00.0")
		}
	}
	if ports, err := ib.Read(os.DirFS(f.root)); err != nil || len(ports) != ib.MaxPorts {
		t.Errorf("Read of 83 ports = %d ports, %v; want %d", len(ports), err, ib.MaxPorts)
	}
}

func TestInfiniBandParsePortErrors(t *testing.T) {
	p, err := ib.ParsePort(ib.RawPort{State: "4: ACTIVE\n", PhysState: "LinkUp", Rate: "100 Gb/sec\x00",
		Counters: map[string]string{"symbol_error": "-1", "port_rcv_errors": "12\n"}})
	if !errors.Is(err, ib.ErrMalformed) {
		t.Fatalf("err = %v, want ErrMalformed", err)
	}
	for _, want := range []string{"phys_state", "rate", "counters/symbol_error"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	if p.State != "ACTIVE" || p.StateNum != 4 || p.PhysState != "" || p.Counters.PortRcvErrors != 12 {
		t.Errorf("what parsed: %+v", p)
	}
}

// TestInfiniBandPortDown: a port that was up and goes down is a finding
// once it has stayed down for the grace, reported once, and it ends at the
// first scan that reads it up (not a flap: it recovered). A port down from
// the start is not judged.
func TestInfiniBandPortDown(t *testing.T) {
	f := newFixture(t)
	f.port("mlx5_0", 1, "0000:18:00.0")
	f.port("mlx5_1", 1, "0000:3b:00.0")
	f.down("mlx5_1", 1)
	m, c := monitor(f, ib.Thresholds{DownGrace: time.Minute})
	if p := collect(t, m, "mlx5_0/1"); p.Health != ib.HealthOK || len(p.NewFindings) != 0 {
		t.Fatalf("an up port: %v %v", p.Health, p.NewFindings)
	}
	if p := collect(t, m, "mlx5_1/1"); p.Health != ib.HealthOK || p.State != "DOWN" {
		t.Fatalf("a port down from the start: %v %s, want ok (not judged) and DOWN", p.Health, p.State)
	}

	// A scan that cannot read the state judges nothing.
	f.set("mlx5_0", 1, "state", "")
	c.advance(5 * time.Minute)
	if p := collect(t, m, "mlx5_0/1"); p.Health != ib.HealthOK || len(p.NewFindings) != 0 || p.State != "" {
		t.Fatalf("state unreadable: %v %v, want ok and no finding", p.Health, p.NewFindings)
	}
	f.down("mlx5_0", 1)
	c.advance(30 * time.Second)
	if p := collect(t, m, "mlx5_0/1"); p.Health != ib.HealthOK || len(p.NewFindings) != 0 {
		t.Fatalf("down within the grace: %v %v, want no finding yet", p.Health, p.NewFindings)
	}
	c.advance(time.Minute) // the grace runs from the first scan that read it down
	p := collect(t, m, "mlx5_0/1")
	if p.Health != ib.HealthDegraded || p.Resolution != ib.ResolutionCheckMechanicals || causes(p.NewFindings) != ib.CauseDown {
		t.Fatalf("down for the grace: %v %s %v, want degraded CHECK_MECHANICALS and one down finding", p.Health, p.Resolution, p.NewFindings)
	}
	if nf := p.NewFindings[0]; nf.State != "DOWN" || nf.PhysState != "Polling" || nf.Device != "mlx5_0" || nf.Port != 1 ||
		nf.PCIBusID != "0000:18:00.0" || nf.Source != ib.SourceScan || nf.Message == "" {
		t.Errorf("down finding = %+v", nf)
	}
	c.advance(time.Minute)
	if p := collect(t, m, "mlx5_0/1"); p.Health != ib.HealthDegraded || len(p.NewFindings) != 0 {
		t.Fatalf("still down: %v %v, want degraded and nothing new", p.Health, p.NewFindings)
	}
	f.up("mlx5_0", 1)
	f.set("mlx5_0", 1, "counters/link_downed", "1")
	c.advance(time.Minute)
	if p := collect(t, m, "mlx5_0/1"); p.Health != ib.HealthOK || len(p.NewFindings) != 0 || len(p.HealthReasons) != 0 {
		t.Fatalf("back up: %v %v %v, want ok and no flap", p.Health, p.NewFindings, p.HealthReasons)
	}
}

// TestInfiniBandErrorCounters: the error counters rising past the
// threshold within the window is a finding, which ends once the window has
// passed without such a rise and comes back (reported again) with the
// next one; a counter that falls (cleared) starts the window again.
func TestInfiniBandErrorCounters(t *testing.T) {
	f := newFixture(t)
	f.port("mlx5_0", 1, "0000:18:00.0")
	m, c := monitor(f, ib.Thresholds{ErrorThreshold: 10, ErrorWindow: 10 * time.Minute})
	collect(t, m, "mlx5_0/1")
	f.set("mlx5_0", 1, "counters/symbol_error", "5")
	c.advance(time.Minute)
	if p := collect(t, m, "mlx5_0/1"); p.Health != ib.HealthOK {
		t.Fatalf("a rise of 5: %v, want ok", p.Health)
	}
	f.set("mlx5_0", 1, "counters/port_rcv_errors", "3")
	f.set("mlx5_0", 1, "counters/link_error_recovery", "2")
	c.advance(time.Minute)
	p := collect(t, m, "mlx5_0/1")
	if p.Health != ib.HealthDegraded || causes(p.NewFindings) != ib.CauseErrors {
		t.Fatalf("a rise of 10: %v %v, want degraded and one errors finding", p.Health, p.NewFindings)
	}
	if nf := p.NewFindings[0]; nf.Errors != 10 || nf.Window != 10*time.Minute || nf.Counters["symbol_error"] != 5 ||
		nf.Counters["port_rcv_errors"] != 3 {
		t.Errorf("errors finding = %+v", nf)
	}
	c.advance(5 * time.Minute)
	if p := collect(t, m, "mlx5_0/1"); p.Health != ib.HealthDegraded || len(p.NewFindings) != 0 {
		t.Fatalf("within the window: %v %v, want degraded, nothing new", p.Health, p.NewFindings)
	}
	c.advance(10 * time.Minute)
	if p := collect(t, m, "mlx5_0/1"); p.Health != ib.HealthOK {
		t.Fatalf("the window passed without a rise: %v %v, want ok", p.Health, p.HealthReasons)
	}
	f.set("mlx5_0", 1, "counters/excessive_buffer_overrun_errors", "40")
	c.advance(time.Minute)
	if p := collect(t, m, "mlx5_0/1"); p.Health != ib.HealthDegraded || causes(p.NewFindings) != ib.CauseErrors {
		t.Fatalf("a new rise: %v %v, want a new errors finding", p.Health, p.NewFindings)
	}
	// Cleared counters (a fall) start the window again: no rise.
	for _, n := range []string{"symbol_error", "port_rcv_errors", "link_error_recovery", "excessive_buffer_overrun_errors"} {
		f.set("mlx5_0", 1, "counters/"+n, "0")
	}
	c.advance(time.Minute)
	if p := collect(t, m, "mlx5_0/1"); p.Health != ib.HealthOK {
		t.Fatalf("counters cleared: %v, want ok", p.Health)
	}
}

// TestInfiniBandFlapEpisode: a flapping port gives one finding per flap
// episode; flaps within the stabilisation window keep the episode open
// (nothing new sent), and it ends FlapWindow after its last flap (no
// stickiness past it); a flap after that is a new episode, a new finding.
// A port seen down and up again within the down grace flapped too.
func TestInfiniBandFlapEpisode(t *testing.T) {
	f := newFixture(t)
	f.port("mlx5_0", 1, "0000:18:00.0")
	m, c := monitor(f, ib.Thresholds{FlapWindow: 5 * time.Minute, DownGrace: time.Minute})
	collect(t, m, "mlx5_0/1")

	var found int
	step := func(d time.Duration, linkDowned int, want ib.Health) ib.Port {
		t.Helper()
		f.set("mlx5_0", 1, "counters/link_downed", fmt.Sprint(linkDowned))
		c.advance(d)
		p := collect(t, m, "mlx5_0/1")
		found += len(p.NewFindings)
		if p.Health != want {
			t.Fatalf("at %v link_downed %d: %v (%v), want %v", c.now.Sub(t0), linkDowned, p.Health, p.HealthReasons, want)
		}
		return p
	}
	p := step(time.Minute, 1, ib.HealthDegraded)
	if causes(p.NewFindings) != ib.CauseFlap || p.NewFindings[0].LinkDowned != 1 || p.NewFindings[0].Window != 5*time.Minute {
		t.Fatalf("first flap: %+v, want one flap finding", p.NewFindings)
	}
	step(2*time.Minute, 2, ib.HealthDegraded)
	step(2*time.Minute, 4, ib.HealthDegraded)
	step(4*time.Minute, 4, ib.HealthDegraded) // 4 min after the last flap: still open
	step(time.Minute, 4, ib.HealthOK)         // 5 min: the episode ends
	if found != 1 {
		t.Fatalf("one episode of three flaps gave %d findings, want 1", found)
	}
	step(10*time.Minute, 4, ib.HealthOK)
	p = step(time.Minute, 5, ib.HealthDegraded)
	if found != 2 || causes(p.NewFindings) != ib.CauseFlap {
		t.Fatalf("a flap after the episode ended: %d findings so far (%v), want a second one", found, p.NewFindings)
	}
	step(6*time.Minute, 5, ib.HealthOK)

	// Down at one scan, up at the next within the grace: a flap, even when
	// link_downed does not say so (a saturated counter).
	f.down("mlx5_0", 1)
	step(time.Minute, 5, ib.HealthOK)
	f.up("mlx5_0", 1)
	p = step(30*time.Second, 5, ib.HealthDegraded)
	if found != 3 || causes(p.NewFindings) != ib.CauseFlap {
		t.Fatalf("down and up within the grace: %v, want a third flap finding", p.NewFindings)
	}
	step(5*time.Minute, 5, ib.HealthOK)
}

// TestInfiniBandMlx5KernelLog: an mlx5_core error line for a device's PCI
// address is a finding of that device (sent once per episode, not for a
// line older than the hold), degrading or failing its ports until the hold
// has passed after the last line.
func TestInfiniBandMlx5KernelLog(t *testing.T) {
	f := newFixture(t)
	f.port("mlx5_0", 1, "0000:3b:00.0")
	f.port("mlx5_1", 1, "0000:86:00.0")
	m, c := monitor(f, ib.Thresholds{LogHold: 10 * time.Minute})
	collect(t, m, "mlx5_0/1")
	// Records are dated boot (t0 - 1h) + USEC: 3600 s is t0.
	rec := func(at time.Duration, msg string) string {
		return fmt.Sprintf("3,100,%d,-;%s", (time.Hour + at).Microseconds(), msg)
	}
	const fatal = "mlx5_core 0000:3b:00.0: poll_health:802:(pid 0): Fatal error 1 detected"
	if _, ok := m.KernelRecord(rec(-11*time.Minute, fatal)); ok {
		t.Error("a line older than the hold (the look-back's history) was sent")
	}
	if _, ok := m.KernelRecord(rec(0, "mlx5_core 0000:3b:00.0: mlx5e_update_carrier:2345:(pid 77): Link up")); ok {
		t.Error("a line that is no error was sent")
	}
	nf, ok := m.KernelRecord(rec(0, fatal))
	if !ok || nf.Device != "mlx5_0" || nf.Port != 0 || nf.Cause != ib.CauseMlx5 || nf.Health != ib.HealthFailed ||
		nf.Resolution != ib.ResolutionEscalate || nf.Source != ib.SourceKmsg || nf.LogLine != fatal || !nf.Time.Equal(t0) {
		t.Fatalf("fatal line: %+v, %v", nf, ok)
	}
	c.advance(2 * time.Minute)
	if _, ok := m.KernelRecord(rec(2*time.Minute, fatal)); ok {
		t.Error("a second line within the hold was sent: want one finding per episode")
	}
	if p := collect(t, m, "mlx5_0/1"); p.Health != ib.HealthFailed || p.Resolution != ib.ResolutionEscalate {
		t.Fatalf("mlx5_0's port: %v %s, want failed ESCALATE", p.Health, p.Resolution)
	}
	if p := collect(t, m, "mlx5_1/1"); p.Health != ib.HealthOK {
		t.Fatalf("another device's port: %v, want ok", p.Health)
	}
	nf, ok = m.KernelRecord(rec(2*time.Minute, "mlx5_core 0000:99:00.0: print_health_info:424:(pid 0): synd 0x1: firmware internal error"))
	if !ok || nf.Device != "" || nf.PCIBusID != "0000:99:00.0" || nf.Health != ib.HealthDegraded {
		t.Errorf("a line of an unknown address: %+v, %v; want sent, degraded, naming the address", nf, ok)
	}
	c.advance(10 * time.Minute) // 10 min after the last line at 2 min
	if p := collect(t, m, "mlx5_0/1"); p.Health != ib.HealthFailed {
		t.Fatalf("within the hold: %v", p.Health)
	}
	c.advance(time.Second)
	if p := collect(t, m, "mlx5_0/1"); p.Health != ib.HealthOK {
		t.Fatalf("after the hold: %v %v, want ok", p.Health, p.HealthReasons)
	}
	if _, ok := m.KernelRecord(rec(13*time.Minute, fatal)); !ok {
		t.Error("a line after the episode ended was not sent")
	}
}

// FuzzParseIBPort feeds arbitrary text to the port parser: it never
// panics, fills only what parsed, and a state it accepts reads back.
//
//	go test -run '^$' -fuzz FuzzParseIBPort -fuzztime 30s ./bcd/inventory/ib
func FuzzParseIBPort(f *testing.F) {
	f.Add("4: ACTIVE\n", "5: LinkUp\n", "400 Gb/sec (4X NDR)\n", "InfiniBand\n", "17\n")
	f.Add("1: DOWN", "3: Disabled", "10 Gb/sec (4X SDR)", "Ethernet", "18446744073709551615")
	f.Add("", "", "", "", "")
	f.Add("999: X", ":", "\x00", "\xff", "-1")
	f.Fuzz(func(t *testing.T, state, phys, rate, layer, counter string) {
		p, err := ib.ParsePort(ib.RawPort{State: state, PhysState: phys, Rate: rate, LinkLayer: layer,
			Counters: map[string]string{"symbol_error": counter, "link_downed": counter}})
		if err != nil && !errors.Is(err, ib.ErrMalformed) {
			t.Fatalf("error %v does not wrap ErrMalformed", err)
		}
		if p.State != "" {
			q, err := ib.ParsePort(ib.RawPort{State: fmt.Sprintf("%d: %s", p.StateNum, p.State)})
			if err != nil || q.State != p.State || q.StateNum != p.StateNum {
				t.Fatalf("state %d %q does not read back: %+v %v", p.StateNum, p.State, q, err)
			}
		}
		if p.StateNum > 255 || p.PhysStateNum > 255 || strings.ContainsAny(p.Rate+p.LinkLayer, "\n\x00") {
			t.Fatalf("out of bounds: %+v", p)
		}
		if p.Counters.SymbolError != p.Counters.LinkDowned {
			t.Fatalf("one text, two counts: %+v", p.Counters)
		}
	})
}

// TestInfiniBandFlapAtEveryScanIsOneEpisode: scans as far apart as the
// stabilisation window (bcd's default --inventory-interval and
// gpuHealth.ibFlapWindow are both 5 min) that each see link_downed rise
// are one episode: one finding, which ends at the first scan that sees no
// flap FlapWindow after the last.
func TestInfiniBandFlapAtEveryScanIsOneEpisode(t *testing.T) {
	f := newFixture(t)
	f.port("mlx5_0", 1, "0000:18:00.0")
	m, c := monitor(f, ib.Thresholds{FlapWindow: 5 * time.Minute, DownGrace: time.Minute})
	collect(t, m, "mlx5_0/1")
	found := 0
	for i := 1; i <= 6; i++ {
		f.set("mlx5_0", 1, "counters/link_downed", fmt.Sprint(i))
		c.advance(5 * time.Minute)
		p := collect(t, m, "mlx5_0/1")
		found += len(p.NewFindings)
		if p.Health != ib.HealthDegraded {
			t.Fatalf("scan %d, link_downed rising: %v, want degraded", i, p.Health)
		}
	}
	if found != 1 {
		t.Fatalf("six scans 5 min apart, each seeing a flap: %d findings, want 1", found)
	}
	c.advance(5 * time.Minute)
	if p := collect(t, m, "mlx5_0/1"); p.Health != ib.HealthOK || len(p.NewFindings) != 0 {
		t.Fatalf("a scan with no flap 5 min after the last: %v %v, want ok", p.Health, p.NewFindings)
	}
}

// TestInfiniBandUnreadableCounterIsNoRise: a counter file that reads
// garbage (or is missing) for one scan reads as no count, not as 0: the
// next good reading is no flap and no error rise.
func TestInfiniBandUnreadableCounterIsNoRise(t *testing.T) {
	f := newFixture(t)
	f.port("mlx5_0", 1, "0000:18:00.0")
	f.set("mlx5_0", 1, "counters/link_downed", "5")
	f.set("mlx5_0", 1, "counters/symbol_error", "5000")
	m, c := monitor(f, ib.Thresholds{FlapWindow: 5 * time.Minute, DownGrace: time.Minute, ErrorThreshold: 10,
		ErrorWindow: 10 * time.Minute})
	collect(t, m, "mlx5_0/1")
	for _, bad := range []string{"garbage", ""} {
		f.set("mlx5_0", 1, "counters/link_downed", bad)
		f.set("mlx5_0", 1, "counters/symbol_error", bad)
		c.advance(time.Minute)
		if p := collect(t, m, "mlx5_0/1"); p.Health != ib.HealthOK || len(p.NewFindings) != 0 {
			t.Fatalf("counters read %q: %v %v, want ok and nothing new", bad, p.Health, p.NewFindings)
		}
		f.set("mlx5_0", 1, "counters/link_downed", "5")
		f.set("mlx5_0", 1, "counters/symbol_error", "5000")
		c.advance(time.Minute)
		if p := collect(t, m, "mlx5_0/1"); p.Health != ib.HealthOK || len(p.NewFindings) != 0 {
			t.Fatalf("counters readable again after %q: %v %v, want ok and nothing new", bad, p.Health, p.NewFindings)
		}
	}
	// A real rise afterwards is still seen.
	f.set("mlx5_0", 1, "counters/symbol_error", "5020")
	c.advance(time.Minute)
	if p := collect(t, m, "mlx5_0/1"); p.Health != ib.HealthDegraded || causes(p.NewFindings) != ib.CauseErrors {
		t.Fatalf("a rise of 20: %v %v, want one errors finding", p.Health, p.NewFindings)
	}
}

// TestInfiniBandReadSkipsNonRegularFiles: a FIFO where a counter should be
// (a fixture tree; sysfs attributes are regular files) is not opened, so
// a scan does not block on it: the counter is unread, the port still read.
func TestInfiniBandReadSkipsNonRegularFiles(t *testing.T) {
	f := newFixture(t)
	f.port("mlx5_0", 1, "0000:18:00.0")
	fifo := filepath.Join(f.root, "class/infiniband/mlx5_0/ports/1/counters/symbol_error")
	if err := os.Remove(fifo); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skipf("no FIFO on this file system: %v", err)
	}
	ports, err := ib.Read(os.DirFS(f.root))
	if err != nil || len(ports) != 1 || !ports[0].Up() || ports[0].Unread == 0 {
		t.Fatalf("Read with a FIFO counter: %+v, %v; want the port up with a counter unread", ports, err)
	}
}
