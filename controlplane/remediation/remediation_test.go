package remediation_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/clocktest"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/remediation"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/backend"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
	"github.com/better-compute/better-compute/proto/gpudiag"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// These tests run the reconciler against the real store of both backends.
// The nodes are played through the store, as the gateway records what a
// node says: an XID arrives as the node event the gateway writes (kind
// gpu.xid, payload with the resolution bcd classified it with), heartbeats
// and reconnections as session rows, and command results as CommandFinish.
// The loop over real daemons and a real gateway is in the sim test.

// backends runs fn against SQLite and PostgreSQL.
func backends(t *testing.T, fn func(t *testing.T, st store.Store)) {
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		fn(t, sqlitetest.Open(t))
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		st, err := backend.Open(context.Background(), pgtest.URL(t), "")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		if _, err := st.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
		fn(t, st)
	})
}

// behaviour is how a played node answers a command kind.
type behaviour int

const (
	succeed     behaviour = iota // succeeds at once
	fail                         // fails
	stayDown                     // a reboot that never comes back (the command is lost)
	hold                         // never answers (the command stays queued)
	comeBackNow                  // (power.cycle) the target reconnects
	restartOnly                  // (reboot) bcd restarts, the machine does not reboot: the same boot id
)

// fixture is a pool of played nodes, a clock and a reconciler.
type fixture struct {
	t     *testing.T
	ctx   context.Context
	st    store.Store
	clock *clocktest.Clock
	pool  *store.Pool
	nodes []string
	// down are nodes that neither heartbeat nor answer.
	down map[string]bool
	// answers maps node id + " " + kind to its behaviour (default succeed).
	answers map[string]behaviour
	// power is what an agent's power.status says, by target node.
	power  map[string]string
	rec    *remediation.Reconciler
	epoch  map[int]int64
	holder string
	sess   map[string]int
	// boot is the boot id each node reports when it connects, "" for an
	// older bcd that reports none; boots counts each node's boots.
	boot  map[string]string
	boots map[string]int
}

func newFixture(t *testing.T, st store.Store, n int, settings config.Remediation) *fixture {
	ctx := context.Background()
	f := &fixture{t: t, ctx: ctx, st: st, clock: clocktest.New(time.Now().UTC().Truncate(time.Millisecond)),
		down: map[string]bool{}, answers: map[string]behaviour{}, power: map[string]string{}, epoch: map[int]int64{},
		holder: "w1", sess: map[string]int{}, boot: map[string]string{}, boots: map[string]int{}}
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s-" + store.NewID("x"), Region: "eu"})
	if err != nil {
		t.Fatal(err)
	}
	if f.pool, err = st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p-" + store.NewID("x"), SiteID: site.ID}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		id := fmt.Sprintf("node_%02d", i)
		if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: f.pool.ID, Hostname: id, MachineID: id}); err != nil {
			t.Fatal(err)
		}
		f.nodes = append(f.nodes, id)
		f.reboot(id)
		f.connect(id)
	}
	f.rec = f.reconciler(settings)
	return f
}

