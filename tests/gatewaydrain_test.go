package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/tests/testenv"
)

// drainFakeDaemons is how many FakeDaemons TestGatewayDrainOnCommand
// moves beside its real bcd.
const drainFakeDaemons = 20

// drainWindow is host.gateway.drainDelay of splitConfig: the window over
// which a drained gateway's nodes are told to leave.
const drainWindow = 3 * time.Second

// gatewayPickup is the most a gateway takes to read an operator's drain
// from its row: one lease renewal (DESIGN.md, 5 s).
const gatewayPickup = 5 * time.Second

// TestGatewayDrainOnCommand: `gateways drain A` (a CLI call to the API, in
// another process than the gateway) moves every node of gateway A, 20
// FakeDaemons and a real bcd, to gateway B within A's window (plus the
// lease renewal that carries the request and the nodes' reconnects), with
// no session error in any node's log; A stays up, refuses nothing it
// holds, reports drained in `gateways list`, and `gateways undrain A`
// brings it back to up.
func TestGatewayDrainOnCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newSplitDeployment(t, 1, 1)
	a := d.gateways[0]

	m, bcdNode := d.joinMachine("drain-bcd", a)
	bcd := m.node()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("bcd's output:\n%s", bcd.Output())
		}
	})
	d.waitSession(bcdNode, a)

	// The FakeDaemons, their logs kept for the check below.
	logs := &warnings{}
	fleet := d.fleet(t, a, drainFakeDaemons, slog.New(logs))
	nodes := []string{bcdNode}
	for _, fd := range fleet.Daemons() {
		nodes = append(nodes, fd.NodeID())
	}
	for _, id := range nodes {
		d.waitSession(id, a)
	}

	b := d.startGateway("gateway-2")
	drainedAt := time.Now()
	d.cli(t, "gateways", "drain", a.id)
	// Every node moves to B.
	moved := map[string]time.Duration{}
	eventually(t, gatewayPickup+drainWindow+60*time.Second, func() bool {
		for _, id := range nodes {
			if _, ok := moved[id]; ok {
				continue
			}
			if s, err := d.st.SessionGet(ctx, id); err == nil && s.GatewayID == b.id {
				moved[id] = time.Since(drainedAt)
			}
		}
		return len(moved) == len(nodes)
	}, func() string { return fmt.Sprintf("%d of %d nodes moved to %s", len(moved), len(nodes), b.name) })
	var first, last time.Duration = time.Hour, 0
	for _, took := range moved {
		first, last = min(first, took), max(last, took)
	}
	// The window runs from when A read the request (its log line's time),
	// not from the call: the request waits up to one lease renewal.
	at := a.p.WaitLine(`time=(\S+) level=INFO msg="Gateway draining on command"`, 10*time.Second)[1]
	pickedUp, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		t.Fatalf("the gateway's drain line time %q: %v", at, err)
	}
	pickup := pickedUp.Sub(drainedAt)
	t.Logf("%d nodes (%d FakeDaemons and a real bcd) moved off the drained gateway: the gateway took the drain %v after the call; nodes moved %v to %v after it (window %v)",
		len(nodes), drainFakeDaemons, pickup.Round(time.Millisecond), (first - pickup).Round(time.Millisecond), (last - pickup).Round(time.Millisecond), drainWindow)
	if pickup > gatewayPickup+5*time.Second {
		t.Errorf("the gateway took the drain %v after the call, want within one lease renewal (%v) and a margin", pickup, gatewayPickup)
	}
	// The window, and a reconnect on a busy machine (the moves are seen
	// by polling every 100 ms).
	if bound := drainWindow + 10*time.Second; last-pickup > bound {
		t.Errorf("the last node moved %v after the gateway took the drain, want within its %v window and a reconnect (%v)", last-pickup, drainWindow, bound)
	}

	// A is up (its process runs, its row is live) and reports drained.
	eventually(t, 30*time.Second, func() bool { return d.gatewayState(t, a.id) == "drained" },
		func() string { return a.name + " is " + d.gatewayState(t, a.id) + ", want drained" })
	select {
	case <-a.p.Done():
		t.Fatalf("%s exited during the drain, want it up:\n%s", a.name, a.p.Output())
	default:
	}

	// No session error in the nodes' logs.
	if w := logs.get(); len(w) > 0 {
		t.Errorf("the FakeDaemons logged %d warnings or errors during the drain:\n%s", len(w), strings.Join(w, "\n"))
	}
	for _, line := range strings.Split(bcd.Output(), "\n") {
		if strings.Contains(line, "level=ERROR") || strings.Contains(line, "Session with gateway ended") {
			t.Errorf("bcd logged a session error: %s", line)
		}
	}
	if !strings.Contains(bcd.Output(), "Session drained, reconnecting elsewhere") {
		t.Error("bcd did not log its drain: the test would not show it moved by Drain")
	}

	// Undrain: A takes sessions again.
	d.cli(t, "gateways", "undrain", a.id)
	eventually(t, 30*time.Second, func() bool { return d.gatewayState(t, a.id) == "up" },
		func() string { return a.name + " is " + d.gatewayState(t, a.id) + ", want up" })
}

