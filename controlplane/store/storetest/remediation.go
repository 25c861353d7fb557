package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// testRemediation drives the remediation store: findings recorded in their
// event's transaction and taken once, one open case per node, guarded
// moves with their events and audit rows, pause, and the breaker admitting
// concurrently at most its limit.
func testRemediation(ctx context.Context, t *testing.T, h *Harness) {
	st := h.Store
	pool := fixture(ctx, t, h)
	addNode(ctx, t, h, pool, "node_rm1")
	addNode(ctx, t, h, pool, "node_rm2")
	sh := store.ShardOf("node_rm1")

	// A node event naming a resolution is a finding; one without is not.
	xid95 := &sessionv1.GPUFinding{GpuUuid: "GPU-1", BoardSerial: "1320000000001", PciBusId: "00000000:07:00.0",
		Signal:              &sessionv1.GPUFinding_Xid{Xid: &sessionv1.XIDSignal{Code: 95, Mnemonic: "UNCONTAINED_ECC_ERROR"}},
		ImmediateResolution: "RESET_GPU", Resolution: "RESET_GPU", Health: sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED,
		Evidence:   &sessionv1.GPUFindingEvidence{Source: "kmsg", LogLine: "NVRM: Xid (PCI:0000:07:00): 95, pid=1, name=x"},
		ObservedAt: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC))}
	must(st.EventInsert(ctx, &store.Event{NodeID: "node_rm1", Kind: "gpu.xid", Severity: "critical", Message: "XID 95",
		GPUFinding: xid95}))
	must(st.EventInsert(ctx, &store.Event{NodeID: "node_rm1", Kind: "gpu.xid",
		GPUFinding: &sessionv1.GPUFinding{Signal: &sessionv1.GPUFinding_Xid{Xid: &sessionv1.XIDSignal{Code: 31}}}}))
	// A rolled-back event leaves no finding.
	boom := errors.New("roll back")
	if err := st.Tx(ctx, func(tx store.Store) error {
		must(tx.EventInsert(ctx, &store.Event{NodeID: "node_rm1", Kind: "gpu.xid", GPUFinding: &sessionv1.GPUFinding{
			Resolution: "RESTART_BM", Signal: &sessionv1.GPUFinding_Xid{Xid: &sessionv1.XIDSignal{Code: 79}}}}))
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("tx = %v", err)
	}
	if due := must(st.RemediationDue(ctx, []int{sh}, nil)); !slices.Equal(due, []int{sh}) {
		t.Fatalf("due = %v, want [%d]", due, sh)
	}
	fs := must(st.RemediationFindingsTake(ctx, sh, 10))
	if len(fs) != 1 || fs[0].NodeID != "node_rm1" || fs[0].Resolution != "RESET_GPU" || fs[0].XID != 95 ||
		fs[0].XIDMnemonic != "UNCONTAINED_ECC_ERROR" || fs[0].GPUUUID != "GPU-1" || fs[0].Kind != "gpu.xid" || fs[0].EventID == 0 {
		t.Fatalf("findings = %+v", fs)
	}
	if !proto.Equal(fs[0].GPUFinding, xid95) {
		t.Fatalf("finding read back = %v, want the one written, %v", fs[0].GPUFinding, xid95)
	}
	if again := must(st.RemediationFindingsTake(ctx, sh, 10)); len(again) != 0 {
		t.Fatalf("findings taken twice: %+v", again)
	}
	if due := must(st.RemediationDue(ctx, []int{sh}, nil)); len(due) != 0 {
		t.Fatalf("due after take = %v", due)
	}

	// One open case per node.
	now := time.Now().UTC().Truncate(time.Microsecond)
	c := must(st.RemediationCreate(ctx, &store.Remediation{NodeID: "node_rm1", State: store.RemediationDetected, Finding: "xid",
		Resolution: "RESET_GPU", XID: 95, GPUUUID: "GPU-1", Action: "gpu.reset", CreatedAt: now}, "remediation:w1"))
	if c.PoolID != pool.ID || c.Shard != sh || c.State != store.RemediationDetected || !c.NextAt.Equal(now) || c.ClosedAt != nil ||
		len(c.CommandIDs) != 0 {
		t.Fatalf("created %+v", c)
	}
	if _, err := st.RemediationCreate(ctx, &store.Remediation{NodeID: "node_rm1", State: store.RemediationDetected, Finding: "xid",
		Action: "reboot"}, "w"); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("second open case: %v, want ErrConflict", err)
	}
	if _, err := st.RemediationCreate(ctx, &store.Remediation{NodeID: "node_none", State: store.RemediationDetected, Finding: "xid",
		Action: "reboot"}, "w"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("case of an unknown node: %v, want ErrNotFound", err)
	}
	if got := must(st.RemediationOpenFor(ctx, "node_rm1")); got.ID != c.ID {
		t.Fatalf("open for node_rm1 = %s", got.ID)
	}

	// Guarded moves.
	later := now.Add(time.Minute)
	q := must(st.RemediationMove(ctx, &store.RemediationMoveParams{ID: c.ID, From: []string{store.RemediationDetected},
		To: store.RemediationQuarantined, Actor: "remediation:w1", Now: &now}))
	if q.QuarantinedAt == nil || !q.QuarantinedAt.Equal(now) {
		t.Fatalf("quarantined at %v", q.QuarantinedAt)
	}
	if _, err := st.RemediationMove(ctx, &store.RemediationMoveParams{ID: c.ID, From: []string{store.RemediationDetected},
		To: store.RemediationQuarantined, Actor: "remediation:w2"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a move from a state the case left: %v, want ErrNotFound", err)
	}
	one := 1
	r := must(st.RemediationMove(ctx, &store.RemediationMoveParams{ID: c.ID, To: store.RemediationRemediating, Attempts: &one,
		CommandID: "cmd_1", NextAt: &later, Actor: "remediation:w1"}))
	if r.Attempts != 1 || r.CommandID != "cmd_1" || !slices.Equal(r.CommandIDs, []string{"cmd_1"}) || !r.NextAt.Equal(later) {
		t.Fatalf("remediating %+v", r)
	}
	if open := must(st.RemediationOpenInShard(ctx, sh, &now, false)); len(open) != 0 {
		t.Fatalf("a case not yet due was listed: %+v", open)
	}
	if open := must(st.RemediationOpenInShard(ctx, sh, &later, false)); len(open) != 1 || open[0].ID != c.ID {
		t.Fatalf("due open cases = %+v", open)
	}
	p := must(st.RemediationSetPaused(ctx, c.ID, true, "token:op"))
	if !p.Paused {
		t.Fatal("not paused")
	}
	farLater := later.Add(time.Hour)
	if due := must(st.RemediationDue(ctx, []int{sh}, &farLater)); len(due) != 0 {
		t.Fatalf("a paused case is due: %v", due)
	}
	must(st.RemediationSetPaused(ctx, c.ID, false, "token:op"))
	must(st.RemediationMove(ctx, &store.RemediationMoveParams{ID: c.ID, To: store.RemediationVerifying, ClearCommand: true, Actor: "w"}))
	ret := must(st.RemediationMove(ctx, &store.RemediationMoveParams{ID: c.ID, To: store.RemediationReturned, Actor: "w"}))
	if ret.ClosedAt == nil || ret.CommandID != "" || !slices.Equal(ret.CommandIDs, []string{"cmd_1"}) {
		t.Fatalf("returned %+v", ret)
	}
	if _, err := st.RemediationOpenFor(ctx, "node_rm1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("open case after return: %v", err)
	}
	if _, err := st.RemediationMove(ctx, &store.RemediationMoveParams{ID: c.ID, To: store.RemediationDraining, Actor: "w"}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("move of a closed case: %v, want ErrNotFound", err)
	}
	// A new case for the node once the last closed.
	c2 := must(st.RemediationCreate(ctx, &store.Remediation{NodeID: "node_rm1", State: store.RemediationDetected, Finding: "gpu-lost",
		Action: "reboot"}, "w"))
	if list := must(st.RemediationList(ctx, &store.RemediationListParams{NodeID: "node_rm1"})); len(list) != 2 {
		t.Fatalf("list = %d cases", len(list))
	}
	if list := must(st.RemediationList(ctx, &store.RemediationListParams{NodeID: "node_rm1", OpenOnly: true})); len(list) != 1 || list[0].ID != c2.ID {
		t.Fatalf("open list = %+v", list)
	}

	// Each move was audited in its transaction.
	audit := must(st.AuditQuery(ctx, &store.AuditQueryParams{Resource: "remediation/" + c.ID, Limit: 100}))
	var actions []string
	for _, a := range audit {
		actions = append(actions, a.Action)
	}
	slices.Reverse(actions)
	want := []string{"remediation.detected", "remediation.quarantined", "remediation.remediating", "remediation.pause",
		"remediation.resume", "remediation.verifying", "remediation.returned"}
	if !slices.Equal(actions, want) {
		t.Fatalf("audit actions %v, want %v", actions, want)
	}

	// The breaker: concurrent admissions never exceed the limit; the one
	// past it trips it, and nothing is admitted until a reset.
	bp := fixture(ctx, t, h)
	var nodes []string
	for i := range 6 {
		id := "node_rmb" + string(rune('a'+i))
		addNode(ctx, t, h, bp, id)
		nodes = append(nodes, id)
	}
	var mu sync.Mutex
	var admitted, tripped int
	var wg sync.WaitGroup
	for _, id := range nodes {
		wg.Go(func() {
			err := st.Tx(ctx, func(tx store.Store) error {
				ok, tr, err := tx.RemediationBreakerAdmit(ctx, &store.RemediationBreakerAdmitParams{PoolID: bp.ID, Limit: 3, Window: time.Hour})
				if err != nil || !ok {
					mu.Lock()
					if tr {
						tripped++
					}
					mu.Unlock()
					return err
				}
				rc, err := tx.RemediationCreate(ctx, &store.Remediation{NodeID: id, State: store.RemediationDetected, Finding: "xid", Action: "reboot"}, "w")
				if err != nil {
					return err
				}
				if _, err := tx.RemediationMove(ctx, &store.RemediationMoveParams{ID: rc.ID, To: store.RemediationQuarantined, Actor: "w"}); err != nil {
					return err
				}
				mu.Lock()
				admitted++
				mu.Unlock()
				return nil
			})
			if err != nil {
				t.Errorf("admit %s: %v", id, err)
			}
		})
	}
	wg.Wait()
	if admitted != 3 || tripped != 1 {
		t.Fatalf("admitted %d, tripped %d; want 3 and 1", admitted, tripped)
	}
	bs := must(st.RemediationBreakers(ctx))
	i := slices.IndexFunc(bs, func(b *store.RemediationBreaker) bool { return b.PoolID == bp.ID })
	if i < 0 || bs[i].TrippedAt == nil {
		t.Fatalf("breakers = %+v", bs)
	}
	if ok, _, _ := st.RemediationBreakerAdmit(ctx, &store.RemediationBreakerAdmitParams{PoolID: bp.ID, Limit: 100, Window: time.Hour}); ok {
		t.Fatal("a tripped breaker admitted")
	}
	if _, err := st.RemediationBreakerReset(ctx, "pool_none", "token:op", nil); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("reset of an unknown pool: %v", err)
	}
	must(st.RemediationBreakerReset(ctx, bp.ID, "token:op", nil))
	if ok, _, _ := st.RemediationBreakerAdmit(ctx, &store.RemediationBreakerAdmitParams{PoolID: bp.ID, Limit: 3, Window: time.Hour}); !ok {
		t.Fatal("a reset breaker refused: quarantines before the reset count")
	}
	testRemediationRecent(ctx, t, h, pool)
	testBreakerShare(ctx, t, h)
}

