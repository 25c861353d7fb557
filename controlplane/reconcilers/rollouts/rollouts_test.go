package rollouts_test

import (
	"context"
	"encoding/json"
	"fmt"
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
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/pkg/shard"
	"github.com/better-compute/better-compute/controlplane/pkg/sim"
	"github.com/better-compute/better-compute/controlplane/pkg/wake"
	"github.com/better-compute/better-compute/controlplane/reconcilers/rollouts"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// Each test runs a real gateway on a real SQLite store with FakeDaemons
// holding real sessions over TLS; the reconciler is stepped by the test
// under a shard lease it holds, with compressed soaks and timeouts.

const wait = 30 * time.Second

// testMinExtension is the reconcilers' rollouts.Config.MinExtension: the
// tests' soaks are milliseconds, so an inconclusive gate's extension is
// too (DefaultMinExtension would add a second to every wave).
const testMinExtension = 100 * time.Millisecond

const (
	versionA = sim.Version
	versionB = "0.9.0"
)

type env struct {
	t       *testing.T
	st      store.Store
	pool    *store.Pool
	fleet   *sim.Fleet
	daemons map[string]*sim.FakeDaemon // by node id
	ids     []string
	// clock is the gateway's: the system clock, watched, so that a wait
	// wakes each time one of its loops (dispatch, flush: 50 ms) finished a
	// pass.
	clock *clocktest.Real
}

func newEnv(t *testing.T, n int) *env {
	t.Helper()
	return newEnvWith(t, n, false)
}

// newEnvWith is newEnv whose daemons send their inventory (their GPUs'
// health) when withInventory is set.
func newEnvWith(t *testing.T, n int, withInventory bool) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st := sqlitetest.Open(t)
	bundle, err := pki.Init(pki.InitOptions{TrustDomain: "rollouts.test"})
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
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	clk := clocktest.NewReal()
	gw, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile, Wakeups: wakeups, Clock: clk,
		DispatchInterval: 50 * time.Millisecond, HeartbeatInterval: time.Second, FlushInterval: 50 * time.Millisecond}, st, bundle, log)
	if err != nil {
		t.Fatal(err)
	}
	gwDone := make(chan struct{})
	go func() { defer close(gwDone); _ = gw.Run(ctx) }()
	<-gw.Ready()
	token, _, err := api.CreateJoinToken(ctx, st, bundle.GatewayPin(), pool.ID, time.Hour, n, "rollouts", "")
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := sim.NewFleet(sim.FleetConfig{GatewayURL: gw.PublicURL(), Token: token, N: n, NoInventory: !withInventory,
		Session: session.Config{StartJitter: -1, BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if err := fleet.Join(ctx); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, st: st, pool: pool, fleet: fleet, daemons: map[string]*sim.FakeDaemon{}, clock: clk}
	for _, d := range fleet.Daemons() {
		d.SetRestartDelay(20 * time.Millisecond)
		e.daemons[d.NodeID()] = d
		e.ids = append(e.ids, d.NodeID())
	}
	slices.Sort(e.ids)
	fleetDone := make(chan struct{})
	go func() { defer close(fleetDone); _ = fleet.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-fleetDone; <-gwDone })
	wctx, wcancel := context.WithTimeout(ctx, wait)
	defer wcancel()
	if err := fleet.WaitFor(wctx, func(s sim.FleetStats) bool { return s.Connected == n }); err != nil {
		t.Fatal(err)
	}
	return e
}

// mustV panics on err (a test helper: the tests call it only from their
// own goroutine, where the panic fails the test with the error).
func mustV[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func (e *env) create(p store.RolloutCreateParams) *store.Rollout {
	e.t.Helper()
	p.PoolID = e.pool.ID
	if p.Version == "" {
		p.Version = versionB
	}
	p.BaseURL = "https://downloads.invalid/api/downloads"
	if p.Canary == 0 {
		p.Canary = 1
	}
	p.Wave = cmpStr(p.Wave, "2")
	p.MaxUnavailable = cmpStr(p.MaxUnavailable, p.Wave)
	if p.Timeout == 0 {
		p.Timeout = 5 * time.Second
	}
	return mustV(e.st.RolloutCreate(context.Background(), &p))
}

func cmpStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// worker is one reconciler holding the rollout's shard lease.
type worker struct {
	r     *rollouts.Reconciler
	fence store.Fence
	shard int
}

func (e *env) worker(holder string, ro *store.Rollout, now *time.Time) *worker {
	e.t.Helper()
	n := store.ShardOf(ro.ID)
	l, ok, err := e.st.LeaseAcquire(context.Background(), &store.LeaseAcquireParams{Name: shard.LeaseName(n), Holder: holder, TTL: time.Minute, Now: now})
	if err != nil || !ok {
		e.t.Fatalf("lease for %s: %v %v", holder, ok, err)
	}
	r := rollouts.New(rollouts.Config{MinExtension: testMinExtension}, e.st, slog.New(slog.NewTextHandler(e.t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo})))
	return &worker{r: r, shard: n, fence: store.Fence{Lease: l.Name, Holder: l.Holder, Epoch: l.Epoch}}
}