// fleet joins n FakeDaemons through g with a pool of their own and runs
// them until the test ends, logging to log; it returns once each holds a
// session.
func (d *splitDeployment) fleet(t *testing.T, g *splitProc, n int, log *slog.Logger) *sim.Fleet {
	t.Helper()
	ctx := context.Background()
	site, err := d.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "fleet-" + g.name, Region: "default"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := d.st.PoolCreate(ctx, &store.PoolCreateParams{Name: "fleet-" + g.name, SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := bootstrap.LoadBundle(ctx, d.st, testSecret)
	if err != nil {
		t.Fatal(err)
	}
	token, _, err := api.CreateJoinToken(ctx, d.st, bundle.GatewayPin(), pool.ID, time.Hour, n, "e2e fleet", "")
	if err != nil {
		t.Fatal(err)
	}
	f, err := sim.NewFleet(sim.FleetConfig{GatewayURL: g.url, Token: token, N: n, NamePrefix: "drain", Logger: log,
		Session: session.Config{StartJitter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	jctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := f.Join(jctx); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	if err := f.WaitFor(jctx, func(s sim.FleetStats) bool { return s.Connected >= n }); err != nil {
		t.Fatalf("%d of %d FakeDaemons hold a session: %v", f.Stats().Connected, n, err)
	}
	return f
}

// cli runs the better-compute CLI against the deployment's API as its
// admin and returns its standard output; a non-zero exit fails the test.
func (d *splitDeployment) cli(t *testing.T, args ...string) string {
	t.Helper()
	code, stdout, stderr := testenv.Run(t, nil, "", d.bin, append(args, "--server", d.api, "--token", d.admin.Token)...)
	if code != 0 {
		t.Fatalf("better-compute %s: exit %d\n%s%s", strings.Join(args, " "), code, stdout, stderr)
	}
	return stdout
}

// gatewayState is gateway id's state as `gateways list -o json` shows it.
func (d *splitDeployment) gatewayState(t *testing.T, id string) string {
	t.Helper()
	var out struct {
		Gateways []struct {
			ID    string `json:"id"`
			State string `json:"state"`
		} `json:"gateways"`
	}
	if err := json.Unmarshal([]byte(d.cli(t, "gateways", "list", "-o", "json")), &out); err != nil {
		t.Fatal(err)
	}
	for _, g := range out.Gateways {
		if g.ID == id {
			return g.State
		}
	}
	return "absent"
}

// warnings is a slog.Handler that keeps every record at WARN or above.
type warnings struct {
	mu    sync.Mutex
	lines []string
	attrs []slog.Attr
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s", r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s", a); return true })
	w.mu.Lock()
	defer w.mu.Unlock()
	w.lines = append(w.lines, b.String())
	return nil
}

func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }

func (w *warnings) get() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.lines...)
}
