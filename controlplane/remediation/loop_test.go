package remediation_test

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/session"
	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/gateway"
	"github.com/better-compute/better-compute/controlplane/internal/clocktest"
	"github.com/better-compute/better-compute/controlplane/pkg/bootstrap"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/pkg/shard"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/pkg/wake"
	"github.com/better-compute/better-compute/controlplane/remediation"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// loop is a real gateway on a real SQLite store with n FakeDaemons
// holding real sessions over TLS, and a reconciler the test steps under
// the shard leases.
type loop struct {
	t       *testing.T
	ctx     context.Context
	st      store.Store
	pool    *store.Pool
	daemons []*sim.FakeDaemon // by node id
	ids     []string
	rec     *remediation.Reconciler
	shards  []int
	// clock is the gateway's: the system clock, watched, so that until
	// steps again each time one of its loops (dispatch, flush: 50 ms)
	// finished a pass.
	clock *clocktest.Real
}

func newLoop(t *testing.T, n int, settings config.Remediation) *loop {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st := sqlitetest.Open(t)
	bundle, err := pki.Init(pki.InitOptions{TrustDomain: "remediation.test"})
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := bootstrap.WriteGatewayCert(bundle, t.TempDir(), []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "default"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	bus := wake.NewBus(nil)
	wakeups, _ := bus.Subscribe()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	clk := clocktest.NewReal()
	gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, Wakeups: wakeups, Clock: clk,
		DispatchInterval: 50 * time.Millisecond, HeartbeatInterval: time.Second, FlushInterval: 50 * time.Millisecond}, st, bundle, log)
	if err != nil {
		t.Fatal(err)
	}
	gwDone := make(chan struct{})
	go func() { defer close(gwDone); _ = gw.Run(ctx) }()
	<-gw.Ready()
	token, _, err := api.CreateJoinToken(ctx, st, bundle.GatewayPin(), pool.ID, time.Hour, n, "remediation", "")
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := sim.NewFleet(sim.FleetConfig{GatewayURL: gw.PublicURL(), Token: token, N: n,
		Session: session.Config{StartJitter: -1, BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := fleet.Join(ctx); err != nil {
		t.Fatal(err)
	}
	fleetDone := make(chan struct{})
	go func() { defer close(fleetDone); _ = fleet.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-fleetDone; <-gwDone })
	wctx, wcancel := context.WithTimeout(ctx, wait)
	defer wcancel()
	if err := fleet.WaitFor(wctx, func(s sim.FleetStats) bool { return s.Connected == n }); err != nil {
		t.Fatal(err)
	}
	l := &loop{t: t, ctx: ctx, st: st, pool: pool, daemons: fleet.Daemons(), clock: clk}
	slices.SortFunc(l.daemons, func(a, b *sim.FakeDaemon) int { return compare(a.NodeID(), b.NodeID()) })
	for _, d := range l.daemons {
		l.ids = append(l.ids, d.NodeID())
		if s := store.ShardOf(d.NodeID()); !slices.Contains(l.shards, s) {
			l.shards = append(l.shards, s)
		}
	}
	slices.Sort(l.shards)
	settings.Interval = config.Duration{Duration: 20 * time.Millisecond}
	if settings.Breaker == (config.RemediationBreaker{}) {
		settings.Breaker.MinNodes = 1000 // the breaker is not what these tests look at
	}
	if settings.VerifySettle.Duration == 0 {
		settings.VerifySettle = config.Duration{Duration: 100 * time.Millisecond}
	}
	if l.rec, err = remediation.New(remediation.Config{Holder: "w1", Settings: settings}, st, log); err != nil {
		t.Fatal(err)
	}
	return l
}

// step runs one pass of the reconciler over the daemons' shards.
func (l *loop) step() {
	l.t.Helper()
	for _, s := range l.shards {
		ls, ok, err := l.st.LeaseAcquire(l.ctx, &store.LeaseAcquireParams{Name: shard.LeaseName(s), Holder: "w1", TTL: time.Minute})
		if err != nil || !ok {
			l.t.Fatalf("lease %d: %v %v", s, ok, err)
		}
		if err := l.rec.Reconcile(l.ctx, s, store.Fence{Lease: ls.Name, Holder: "w1", Epoch: ls.Epoch}); err != nil {
			l.t.Fatalf("reconcile: %v", err)
		}
	}
}

// latest returns node id's case (each test opens at most one per node).
func (l *loop) latest(id string) *store.Remediation {
	list, err := l.st.RemediationList(l.ctx, &store.RemediationListParams{NodeID: id})
	if err != nil {
		l.t.Fatal(err)
	}
	if len(list) == 0 {
		return nil
	}
	return list[len(list)-1]
}

// until steps the reconciler until cond holds, or fails the test.
func (l *loop) until(what string, cond func() bool) {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(l.ctx, wait)
	defer cancel()
	for !cond() {
		l.step()
		// The next step once the gateway has moved on (a dispatch or a
		// flush: what the daemons did reaches the store through them).
		if err := l.clock.Next(ctx); err != nil {
			l.t.Fatalf("not %s after %v", what, wait)
		}
	}
}

// TestLoopOverRealSessions runs the loop over a real gateway on a real
// SQLite store, with FakeDaemons holding real sessions over TLS: each XID
// is raised by the simulator's fault injection (the daemon's own Event,
// classified with bcd's catalogue), the gateway records it, and the reconciler
// (stepped by the test under the shard leases) acts. XID 13 raises its
// event only; XID 48 (ESCALATE) is quarantined and escalated; XID 95
// (RESET_GPU) is quarantined and its gpu.reset command reaches the daemon
// through the gateway, the daemon resets the GPU and the node returns;
// XID 79 (RESTART_BM) is drained, rebooted (the daemon drops its session
// and reconnects with a new boot id), verified and returned.
func TestLoopOverRealSessions(t *testing.T) {
	t.Parallel()
	l := newLoop(t, 5, config.Remediation{})
	ctx, st, daemons, ids, latest, until := l.ctx, l.st, l.daemons, l.ids, l.latest, l.until
	gpu0 := func(d *sim.FakeDaemon) string { return d.Inventory().GetGpus()[0].GetUuid() }
	raise := func(d *sim.FakeDaemon, code uint32) {
		t.Helper()
		if err := d.RaiseXID(0, code); err != nil {
			t.Fatal(err)
		}
	}
	daemons[2].SetRecovery(sim.Recovery{ResetDelay: 200 * time.Millisecond})
	daemons[3].SetRecovery(sim.Recovery{RebootDelay: 300 * time.Millisecond})
	raise(daemons[0], 13) // RESTART_APP
	raise(daemons[1], 48) // WORKFLOW_XID_48: ESCALATE
	raise(daemons[2], 95) // RESET_GPU
	raise(daemons[3], 79) // RESTART_BM

	until("XID 48 escalated, 95 and 79 returned", func() bool {
		a, b, c := latest(ids[1]), latest(ids[2]), latest(ids[3])
		return a != nil && a.State == store.RemediationEscalated && b != nil && b.State == store.RemediationReturned &&
			c != nil && c.State == store.RemediationReturned
	})
	steps := func(id string) []string {
		es, err := st.OutboxQuery(ctx, &store.OutboxQueryParams{Key: id, TopicPrefix: "com.better-compute.remediation.", Ascending: true})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range es {
			out = append(out, e.Topic[len("com.better-compute.remediation."):])
		}
		return out
	}
	full := []string{"detected", "quarantined", "draining", "remediating", "verifying", "returned"}
	for i, kind := range map[int]string{2: sessionv1.KindGPUReset, 3: sessionv1.KindReboot} {
		c := latest(ids[i])
		if got := steps(ids[i]); !slices.Equal(got, full) {
			t.Errorf("%s steps %v, want %v", kind, got, full)
		}
		if len(c.CommandIDs) != 1 {
			t.Fatalf("%s case commands %v", kind, c.CommandIDs)
		}
		cmd, err := st.CommandGet(ctx, c.CommandIDs[0])
		if err != nil {
			t.Fatal(err)
		}
		if cmd.Kind != kind || cmd.NodeID != ids[i] || cmd.State != store.CommandSucceeded {
			t.Errorf("%s: command %s on %s ended %s", kind, cmd.Kind, cmd.NodeID, cmd.State)
		}
		if c.GPUUUID != gpu0(daemons[i]) {
			t.Errorf("%s: case names GPU %q, want %q", kind, c.GPUUUID, gpu0(daemons[i]))
		}
		node, err := st.NodeGet(ctx, ids[i])
		if err != nil {
			t.Fatal(err)
		}
		if node.Cordoned || node.Disruption != "" {
			t.Errorf("%s: returned node cordoned %v disruption %q", kind, node.Cordoned, node.Disruption)
		}
	}
	if s := daemons[2].FaultStats(); s.Resets != 1 || s.Reboots != 0 {
		t.Errorf("XID 95's daemon: %+v, want one reset", s)
	}
	if s := daemons[3].FaultStats(); s.Reboots != 1 || s.Resets != 0 {
		t.Errorf("XID 79's daemon: %+v, want one reboot", s)
	}
	if c := latest(ids[2]); c.XID != 95 || c.XIDMnemonic == "" || c.Resolution != "RESET_GPU" {
		t.Errorf("XID 95's case %+v", c)
	}
	if got := steps(ids[1]); !slices.Equal(got, []string{"detected", "quarantined", "escalated"}) {
		t.Errorf("XID 48 steps %v", got)
	}
	if latest(ids[0]) != nil {
		t.Errorf("XID 13 opened a case: %+v", latest(ids[0]))
	}
	for _, id := range []string{ids[0], ids[4]} {
		node, err := st.NodeGet(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if node.Cordoned || node.Disruption != "" || len(mustCommands(t, st, id)) != 0 {
			t.Errorf("%s touched: cordoned %v disruption %q", id, node.Cordoned, node.Disruption)
		}
	}
	if node, _ := st.NodeGet(ctx, ids[1]); !node.Cordoned || node.Disruption != store.DisruptionQuarantined {
		t.Errorf("XID 48's node: cordoned %v disruption %q", node.Cordoned, node.Disruption)
	}
	gpuEvents, err := st.OutboxQuery(ctx, &store.OutboxQueryParams{Key: gpu0(daemons[0]), TopicPrefix: "com.better-compute.gpu."})
	if err != nil || len(gpuEvents) != 1 {
		t.Errorf("XID 13's gpu.health-changed events: %d, %v", len(gpuEvents), err)
	}
}

func mustCommands(t *testing.T, st store.Store, id string) []*store.Command {
	cmds, err := st.CommandList(context.Background(), &store.CommandListParams{NodeID: id})
	if err != nil {
		t.Fatal(err)
	}
	return cmds
}

const wait = 30 * time.Second

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func terminalState(s string) bool {
	switch s {
	case store.CommandSucceeded, store.CommandFailed, store.CommandCancelled, store.CommandExpired, store.CommandLost:
		return true
	}
	return false
}

// TestBreakerOverRealSessions: 30% of a 20-node pool of FakeDaemons raise
// XID 95 at once, with a breaker of 3 quarantines per window and a
// remediation concurrency of 2: 3 nodes are quarantined and the breaker
// trips; the other 3 cases are recorded and evented (held) but not acted
// on; at most 2 nodes remediate at any moment; no healthy node is touched;
// after an operator resets the breaker the rest are handled and every node
// is back in service.
func TestBreakerOverRealSessions(t *testing.T) {
	t.Parallel()
	l := newLoop(t, 20, config.Remediation{Breaker: config.RemediationBreaker{MinNodes: 3, Window: config.Duration{Duration: time.Hour}}})
	if err := l.st.PoolSetBudget(l.ctx, &store.PoolSetBudgetParams{PoolID: l.pool.ID, RemediationConcurrency: 2}); err != nil {
		t.Fatal(err)
	}
	failing, healthy := l.ids[:6], l.ids[6:]
	for _, d := range l.daemons[:6] {
		d.SetRecovery(sim.Recovery{ResetDelay: 300 * time.Millisecond})
		if err := d.RaiseXID(0, 95); err != nil {
			t.Fatal(err)
		}
	}
	most := 0
	check := func() {
		b, err := l.st.PoolBudget(l.ctx, l.pool.ID)
		if err != nil {
			t.Fatal(err)
		}
		most = max(most, b.Remediating)
		for _, id := range healthy {
			if n, err := l.st.NodeGet(l.ctx, id); err != nil || n.Cordoned || n.Disruption != "" || l.latest(id) != nil {
				t.Fatalf("healthy %s touched: %+v %v", id, n, err)
			}
		}
	}
	count := func(states ...string) int {
		n := 0
		for _, id := range failing {
			if c := l.latest(id); c != nil && slices.Contains(states, c.State) {
				n++
			}
		}
		return n
	}
	l.until("6 cases, 3 held", func() bool {
		check()
		return count(store.RemediationHeld) == 3 && count(store.RemediationOpenStates...) == 6
	})
	bs, err := l.st.RemediationBreakers(l.ctx)
	if err != nil || len(bs) != 1 || bs[0].TrippedAt == nil {
		t.Fatalf("breakers %+v, %v", bs, err)
	}
	// While tripped, the held cases stay held and without commands.
	l.until("the 3 admitted returned", func() bool { check(); return count(store.RemediationReturned) == 3 })
	for _, id := range failing {
		if c := l.latest(id); c.State == store.RemediationHeld && len(mustCommands(t, l.st, id)) != 0 {
			t.Fatalf("held %s has commands", id)
		}
	}
	if count(store.RemediationHeld) != 3 {
		t.Fatalf("held %d after the first 3 returned, want 3", count(store.RemediationHeld))
	}
	if _, err := l.st.RemediationBreakerReset(l.ctx, l.pool.ID, "token:op", nil); err != nil {
		t.Fatal(err)
	}
	l.until("all 6 returned", func() bool { check(); return count(store.RemediationReturned) == 6 })
	if most > 2 {
		t.Errorf("%d nodes remediating at once, want at most 2", most)
	}
	if most < 2 {
		t.Errorf("at most %d remediating at once: the concurrency of 2 was never used", most)
	}
	for _, d := range l.daemons[:6] {
		if s := d.FaultStats(); s.Resets != 1 {
			t.Errorf("%s: %d resets, want 1", d.NodeID(), s.Resets)
		}
	}
	held, err := l.st.OutboxQuery(l.ctx, &store.OutboxQueryParams{TopicPrefix: "com.better-compute.remediation.held", Limit: 100})
	if err != nil || len(held) != 3 {
		t.Errorf("%d remediation.held events, want 3 (%v)", len(held), err)
	}
}

// TestHeldMissingGPUClearsWithoutAction: four nodes of a 20-node pool lose
// a GPU (gpu.missing, a reboot by the default policy) while the breaker
// admits three: the fourth case is held. Its GPU is listed again while it
// is held: the case returns without an action ("cleared while held"), and
// the node is back in service; the admitted ones reboot as before.
func TestHeldMissingGPUClearsWithoutAction(t *testing.T) {
	t.Parallel()
	l := newLoop(t, 20, config.Remediation{Breaker: config.RemediationBreaker{MinNodes: 3, Window: config.Duration{Duration: time.Hour}}})
	failing := l.daemons[:4]
	for _, d := range failing {
		d.SetRecovery(sim.Recovery{RebootDelay: 300 * time.Millisecond})
		if err := d.RemoveGPU(2); err != nil {
			t.Fatal(err)
		}
	}
	var held *sim.FakeDaemon
	l.until("3 cases admitted and 1 held", func() bool {
		n := 0
		held = nil
		for _, d := range failing {
			if c := l.latest(d.NodeID()); c != nil && c.State == store.RemediationHeld {
				held = d
			} else if c != nil && c.State != store.RemediationDetected {
				n++
			}
		}
		return held != nil && n == 3
	})
	if c := l.latest(held.NodeID()); c.Kind != gpufinding.KindGPUMissing || c.Action != config.ActionReboot {
		t.Fatalf("held case: kind %s action %s, want gpu.missing and reboot", c.Kind, c.Action)
	}
	for _, d := range failing {
		if err := d.RestoreGPU(2); err != nil {
			t.Fatal(err)
		}
	}
	l.until("the held case returned", func() bool { return l.latest(held.NodeID()).State == store.RemediationReturned })
	c := l.latest(held.NodeID())
	if !strings.HasPrefix(c.Reason, "cleared while held") || c.Attempts != 0 || len(mustCommands(t, l.st, held.NodeID())) != 0 {
		t.Errorf("held case returned: %q, %d attempts, %d commands; want cleared while held, no action", c.Reason, c.Attempts,
			len(mustCommands(t, l.st, held.NodeID())))
	}
	if s := held.FaultStats(); s.Reboots != 0 {
		t.Errorf("the held node rebooted %d times, want none", s.Reboots)
	}
	if n, err := l.st.NodeGet(l.ctx, held.NodeID()); err != nil || n.Cordoned || n.Disruption != "" {
		t.Errorf("the held node after its case returned: cordoned %v, disruption %q, %v", n.Cordoned, n.Disruption, err)
	}
	l.until("the admitted cases returned", func() bool {
		for _, d := range failing {
			if l.latest(d.NodeID()).State != store.RemediationReturned {
				return false
			}
		}
		return true
	})
}