// step runs one round of w.
func (w *worker) step(t *testing.T) error {
	ctx := context.Background()
	due, err := w.r.Due(ctx, time.Now(), []int{w.shard})
	if err != nil || !slices.Contains(due, w.shard) {
		return err
	}
	return w.r.Reconcile(ctx, w.shard, w.fence)
}

// until steps w until cond holds on the rollout, or fails the test.
func (e *env) until(w *worker, ro *store.Rollout, what string, cond func(*store.Rollout) bool) *store.Rollout {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for {
		if err := w.step(e.t); err != nil {
			e.t.Fatalf("step: %v", err)
		}
		cur := mustV(e.st.RolloutGet(context.Background(), ro.ID))
		if cond(cur) {
			return cur
		}
		// The next step once the gateway has moved on (a dispatch or a
		// flush: what the daemons did reaches the store through them).
		if err := e.clock.Next(ctx); err != nil {
			e.t.Fatalf("rollout %s not %s after %v: state %s wave %d reason %q; nodes %s", ro.ID, what, wait, cur.State, cur.CurrentWave, cur.Reason, e.nodeStates(ro))
		}
	}
}

func (e *env) nodeStates(ro *store.Rollout) string {
	s := ""
	for _, n := range mustV(e.st.RolloutNodes(context.Background(), ro.ID)) {
		s += fmt.Sprintf("\n  %s wave %d %s (%s) v%s conn=%v up=%s %q", n.NodeID, n.Wave, n.State, n.NodeState, n.BCDVersion, n.Connected, n.UpgradeState, n.Reason)
	}
	return s
}

func state(s string) func(*store.Rollout) bool {
	return func(r *store.Rollout) bool { return r.State == s }
}

// history is the rollout's events, in order, with what they say.
type history struct {
	types    []string
	nodes    []events.RolloutNodeData
	waves    []events.RolloutWaveData
	maxOut   int // the most of the rollout's nodes out of service at once
	upgraded map[string]int
}

func (e *env) history(ro *store.Rollout) history {
	e.t.Helper()
	entries := mustV(e.st.OutboxQuery(context.Background(), &store.OutboxQueryParams{Key: ro.ID, Ascending: true, Limit: store.MaxListLimit}))
	h := history{upgraded: map[string]int{}}
	out := map[string]bool{}
	for _, en := range entries {
		env, err := events.Parse(en.Payload)
		if err != nil {
			e.t.Fatal(err)
		}
		h.types = append(h.types, env.Type)
		switch env.Type {
		case events.RolloutWaveStarted, events.RolloutWaveCompleted:
			var d events.RolloutWaveData
			_ = json.Unmarshal(env.Data, &d)
			h.waves = append(h.waves, d)
		}
		var d events.RolloutNodeData
		if json.Unmarshal(env.Data, &d) != nil || d.NodeID == "" {
			continue
		}
		h.nodes = append(h.nodes, d)
		switch d.State {
		case store.RolloutNodeDraining, store.RolloutNodeUpgrading, store.RolloutNodeSoaking, store.RolloutNodeRollingBack:
			out[d.NodeID] = true
		default:
			delete(out, d.NodeID)
		}
		if d.State == store.RolloutNodeUpgrading {
			h.upgraded[d.NodeID]++
		}
		h.maxOut = max(h.maxOut, len(out))
	}
	return h
}