func (f *fixture) reconciler(settings config.Remediation) *remediation.Reconciler {
	settings.Interval.Duration = time.Second
	if settings.Repeat.Spacing.Duration == 0 {
		// Most tests take several actions on one node within seconds;
		// TestActionsSpacedOnNode sets the spacing it tests.
		settings.Repeat.Spacing.Duration = time.Millisecond
	}
	if settings.Breaker == (config.RemediationBreaker{}) {
		settings.Breaker.MinNodes = 1000 // the breaker is not what these tests look at
	}
	if settings.VerifySettle.Duration == 0 {
		settings.VerifySettle.Duration = 3 * time.Second
	}
	r, err := remediation.New(remediation.Config{Settings: settings, Holder: f.holder, Now: f.clock.Now}, f.st,
		slog.New(slog.NewTextHandler(testWriter{f.t}, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		f.t.Fatal(err)
	}
	return r
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// reboot gives node id a new boot: a new boot id, except for an older bcd
// (boot id "" once connected), which reports none.
func (f *fixture) reboot(id string) {
	f.boots[id]++
	if f.boots[id] == 1 || f.boot[id] != "" {
		f.boot[id] = fmt.Sprintf("boot-%s-%d", id, f.boots[id])
	}
}

// connect opens a new session for id (a (re)connection) with its boot id,
// as the gateway records Hello, and marks it ready.
func (f *fixture) connect(id string) {
	f.sess[id]++
	now := f.clock.Now()
	if _, _, err := f.st.SessionOpen(f.ctx, &store.SessionOpenParams{NodeID: id, SessionID: fmt.Sprintf("s_%s_%d", id, f.sess[id]),
		GatewayID: "gw", BootID: f.boot[id], Now: &now}); err != nil {
		f.t.Fatal(err)
	}
	if err := f.st.NodeSetState(f.ctx, id, store.NodeReady); err != nil {
		f.t.Fatal(err)
	}
}

// xid makes node id report an XID as the gateway records it.
func (f *fixture) xid(id string, code int, mnemonic, resolution string) {
	finding := &sessionv1.GPUFinding{GpuUuid: "GPU-" + id, Resolution: resolution, ImmediateResolution: resolution,
		Signal: &sessionv1.GPUFinding_Xid{Xid: &sessionv1.XIDSignal{Code: uint32(code), Mnemonic: mnemonic}}}
	if _, err := f.st.EventInsert(f.ctx, &store.Event{NodeID: id, Kind: gpufinding.KindXID, Severity: "critical",
		Message: fmt.Sprintf("XID %d", code), GPUFinding: finding}); err != nil {
		f.t.Fatal(err)
	}
}

// round advances the clock one interval, plays the nodes (heartbeats and
// answers to queued commands) and runs one reconciler round over the
// nodes' shards.
func (f *fixture) round() {
	f.t.Helper()
	f.clock.Advance(time.Second)
	f.play()
	f.reconcile(f.rec, f.holder)
}

// reconcile runs one round of r, holding every shard of the nodes as holder.
func (f *fixture) reconcile(r *remediation.Reconciler, holder string) error {
	f.t.Helper()
	now := f.clock.Now()
	var shards []int
	for _, id := range f.nodes {
		if n := store.ShardOf(id); !slices.Contains(shards, n) {
			shards = append(shards, n)
		}
	}
	sort.Ints(shards)
	due, err := r.Due(f.ctx, now, shards)
	if err != nil {
		f.t.Fatal(err)
	}
	for _, n := range shards {
		if !slices.Contains(due, n) {
			continue
		}
		l, ok, err := f.st.LeaseAcquire(f.ctx, &store.LeaseAcquireParams{Name: fmt.Sprintf("shard:%d", n), Holder: holder, TTL: time.Minute, Now: &now})
		if err != nil {
			f.t.Fatal(err)
		}
		if !ok {
			continue
		}
		if err := r.Reconcile(f.ctx, n, store.Fence{Lease: l.Name, Holder: holder, Epoch: l.Epoch, Now: &now}); err != nil {
			if errors.Is(err, store.ErrFenced) {
				return err
			}
			f.t.Fatalf("reconcile shard %d: %v", n, err)
		}
	}
	return nil
}

// play heartbeats the nodes that are up and answers their queued commands.
func (f *fixture) play() {
	f.t.Helper()
	now := f.clock.Now()
	var live []string
	for _, id := range f.nodes {
		if !f.down[id] {
			live = append(live, fmt.Sprintf("s_%s_%d", id, f.sess[id]))
		}
	}
	if _, err := f.st.SessionHeartbeatBatch(f.ctx, "gw", live, &now); err != nil {
		f.t.Fatal(err)
	}
	// The CommandSweeper's pass: overdue commands expire, those of nodes
	// without a session for 30 s are lost.
	if _, err := f.st.CommandSweep(f.ctx, &store.CommandSweepParams{LostAfter: 30 * time.Second, Now: &now}); err != nil {
		f.t.Fatal(err)
	}
	for _, id := range f.nodes {
		if f.down[id] {
			continue
		}
		cmds, err := f.st.CommandList(f.ctx, &store.CommandListParams{NodeID: id, State: store.CommandQueued})
		if err != nil {
			f.t.Fatal(err)
		}
		for _, c := range cmds {
			f.answer(id, c, now)
		}
	}
}

func (f *fixture) answer(id string, c *store.Command, now time.Time) {
	finishWith := func(state, msg string, result []byte) {
		code := 0
		if state != store.CommandSucceeded {
			code = 1
		}
		if _, err := f.st.CommandFinish(f.ctx, &store.CommandFinishParams{ID: c.ID, State: state, ExitCode: &code, Error: msg,
			Result: result, Now: &now}); err != nil {
			f.t.Fatal(err)
		}
	}
	finish := func(state string, result []byte) { finishWith(state, "", result) }
	spec := &sessionv1.Command{}
	if err := sessionv1.UnmarshalSpec(c.SessionSpec, spec); err != nil {
		f.t.Fatal(err)
	}
	b := f.answers[id+" "+c.Kind]
	switch {
	case c.Kind == sessionv1.KindGPUDiag && b == fail:
		// As bcd answers a dcgmi diag that found a fault.
		res := gpudiag.Result{Tool: gpudiag.ToolDCGM, Level: int(spec.GetGpuDiag().GetLevel()), Tests: 12}
		res.Add(gpudiag.Failure{Test: "Hardware/GPU Memory", GPU: "0", Message: "Memory error found at address 0x1000"})
		detail, _ := json.Marshal(res)
		finishWith(store.CommandFailed, "gpu.diag: dcgmi diag -r 1 "+res.Summary(), detail)
	case c.Kind == sessionv1.KindGPUDiag && b == succeed:
		detail, _ := json.Marshal(gpudiag.Result{Tool: gpudiag.ToolDCGM, Level: int(spec.GetGpuDiag().GetLevel()), Tests: 12})
		finish(store.CommandSucceeded, detail)
	case b == hold:
	case b == fail:
		finish(store.CommandFailed, nil)
	case c.Kind == sessionv1.KindReboot && b == stayDown:
		// It goes down before it can answer; the sweeper loses the
		// command once the session is gone, liveness marks it unreachable.
		f.down[id] = true
		if _, err := f.st.CommandSetState(f.ctx, &store.CommandSetStateParams{ID: c.ID, State: store.CommandDispatched, GatewayID: "gw", Now: &now}); err != nil {
			f.t.Fatal(err)
		}
		if err := f.st.SessionClose(f.ctx, id, fmt.Sprintf("s_%s_%d", id, f.sess[id])); err != nil {
			f.t.Fatal(err)
		}
		if err := f.st.NodeSetState(f.ctx, id, store.NodeUnreachable); err != nil {
			f.t.Fatal(err)
		}
	case c.Kind == sessionv1.KindReboot && b == restartOnly:
		finish(store.CommandSucceeded, nil)
		f.connect(id)
	case c.Kind == sessionv1.KindReboot:
		finish(store.CommandSucceeded, nil)
		f.reboot(id)
		f.connect(id)
	case c.Kind == sessionv1.KindPowerStatus:
		target := spec.GetPower().GetNodeId()
		res, _ := json.Marshal(map[string]string{"action": "status", "nodeId": target, "power": f.power[target]})
		finish(store.CommandSucceeded, res)
	case c.Kind == sessionv1.KindPowerCycle:
		target := spec.GetPower().GetNodeId()
		res, _ := json.Marshal(map[string]string{"action": "cycle", "nodeId": target, "power": "on"})
		finish(store.CommandSucceeded, res)
		delete(f.down, target)
		f.reboot(target)
		f.connect(target)
	default:
		finish(store.CommandSucceeded, nil)
	}
}

// caseOf returns node id's latest case, nil when none.
func (f *fixture) caseOf(id string) *store.Remediation {
	list, err := f.st.RemediationList(f.ctx, &store.RemediationListParams{NodeID: id})
	if err != nil {
		f.t.Fatal(err)
	}
	if len(list) == 0 {
		return nil
	}
	slices.SortFunc(list, func(a, b *store.Remediation) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return list[len(list)-1]
}

// until runs rounds until cond holds, at most n.
func (f *fixture) until(n int, what string, cond func() bool) {
	f.t.Helper()
	for range n {
		if cond() {
			return
		}
		f.round()
	}
	if !cond() {
		f.t.Fatalf("not %s after %d rounds", what, n)
	}
}

// steps returns the remediation event types of node id in order.
func (f *fixture) steps(id string) []string {
	es, err := f.st.OutboxQuery(f.ctx, &store.OutboxQueryParams{Key: id, TopicPrefix: events.TypePrefix + "remediation.", Ascending: true, Limit: 1000})
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, strings.TrimPrefix(e.Topic, events.TypePrefix+"remediation."))
	}
	return out
}

// commandsOf returns node id's action commands by kind: every command but
// the gpu.diag checks before return (diagsOf).
func (f *fixture) commandsOf(id string) map[string]int {
	out := f.allCommandsOf(id)
	delete(out, sessionv1.KindGPUDiag)
	return out
}

// diagsOf counts node id's gpu.diag commands.
func (f *fixture) diagsOf(id string) int { return f.allCommandsOf(id)[sessionv1.KindGPUDiag] }

func (f *fixture) allCommandsOf(id string) map[string]int {
	cmds, err := f.st.CommandList(f.ctx, &store.CommandListParams{NodeID: id})
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]int{}
	for _, c := range cmds {
		out[c.Kind]++
	}
	return out
}

func (f *fixture) node(id string) *store.Node {
	n, err := f.st.NodeGet(f.ctx, id)
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}