// testBreakerShare: the breaker counts distinct nodes (a node acted on
// again counts once), lets the pool's older held cases go first, closes by
// itself a window after it tripped (evented breaker-reset by window), and
// RemediationBreakerStates shows every pool with its nodes acted on, held
// cases and GPU nodes (issue 33).
func testBreakerShare(ctx context.Context, t *testing.T, h *Harness) {
	st := h.Store
	bp := fixture(ctx, t, h)
	var nodes []string
	for i := range 4 {
		id := "node_rms" + string(rune('a'+i))
		addNode(ctx, t, h, bp, id)
		nodes = append(nodes, id)
	}
	if err := st.NodeSetInventory(ctx, nodes[0], []byte(`{"gpus":[{"uuid":"GPU-1"}]}`), "d1"); err != nil {
		t.Fatal(err)
	}
	if err := st.NodeSetInventory(ctx, nodes[1], []byte(`{"gpus":[]}`), "d2"); err != nil {
		t.Fatal(err)
	}
	if n := must(st.PoolGPUNodes(ctx, bp.ID)); n != 1 {
		t.Fatalf("GPU nodes %d, want 1 (one inventory lists a GPU, one an empty list, two none)", n)
	}
	t0 := time.Now().UTC().Truncate(time.Second)
	at := func(d time.Duration) *time.Time { x := t0.Add(d); return &x }
	admit := func(node string, c *store.Remediation, now *time.Time) (bool, bool) {
		p := &store.RemediationBreakerAdmitParams{PoolID: bp.ID, Limit: 1, Window: time.Hour, NodeID: node, Now: now}
		if c != nil {
			p.CaseID, p.CreatedAt = c.ID, c.CreatedAt
		}
		ok, tr, err := st.RemediationBreakerAdmit(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		return ok, tr
	}
	open := func(node, state string, created *time.Time) *store.Remediation {
		return must(st.RemediationCreate(ctx, &store.Remediation{NodeID: node, State: state, Finding: "xid", Action: "reboot",
			CreatedAt: *created}, "w"))
	}
	// Node a is acted on; acted on again, it counts once.
	if ok, _ := admit(nodes[0], nil, at(0)); !ok {
		t.Fatal("the first node refused")
	}
	ca := open(nodes[0], store.RemediationDetected, at(0))
	must(st.RemediationMove(ctx, &store.RemediationMoveParams{ID: ca.ID, To: store.RemediationQuarantined, Actor: "w", Now: at(0)}))
	if ok, tr := admit(nodes[0], nil, at(time.Minute)); !ok || tr {
		t.Fatalf("node a again within the window: admitted %v, tripped %v; want admitted (it counts once)", ok, tr)
	}
	// Node b trips it; held cases of b and c wait.
	hb := open(nodes[1], store.RemediationHeld, at(2*time.Minute))
	if ok, tr := admit(nodes[1], hb, at(2*time.Minute)); ok || !tr {
		t.Fatalf("node b past the limit: admitted %v, tripped %v; want tripped", ok, tr)
	}
	hc := open(nodes[2], store.RemediationHeld, at(3*time.Minute))
	states := must(st.RemediationBreakerStates(ctx, time.Hour, at(4*time.Minute)))
	i := slices.IndexFunc(states, func(b *store.RemediationBreakerState) bool { return b.PoolID == bp.ID })
	if i < 0 || states[i].TrippedAt == nil || states[i].Acted != 1 || states[i].Held != 2 || states[i].GPUNodes != 1 {
		t.Fatalf("breaker state %+v, want tripped, 1 acted on, 2 held, 1 GPU node", states[i])
	}
	// A window after the trip it closes by itself; node a's quarantine has
	// left the window; the older held case (b) goes first: c waits.
	if ok, tr := admit(nodes[2], hc, at(2*time.Minute+time.Hour)); ok || tr {
		t.Fatalf("the newer held case after the window: admitted %v, tripped %v; want neither (b goes first)", ok, tr)
	}
	if ok, _ := admit(nodes[1], hb, at(2*time.Minute+time.Hour)); !ok {
		t.Fatal("the oldest held case refused after the window")
	}
	bs := must(st.RemediationBreakers(ctx))
	if i := slices.IndexFunc(bs, func(b *store.RemediationBreaker) bool { return b.PoolID == bp.ID }); i < 0 ||
		bs[i].TrippedAt != nil || bs[i].ResetBy != "window" {
		t.Fatalf("breaker after its window: %+v, want closed by window", bs)
	}
	es := must(h.Store.OutboxQuery(ctx, &store.OutboxQueryParams{Key: bp.ID, TopicPrefix: "com.better-compute.remediation.breaker-reset"}))
	if len(es) != 1 {
		t.Fatalf("%d breaker-reset events, want 1 (closed by its window)", len(es))
	}
}

// testRemediationRecent: a node's cases, open and closed, created since a
// time come back newest first (the repeat rules' memory), the history of a
// move goes into its event, and another node's cases never do.
func testRemediationRecent(ctx context.Context, t *testing.T, h *Harness, pool *store.Pool) {
	st := h.Store
	addNode(ctx, t, h, pool, "node_rm3")
	addNode(ctx, t, h, pool, "node_rm4")
	now := time.Now().UTC().Truncate(time.Microsecond)
	old := now.Add(-2 * time.Hour)
	first := must(st.RemediationCreate(ctx, &store.Remediation{NodeID: "node_rm3", State: store.RemediationDetected,
		Finding: "xid", XID: 79, GPUUUID: "GPU-3", Action: "reboot", CreatedAt: old}, "remediation:w1"))
	first = must(st.RemediationMove(ctx, &store.RemediationMoveParams{ID: first.ID, To: store.RemediationReturned,
		CommandID: "cmd_rm3", Actor: "remediation:w1", Now: &old}))
	second := must(st.RemediationCreate(ctx, &store.Remediation{NodeID: "node_rm3", State: store.RemediationDetected,
		Finding: "xid", XID: 79, GPUUUID: "GPU-3", Action: "escalate", CreatedAt: now}, "remediation:w1"))
	must(st.RemediationCreate(ctx, &store.Remediation{NodeID: "node_rm4", State: store.RemediationDetected,
		Finding: "xid", Action: "reboot", CreatedAt: now}, "remediation:w1"))
	ids := func(cs []*store.Remediation) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.ID)
		}
		return out
	}
	if got := ids(must(st.RemediationRecent(ctx, "node_rm3", now.Add(-3*time.Hour), 0))); !slices.Equal(got, []string{second.ID, first.ID}) {
		t.Fatalf("recent over 3h = %v, want [%s %s]", got, second.ID, first.ID)
	}
	if got := ids(must(st.RemediationRecent(ctx, "node_rm3", now.Add(-time.Hour), 0))); !slices.Equal(got, []string{second.ID}) {
		t.Fatalf("recent over 1h = %v, want [%s]", got, second.ID)
	}
	back := must(st.RemediationRecent(ctx, "node_rm3", now.Add(-3*time.Hour), 1))
	if len(back) != 1 || back[0].ID != second.ID {
		t.Fatalf("recent, limit 1 = %v", ids(back))
	}
	if got := must(st.RemediationRecent(ctx, "node_rm3", now.Add(-3*time.Hour), 0)); len(got[1].CommandIDs) != 1 || got[1].ClosedAt == nil {
		t.Fatalf("the closed case read back %+v", got[1])
	}
	must(st.RemediationMove(ctx, &store.RemediationMoveParams{ID: second.ID, To: store.RemediationEscalated,
		Reason: "repeated: test", History: []*store.Remediation{first}, Actor: "remediation:w1", Now: &now}))
	es := must(st.OutboxQuery(ctx, &store.OutboxQueryParams{Key: "node_rm3", TopicPrefix: events.RemediationEscalated, Limit: 10}))
	if len(es) != 1 {
		t.Fatalf("escalated events = %d, want 1", len(es))
	}
	var env struct {
		Data events.RemediationData `json:"data"`
	}
	if err := json.Unmarshal(es[0].Payload, &env); err != nil {
		t.Fatal(err)
	}
	if env.Data.RemediationID == "" {
		if err := json.Unmarshal(es[0].Payload, &env.Data); err != nil {
			t.Fatal(err)
		}
	}
	if h := env.Data.History; len(h) != 1 || h[0].RemediationID != first.ID || h[0].Actions != 1 || h[0].ClosedAt == nil {
		t.Fatalf("escalated event's history = %+v, want case %s, 1 action, closed", h, first.ID)
	}
}