// TestRolloutWaves rolls six FakeDaemons from A to B: the canary alone
// first, then waves of two, never more than two out, every node upgraded
// once and on B, every step an event.
func TestRolloutWaves(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 6)
	ro := e.create(store.RolloutCreateParams{Canary: 1, Wave: "2", Soak: 150 * time.Millisecond, Drain: true})
	w := e.worker("w1", ro, nil)
	ro = e.until(w, ro, "completed", state(store.RolloutCompleted))
	if ro.CurrentWave != 4 || ro.FinishedAt == nil {
		t.Errorf("completed rollout: wave %d, finished %v; want 4 waves (1 + 2 + 2 + 1)", ro.CurrentWave, ro.FinishedAt)
	}
	for id, d := range e.daemons {
		if d.Version() != versionB || d.Upgrades() != 1 {
			t.Errorf("%s: version %s after %d upgrades, want %s after 1", id, d.Version(), d.Upgrades(), versionB)
		}
	}
	h := e.history(ro)
	if h.maxOut > 2 {
		t.Errorf("%d nodes out at once, want at most 2 (--max-unavailable)", h.maxOut)
	}
	if len(h.waves) < 1 || !h.waves[0].Canary || len(h.waves[0].NodeIDs) != 1 {
		t.Errorf("first wave event %+v, want the canary of one node", h.waves)
	}
	canary := h.waves[0].NodeIDs[0]
	for _, d := range h.nodes {
		if d.NodeID != canary && d.State == store.RolloutNodeUpgrading {
			// The canary's upgraded event must come first.
			break
		}
		if d.NodeID == canary && d.State == store.RolloutNodeUpgraded {
			goto canaryFirst
		}
	}
	t.Errorf("a node other than the canary %s was upgraded before it: %+v", canary, h.nodes)
canaryFirst:
	for _, id := range e.ids {
		if h.upgraded[id] != 1 {
			t.Errorf("%s upgraded %d times, want 1", id, h.upgraded[id])
		}
	}
	for _, typ := range []string{events.RolloutStarted, events.RolloutWaveStarted, events.RolloutNodeDraining, events.RolloutNodeUpgrading,
		events.RolloutNodeSoaking, events.RolloutNodeUpgraded, events.RolloutWaveCompleted, events.RolloutCompleted} {
		if !slices.Contains(h.types, typ) {
			t.Errorf("no %s in the rollout's events %v", typ, h.types)
		}
	}
	if b := mustV(e.st.PoolBudget(context.Background(), e.pool.ID)); b.OutOfService != 0 {
		t.Errorf("%d nodes left out of service", b.OutOfService)
	}
}

// TestRolloutFailingTrialHalts: the canary's trial fails (bcd restores
// the previous release itself); the rollout halts after the canary, which
// is back on A, and no other node was touched.
func TestRolloutFailingTrialHalts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	for _, d := range e.daemons {
		d.SetRelease(versionB, sim.Release{FailTrial: true})
	}
	ro := e.create(store.RolloutCreateParams{Canary: 1, Wave: "2", Soak: 100 * time.Millisecond})
	w := e.worker("w1", ro, nil)
	ro = e.until(w, ro, "halted", state(store.RolloutHalted))
	if ro.CurrentWave != 1 || ro.FailedNodeID == "" || ro.Reason == "" {
		t.Fatalf("halted rollout: wave %d, failed node %q, reason %q", ro.CurrentWave, ro.FailedNodeID, ro.Reason)
	}
	t.Logf("halted: %s", ro.Reason)
	for id, d := range e.daemons {
		want := 0
		if id == ro.FailedNodeID {
			want = 1
		}
		if d.Version() != versionA || d.Upgrades() != want {
			t.Errorf("%s: version %s after %d upgrades, want %s after %d", id, d.Version(), d.Upgrades(), versionA, want)
		}
	}
	// Never a new wave while halted.
	for range 5 {
		if err := w.step(t); err != nil {
			t.Fatal(err)
		}
	}
	if cur := mustV(e.st.RolloutGet(context.Background(), ro.ID)); cur.State != store.RolloutHalted || cur.CurrentWave != 1 {
		t.Fatalf("halted rollout moved on: %s wave %d", cur.State, cur.CurrentWave)
	}
	h := e.history(ro)
	if !slices.Contains(h.types, events.RolloutNodeFailed) || !slices.Contains(h.types, events.RolloutHalted) {
		t.Errorf("events %v lack node-failed and halted", h.types)
	}
}

// TestRolloutUnhealthyDuringSoakRollsBackTheWave: a canary wave of two
// starts B, which turns unhealthy during the soak; the rollout halts and
// both canary nodes get the rollback command and are back on A.
func TestRolloutUnhealthyDuringSoakRollsBackTheWave(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	for _, d := range e.daemons {
		d.SetRelease(versionB, sim.Release{UnhealthyAfter: 300 * time.Millisecond, DownFor: 500 * time.Millisecond})
	}
	if err := e.st.PoolSetBudget(context.Background(), &store.PoolSetBudgetParams{PoolID: e.pool.ID, Spec: "2"}); err != nil {
		t.Fatal(err)
	}
	ro := e.create(store.RolloutCreateParams{Canary: 2, Wave: "2", Soak: 3 * time.Second})
	w := e.worker("w1", ro, nil)
	ro = e.until(w, ro, "halted", state(store.RolloutHalted))
	t.Logf("halted: %s", ro.Reason)
	nodes := mustV(e.st.RolloutNodes(context.Background(), ro.ID))
	var wave []string
	for _, n := range nodes {
		if n.Wave == 1 {
			wave = append(wave, n.NodeID)
			if n.State != store.RolloutNodeRolledBack || n.RollbackCommandID == "" {
				t.Errorf("canary node %s: %s (rollback %q), want rolled-back by command", n.NodeID, n.State, n.RollbackCommandID)
			}
		} else if n.State != store.RolloutNodePending {
			t.Errorf("node %s outside the wave: %s, want untouched", n.NodeID, n.State)
		}
	}
	if len(wave) != 2 {
		t.Fatalf("canary wave %v, want two nodes", wave)
	}
	for id, d := range e.daemons {
		inWave := slices.Contains(wave, id)
		if d.Version() != versionA || (d.Rollbacks() == 1) != inWave {
			t.Errorf("%s: version %s, %d rollbacks (in the wave: %v)", id, d.Version(), d.Rollbacks(), inWave)
		}
	}
	if b := mustV(e.st.PoolBudget(context.Background(), e.pool.ID)); b.OutOfService != 0 {
		t.Errorf("%d nodes left out of service after the rollback", b.OutOfService)
	}
}

// TestRolloutTakeover: the worker driving the rollout stops mid-wave (its
// lease expires); another takes the shard and finishes the rollout from
// the rows, and no node is upgraded twice. The old holder's writes are
// fenced.
func TestRolloutTakeover(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 6)
	ro := e.create(store.RolloutCreateParams{Canary: 1, Wave: "3", Soak: 200 * time.Millisecond})
	w1 := e.worker("w1", ro, nil)
	e.until(w1, ro, "in its second wave", func(r *store.Rollout) bool {
		if r.CurrentWave < 2 {
			return false
		}
		for _, n := range mustV(e.st.RolloutNodes(context.Background(), ro.ID)) {
			if n.Wave == 2 && n.State == store.RolloutNodeUpgrading {
				return true
			}
		}
		return false
	})
	// w1 is gone: its lease expires and w2 takes the shard.
	later := time.Now().Add(2 * time.Minute)
	w2 := e.worker("w2", ro, &later)
	if w2.fence.Epoch <= w1.fence.Epoch {
		t.Fatalf("takeover epoch %d, was %d", w2.fence.Epoch, w1.fence.Epoch)
	}
	ro = e.until(w2, ro, "completed", state(store.RolloutCompleted))
	// A step by the old holder changes nothing (it would fail fenced, or
	// find nothing to do).
	_ = w1.step(t)
	h := e.history(ro)
	for id, d := range e.daemons {
		if d.Upgrades() != 1 || h.upgraded[id] != 1 || d.Version() != versionB {
			t.Errorf("%s: %d upgrade commands run, %d sent, version %s; want 1, 1, %s", id, d.Upgrades(), h.upgraded[id], d.Version(), versionB)
		}
	}
	for _, id := range e.ids {
		cmds := mustV(e.st.CommandList(context.Background(), &store.CommandListParams{NodeID: id}))
		if len(cmds) != 1 {
			t.Errorf("%s has %d commands, want its one upgrade", id, len(cmds))
		}
	}
}

// TestRolloutSharesTheBudget: two of ten nodes quarantined and a budget of
// three: the rollout (waves of three) upgrades one node at a time, and
// skips the quarantined ones.
func TestRolloutSharesTheBudget(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 10)
	ctx := context.Background()
	if err := e.st.PoolSetBudget(ctx, &store.PoolSetBudgetParams{PoolID: e.pool.ID, Spec: "3"}); err != nil {
		t.Fatal(err)
	}
	quarantined := e.ids[:2]
	for _, id := range quarantined {
		a := mustV(e.st.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: id, Reason: store.DisruptionQuarantined, Owner: "remediation:test"}))
		if !a.Admitted {
			t.Fatalf("quarantine refused: %+v", a)
		}
	}
	ro := e.create(store.RolloutCreateParams{Canary: 1, Wave: "3", MaxUnavailable: "3", Soak: 100 * time.Millisecond})
	w := e.worker("w1", ro, nil)
	ro = e.until(w, ro, "completed", state(store.RolloutCompleted))
	h := e.history(ro)
	if h.maxOut != 1 {
		t.Errorf("%d of the rollout's nodes out at once, want 1 (budget 3, 2 quarantined)", h.maxOut)
	}
	for _, n := range mustV(e.st.RolloutNodes(ctx, ro.ID)) {
		want := store.RolloutNodeUpgraded
		if slices.Contains(quarantined, n.NodeID) {
			want = store.RolloutNodeSkipped
		}
		if n.State != want {
			t.Errorf("%s: %s (%q), want %s", n.NodeID, n.State, n.Reason, want)
		}
	}
}