// remediationEvents makes every remediation event once, for testEvents.
func remediationEvents(ctx context.Context, t *testing.T, h *Harness, pool *store.Pool) {
	st := h.Store
	addNode(ctx, t, h, pool, "node_ev5")
	c := must(st.RemediationCreate(ctx, &store.Remediation{NodeID: "node_ev5", State: store.RemediationDetected, Finding: "xid",
		Resolution: "RESTART_BM", XID: 79, Action: "reboot"}, "remediation"))
	for _, to := range []string{store.RemediationHeld, store.RemediationQuarantined, store.RemediationDraining,
		store.RemediationRemediating, store.RemediationVerifying, store.RemediationEscalated} {
		must(st.RemediationMove(ctx, &store.RemediationMoveParams{ID: c.ID, To: to, Actor: "remediation"}))
	}
	must(st.RemediationSetPaused(ctx, c.ID, true, "token:op"))
	must(st.RemediationSetPaused(ctx, c.ID, false, "token:op"))
	must(st.RemediationMove(ctx, &store.RemediationMoveParams{ID: c.ID, To: store.RemediationReturned, Actor: "token:op"}))
	if _, tripped, err := st.RemediationBreakerAdmit(ctx, &store.RemediationBreakerAdmitParams{PoolID: pool.ID, Limit: 1, Window: time.Hour}); err != nil || !tripped {
		t.Fatalf("breaker admit: tripped %v, %v", tripped, err)
	}
	must(st.RemediationBreakerReset(ctx, pool.ID, "token:op", nil))
}