// TestRolloutWaitsForReservation: a node placed for a reservation that is
// active now is not upgraded while it lasts (the rest of the pool is);
// once it is cancelled the node is upgraded and the rollout completes.
func TestRolloutWaitsForReservation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	ctx := context.Background()
	reserved := e.ids[1]
	now := time.Now()
	r := mustV(e.st.ReservationCreate(ctx, &store.ReservationCreateParams{PoolID: e.pool.ID, Nodes: 1, Start: now.Add(-time.Minute),
		End: now.Add(time.Hour), Owner: "team-a"}))
	mustV(e.st.ReservationPlace(ctx, &store.ReservationPlaceParams{ID: r.ID, Slots: []*store.ReservationSlot{{NodeID: reserved, GPU: 0}}}))
	if got := mustV(e.st.NodeReservedNow(ctx, reserved, nil)); got == nil || got.ID != r.ID {
		t.Fatalf("NodeReservedNow(%s) = %+v, want %s", reserved, got, r.ID)
	}
	ro := e.create(store.RolloutCreateParams{Canary: 1, Wave: "3", MaxUnavailable: "3", Soak: 50 * time.Millisecond})
	w := e.worker("w1", ro, nil)
	e.until(w, ro, "the others upgraded", func(ro *store.Rollout) bool {
		n := 0
		for _, rn := range mustV(e.st.RolloutNodes(ctx, ro.ID)) {
			if rn.NodeID == reserved && rn.State != store.RolloutNodePending {
				t.Fatalf("the reserved node moved to %s (%q) while its reservation is active", rn.State, rn.Reason)
			}
			if rn.State == store.RolloutNodeUpgraded {
				n++
			}
		}
		return n == 2
	})
	// rollouts get says what the node waits for.
	for _, rn := range mustV(e.st.RolloutNodes(ctx, ro.ID)) {
		if rn.NodeID == reserved && (!strings.Contains(rn.Reason, r.ID) || !strings.Contains(rn.Reason, "team-a")) {
			t.Errorf("reserved node's reason %q, want it to name reservation %s and its owner", rn.Reason, r.ID)
		}
	}
	mustV(e.st.ReservationCancel(ctx, &store.ReservationCancelParams{ID: r.ID}))
	ro = e.until(w, ro, "completed", state(store.RolloutCompleted))
	for _, n := range mustV(e.st.RolloutNodes(ctx, ro.ID)) {
		if strings.Contains(n.Reason, "waits for") {
			t.Errorf("%s: the wait note %q outlived the wait", n.NodeID, n.Reason)
		}
		if n.State != store.RolloutNodeUpgraded {
			t.Errorf("%s: %s (%q), want upgraded after the reservation ended", n.NodeID, n.State, n.Reason)
		}
	}
}

// running enqueues an exec command on node and marks it running, as if
// the node were running it (a FakeDaemon runs an exec at once). Both in
// one transaction: the gateway's dispatch must never see it queued (it
// did, and the daemon failed it, seen in CI).
func (e *env) running(node string) *store.Command {
	e.t.Helper()
	var c *store.Command
	err := e.st.Tx(context.Background(), func(tx store.Store) error {
		ctx := context.Background()
		cs, err := tx.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{node}, Kind: "exec", Timeout: time.Hour})
		if err != nil {
			return err
		}
		c = cs[0]
		ok, err := tx.CommandSetState(ctx, &store.CommandSetStateParams{ID: c.ID, State: store.CommandRunning, GatewayID: "gw_elsewhere"})
		if err == nil && !ok {
			err = fmt.Errorf("command %s not running", c.ID)
		}
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// TestRolloutDrains: with --drain a node waits for its running commands
// (and is skipped when one is still running after the timeout); with
// --drain=false the commands still running are finished as ended by the
// restart. A paused rollout starts no node.
func TestRolloutDrains(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	ctx := context.Background()
	if err := e.st.PoolSetBudget(ctx, &store.PoolSetBudgetParams{PoolID: e.pool.ID, Spec: "2"}); err != nil {
		t.Fatal(err)
	}
	// The commands run on the nodes as long as the test needs: a session
	// that reopens (a late heartbeat on a loaded machine) redelivers them,
	// and a node still running a command keeps it running.
	for _, d := range e.daemons {
		d.SetExecDelay(time.Hour)
	}
	busy, stuck := e.running(e.ids[0]), e.running(e.ids[1])
	ro := e.create(store.RolloutCreateParams{Canary: 2, Wave: "2", Soak: 100 * time.Millisecond, Timeout: 2 * time.Second, Drain: true})
	w := e.worker("w1", ro, nil)
	e.until(w, ro, "draining both", func(*store.Rollout) bool {
		n := 0
		for _, rn := range mustV(e.st.RolloutNodes(ctx, ro.ID)) {
			if rn.State == store.RolloutNodeDraining {
				n++
			}
		}
		return n == 2
	})
	// Paused: nothing moves, though the first node's command ends.
	mustV(e.st.RolloutUpdate(ctx, &store.RolloutUpdateParams{ID: ro.ID, From: []string{store.RolloutRunning}, State: store.RolloutPaused}))
	zero := 0
	mustV(e.st.CommandFinish(ctx, &store.CommandFinishParams{ID: busy.ID, State: store.CommandSucceeded, ExitCode: &zero}))
	for range 3 {
		if err := w.step(t); err != nil {
			t.Fatal(err)
		}
	}
	for _, rn := range mustV(e.st.RolloutNodes(ctx, ro.ID)) {
		if rn.State != store.RolloutNodeDraining && rn.State != store.RolloutNodeUpgrading {
			t.Fatalf("paused rollout moved %s to %s", rn.NodeID, rn.State)
		}
	}
	mustV(e.st.RolloutUpdate(ctx, &store.RolloutUpdateParams{ID: ro.ID, From: []string{store.RolloutPaused}, State: store.RolloutRunning}))
	ro = e.until(w, ro, "completed", state(store.RolloutCompleted))
	for _, rn := range mustV(e.st.RolloutNodes(ctx, ro.ID)) {
		switch rn.NodeID {
		case e.ids[0]:
			if rn.State != store.RolloutNodeUpgraded {
				t.Errorf("drained node: %s (%q)", rn.State, rn.Reason)
			}
		case e.ids[1]:
			if rn.State != store.RolloutNodeSkipped || !strings.Contains(rn.Reason, stuck.ID) {
				t.Errorf("node still busy after the timeout: %s (%q), want skipped naming %s", rn.State, rn.Reason, stuck.ID)
			}
		}
	}
	if c := mustV(e.st.CommandGet(ctx, stuck.ID)); c.State != store.CommandRunning {
		t.Errorf("a drain ended the command it waited for: %s", c.State)
	}
	// The drained node's hold went from draining to upgrading (and back
	// in service), each a node.disruption-changed event.
	var moves []string
	for _, en := range mustV(e.st.OutboxQuery(ctx, &store.OutboxQueryParams{Key: e.ids[0], TopicPrefix: events.NodeDisruptionChanged,
		Ascending: true, Limit: store.MaxListLimit})) {
		env := mustV(events.Parse(en.Payload))
		var d events.DisruptionData
		if err := json.Unmarshal(env.Data, &d); err != nil {
			t.Fatal(err)
		}
		moves = append(moves, d.Disruption)
	}
	if want := []string{store.DisruptionDraining, store.DisruptionUpgrading, ""}; !slices.Equal(moves, want) {
		t.Errorf("drained node's disruption moves %q, want %q", moves, want)
	}

	// --drain=false: the busy node is upgraded, its command reported as
	// ended by the restart.
	ro2 := e.create(store.RolloutCreateParams{Version: versionB, Canary: 2, Wave: "2", Soak: 100 * time.Millisecond})
	w2 := e.worker("w1", ro2, nil)
	e.until(w2, ro2, "completed", state(store.RolloutCompleted))
	c := mustV(e.st.CommandGet(ctx, stuck.ID))
	if c.State != store.CommandFailed || !strings.Contains(c.Error, "ended by the restart of bcd") {
		t.Errorf("command running at a --drain=false upgrade: %s %q", c.State, c.Error)
	}
	for _, rn := range mustV(e.st.RolloutNodes(ctx, ro2.ID)) {
		if rn.NodeID == e.ids[1] && (rn.State != store.RolloutNodeUpgraded || !strings.Contains(rn.Reason, stuck.ID)) {
			t.Errorf("busy node with --drain=false: %s (%q)", rn.State, rn.Reason)
		}
	}
}

// TestRolloutGPUFailureInSoakHalts: the canary comes back on B, then a GPU
// of it falls off the bus during its soak: the rollout halts naming the
// GPU and the canary is rolled back to A.
func TestRolloutGPUFailureInSoakHalts(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, 3, true)
	ctx := context.Background()
	ro := e.create(store.RolloutCreateParams{Canary: 1, Wave: "2", Soak: 20 * time.Second})
	w := e.worker("w1", ro, nil)
	var canary string
	e.until(w, ro, "soaking its canary", func(*store.Rollout) bool {
		for _, n := range mustV(e.st.RolloutNodes(ctx, ro.ID)) {
			if n.State == store.RolloutNodeSoaking {
				canary = n.NodeID
				return true
			}
		}
		return false
	})
	if err := e.daemons[canary].LoseGPU(0); err != nil {
		t.Fatal(err)
	}
	ro = e.until(w, ro, "halted", state(store.RolloutHalted))
	if ro.FailedNodeID != canary || !strings.Contains(ro.Reason, "GPU") {
		t.Fatalf("halted for %s: %q, want the canary %s and its GPU", ro.FailedNodeID, ro.Reason, canary)
	}
	if d := e.daemons[canary]; d.Version() != versionA || d.Rollbacks() != 1 {
		t.Errorf("canary on %s after %d rollbacks, want %s after 1", d.Version(), d.Rollbacks(), versionA)
	}
}

// TestRolloutCountsALocalRollbackAsFailed: the canary's bcd restores A by
// itself during its soak (a crash loop; issue 30); the rollout counts it
// failed, sends it no rollback command and halts after the canary.
func TestRolloutCountsALocalRollbackAsFailed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	for _, d := range e.daemons {
		d.SetRelease(versionB, sim.Release{RollBackAfter: 300 * time.Millisecond})
	}
	ro := e.create(store.RolloutCreateParams{Canary: 1, Wave: "2", Soak: time.Minute})
	w := e.worker("w1", ro, nil)
	// Steps stop once the canary soaks, and go on when it is connected on
	// A again (its restart is no longer in sight).
	var canary string
	e.until(w, ro, "soaking", func(*store.Rollout) bool {
		for _, n := range mustV(e.st.RolloutNodes(context.Background(), ro.ID)) {
			if n.State == store.RolloutNodeSoaking {
				canary = n.NodeID
			}
		}
		return canary != ""
	})
	wctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if err := e.clock.Until(wctx, func() bool {
		n := mustV(e.st.NodeGet(context.Background(), canary))
		_, err := e.st.SessionGet(context.Background(), canary)
		return n.BCDVersion == versionA && err == nil
	}); err != nil {
		t.Fatalf("the canary is not connected on A again: %s", e.nodeStates(ro))
	}
	ro = e.until(w, ro, "halted", state(store.RolloutHalted))
	t.Logf("halted: %s", ro.Reason)
	if !strings.Contains(ro.Reason, "rolled itself back") || ro.CurrentWave != 1 {
		t.Fatalf("halted in wave %d: %q, want the canary's local rollback", ro.CurrentWave, ro.Reason)
	}
	for _, n := range mustV(e.st.RolloutNodes(context.Background(), ro.ID)) {
		switch {
		case n.NodeID == ro.FailedNodeID:
			if n.State != store.RolloutNodeFailed || n.RollbackCommandID != "" || n.BCDVersion != versionA {
				t.Errorf("canary %s: %s (rollback %q, on %s), want failed without a rollback command, on A", n.NodeID, n.State, n.RollbackCommandID, n.BCDVersion)
			}
		case n.State != store.RolloutNodePending:
			t.Errorf("node %s outside the canary: %s", n.NodeID, n.State)
		}
	}
	if b := mustV(e.st.PoolBudget(context.Background(), e.pool.ID)); b.OutOfService != 0 {
		t.Errorf("%d nodes left out of service", b.OutOfService)
	}
}

// TestRolloutLateFailureRollsBackEveryWave (issue 30): B restarts bcd 1.5 s
// after each start, after its short soak. The rollout watches every node it
// upgraded: the canary's restart halts it in a later wave or its bake, and
// every node it upgraded, of every wave, is rolled back within the pool's
// budget (one at a time here); the halt names each node and why, and
// nothing is left out of service.
func TestRolloutLateFailureRollsBackEveryWave(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 5)
	for _, d := range e.daemons {
		d.SetRelease(versionB, sim.Release{UnhealthyAfter: 1500 * time.Millisecond, DownFor: 100 * time.Millisecond})
	}
	ro := e.create(store.RolloutCreateParams{Canary: 1, Wave: "2", MaxUnavailable: "1", Soak: 200 * time.Millisecond, Bake: time.Minute})
	w := e.worker("w1", ro, nil)
	ro = e.until(w, ro, "halted", state(store.RolloutHalted))
	t.Logf("halted: %s", ro.Reason)
	if !strings.Contains(ro.Reason, "bcd restarted") {
		t.Errorf("reason %q, want a restart of bcd named", ro.Reason)
	}
	nodes := mustV(e.st.RolloutNodes(context.Background(), ro.ID))
	var touched []string
	for _, n := range nodes {
		switch {
		case n.Wave == 0 || n.State == store.RolloutNodePending:
		case n.State == store.RolloutNodeRolledBack && n.BCDVersion == versionA:
			touched = append(touched, n.NodeID)
		default:
			t.Errorf("node %s (wave %d): %s on %s %q, want rolled back to A", n.NodeID, n.Wave, n.State, n.BCDVersion, n.Reason)
		}
	}
	waves := map[int]bool{}
	for _, n := range nodes {
		if slices.Contains(touched, n.NodeID) {
			waves[n.Wave] = true
		}
	}
	if len(touched) < 2 || len(waves) < 2 {
		t.Fatalf("rolled back %v in waves %v: want nodes of more than one wave", touched, waves)
	}
	h := e.history(ro)
	if h.maxOut > 1 {
		t.Errorf("%d nodes out at once, want at most 1 (the pool's budget)", h.maxOut)
	}
	if b := mustV(e.st.PoolBudget(context.Background(), e.pool.ID)); b.OutOfService != 0 {
		t.Errorf("%d nodes left out of service", b.OutOfService)
	}
	entries := mustV(e.st.OutboxQuery(context.Background(), &store.OutboxQueryParams{Key: ro.ID, TopicPrefix: events.RolloutHalted}))
	if len(entries) != 1 {
		t.Fatalf("%d rollout.halted events", len(entries))
	}
	var d events.RolloutData
	_ = json.Unmarshal(mustV(events.Parse(entries[0].Payload)).Data, &d)
	if len(d.Nodes) != len(touched) {
		t.Errorf("rollout.halted names %+v, want the %d nodes rolled back", d.Nodes, len(touched))
	}
	for _, n := range d.Nodes {
		if n.Reason == "" || n.State != store.RolloutNodeRolledBack {
			t.Errorf("rollout.halted node %+v: want rolled-back and why", n)
		}
	}
}

// TestRolloutBakes: after the last wave the rollout stays running in its
// bake, watching its nodes; a pause stops the bake's clock, and the
// rollout completes once the bake has run.
func TestRolloutBakes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 3)
	ro := e.create(store.RolloutCreateParams{Canary: 1, Wave: "2", Soak: 100 * time.Millisecond, Bake: time.Second})
	w := e.worker("w1", ro, nil)
	ro = e.until(w, ro, "baking", func(r *store.Rollout) bool { return r.Baking() })
	if ro.State != store.RolloutRunning {
		t.Fatalf("baking rollout is %s", ro.State)
	}
	ro = mustV(e.st.RolloutUpdate(context.Background(), &store.RolloutUpdateParams{ID: ro.ID, From: []string{store.RolloutRunning}, State: store.RolloutPaused}))
	if ro.BakeResumedAt != nil {
		t.Fatal("a paused bake's clock runs")
	}
	frozen := ro.BakeElapsed
	for range 5 {
		if err := w.step(t); err != nil {
			t.Fatal(err)
		}
	}
	if cur := mustV(e.st.RolloutGet(context.Background(), ro.ID)); cur.State != store.RolloutPaused || cur.BakeDone(time.Now().Add(time.Hour)) != frozen {
		t.Fatalf("paused bake moved: %s, %v counted (was %v)", cur.State, cur.BakeDone(time.Now().Add(time.Hour)), frozen)
	}
	mustV(e.st.RolloutUpdate(context.Background(), &store.RolloutUpdateParams{ID: ro.ID, From: []string{store.RolloutPaused}, State: store.RolloutRunning}))
	ro = e.until(w, ro, "completed", state(store.RolloutCompleted))
	if ro.BakeElapsed < time.Second || ro.BakeResumedAt != nil {
		t.Errorf("completed after %v of bake (clock %v), want at least 1s and stopped", ro.BakeElapsed, ro.BakeResumedAt)
	}
}
