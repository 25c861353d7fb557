package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// reservationNodes makes n ready nodes in pool, named prefix-0 ... .
func reservationNodes(ctx context.Context, t *testing.T, h *Harness, pool *store.Pool, prefix string, n int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		id := fmt.Sprintf("%s-%d", prefix, i)
		addNode(ctx, t, h, pool, id)
		check(t, h.Store.NodeSetState(ctx, id, store.NodeReady))
		ids = append(ids, id)
	}
	return ids
}

// gpuSlots are the slots of GPUs gpus of node.
func gpuSlots(node string, gpus ...int) []*store.ReservationSlot {
	var out []*store.ReservationSlot
	for _, g := range gpus {
		out = append(out, &store.ReservationSlot{NodeID: node, GPU: g, GPUUUID: fmt.Sprintf("GPU-%s-%d", node, g)})
	}
	return out
}

// testReservations: create, place, the no-double-booking rule (an
// overlapping slot is refused, an adjacent one is not), labels while
// active, cancel, extend, NodeReservedNow and node-failed once.
func testReservations(ctx context.Context, t *testing.T, h *Harness) {
	st := h.Store
	pool := fixture(ctx, t, h)
	nodes := reservationNodes(ctx, t, h, pool, "rn", 2)
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	create := func(start, end time.Time, gpus int) *store.Reservation {
		return must(st.ReservationCreate(ctx, &store.ReservationCreateParams{PoolID: pool.ID, GPUs: gpus, Start: start, End: end,
			Owner: "team-a", Note: "training", CreatedBy: "token:t", Selector: map[string]string{"rack": "r1"}}))
	}
	a := create(t0, t0.Add(2*time.Hour), 2)
	if a.State != store.ReservationPending || a.Owner != "team-a" || a.Selector["rack"] != "r1" || !a.Start.Equal(t0) || len(a.Slots) != 0 {
		t.Fatalf("created %+v", a)
	}
	_, err := st.ReservationCreate(ctx, &store.ReservationCreateParams{PoolID: "pool_missing", GPUs: 1, Start: t0, End: t0.Add(time.Hour), Owner: "x"})
	wantErr(t, err, store.ErrNotFound)

	a = must(st.ReservationPlace(ctx, &store.ReservationPlaceParams{ID: a.ID, Slots: gpuSlots(nodes[0], 0, 1)}))
	if a.State != store.ReservationPlaced || len(a.Slots) != 2 || !a.Slots[0].Start.Equal(t0) || !a.Slots[1].End.Equal(t0.Add(2*time.Hour)) ||
		a.Slots[1].GPUUUID != "GPU-rn-0-1" {
		t.Fatalf("placed %+v slots %+v", a, a.Slots)
	}
	// Overlapping GPU 1 of rn-0: refused, nothing changed.
	b := create(t0.Add(time.Hour), t0.Add(3*time.Hour), 2)
	_, err = st.ReservationPlace(ctx, &store.ReservationPlaceParams{ID: b.ID, Slots: gpuSlots(nodes[0], 1, 2)})
	wantErr(t, err, store.ErrConflict)
	if got := must(st.ReservationGet(ctx, b.ID)); got.State != store.ReservationPending || len(got.Slots) != 0 {
		t.Fatalf("after a refused placement: %+v", got)
	}
	// Adjacent in time on the same GPUs, or other GPUs at once: fine.
	c := create(t0.Add(2*time.Hour), t0.Add(4*time.Hour), 2)
	must(st.ReservationPlace(ctx, &store.ReservationPlaceParams{ID: c.ID, Slots: gpuSlots(nodes[0], 0, 1)}))
	must(st.ReservationPlace(ctx, &store.ReservationPlaceParams{ID: b.ID, Slots: gpuSlots(nodes[0], 2, 3)}))
	// A swap moves b to the other node and releases its first GPUs.
	b = must(st.ReservationPlace(ctx, &store.ReservationPlaceParams{ID: b.ID, Slots: gpuSlots(nodes[1], 0, 1), Reason: "moved"}))
	if ids := b.NodeIDs(); len(ids) != 1 || ids[0] != nodes[1] || b.Reason != "moved" {
		t.Fatalf("swapped to %v (%q)", ids, b.Reason)
	}
	slots := must(st.ReservationSlots(ctx, &store.ReservationSlotsParams{PoolID: pool.ID, From: t0, To: t0.Add(5 * time.Hour)}))
	if len(slots) != 6 {
		t.Fatalf("held slots = %d, want 6 (a 2, b 2, c 2): %+v", len(slots), slots)
	}
	// The whole history never holds two overlapping slots of one GPU.
	checkNoOverlap(t, slots)
	if st.Dialect() == store.DialectPostgres {
		// The database itself refuses a double booking, whatever writes it
		// (the exclusion constraint of 0015_reservations).
		err := h.Exec(ctx, `INSERT INTO reservation_slots (reservation_id, pool_id, node_id, gpu, starts_at, ends_at)
			VALUES ('`+c.ID+`', '`+pool.ID+`', '`+nodes[0]+`', 0, '2030-01-01T01:00:00Z', '2030-01-01T01:30:00Z')`)
		if err == nil || !strings.Contains(err.Error(), "reservation_slots_no_double_booking") {
			t.Fatalf("a raw overlapping insert: %v, want the exclusion constraint's violation", err)
		}
	}

	// Extending a into c's time on the same GPUs is refused; c can grow.
	_, err = st.ReservationExtend(ctx, &store.ReservationExtendParams{ID: a.ID, End: t0.Add(3 * time.Hour)})
	wantErr(t, err, store.ErrConflict)
	c = must(st.ReservationExtend(ctx, &store.ReservationExtendParams{ID: c.ID, End: t0.Add(6 * time.Hour)}))
	if !c.End.Equal(t0.Add(6*time.Hour)) || !c.Slots[0].End.Equal(c.End) {
		t.Fatalf("extended %+v %+v", c, c.Slots[0])
	}

	// Active: labels on the node; NodeReservedNow sees it.
	at := t0.Add(30 * time.Minute)
	must(st.ReservationTransition(ctx, &store.ReservationTransitionParams{ID: a.ID, From: store.ReservationPlaced, To: store.ReservationActive, Now: &at}))
	n := must(st.NodeGet(ctx, nodes[0]))
	if n.Labels[store.ReservationLabelID] != a.ID || n.Labels[store.ReservationLabelOwner] != "team-a" {
		t.Fatalf("labels of an active reservation's node: %v", n.Labels)
	}
	if r := must(st.NodeReservedNow(ctx, nodes[0], &at)); r == nil || r.ID != a.ID {
		t.Fatalf("NodeReservedNow(%s) = %+v, want %s", nodes[0], r, a.ID)
	}
	free := t0.Add(-time.Hour)
	if r := must(st.NodeReservedNow(ctx, nodes[0], &free)); r != nil {
		t.Fatalf("NodeReservedNow before any window = %s", r.ID)
	}
	_, err = st.ReservationTransition(ctx, &store.ReservationTransitionParams{ID: a.ID, From: store.ReservationPlaced, To: store.ReservationActive})
	wantErr(t, err, store.ErrConflict)
	if rep := must(st.ReservationNodeFailed(ctx, &store.ReservationNodeFailedParams{ID: a.ID, NodeID: nodes[0], Reason: "quarantined"})); !rep {
		t.Fatal("first node failure not reported")
	}
	if rep := must(st.ReservationNodeFailed(ctx, &store.ReservationNodeFailedParams{ID: a.ID, NodeID: nodes[0], Reason: "quarantined"})); rep {
		t.Fatal("a node failure reported twice")
	}

	// Cancel while active: its slots end at the cancel, labels go.
	cut := t0.Add(time.Hour)
	a = must(st.ReservationCancel(ctx, &store.ReservationCancelParams{ID: a.ID, Reason: "done early", Now: &cut}))
	if a.State != store.ReservationCancelled || len(a.Slots) != 2 || !a.Slots[0].End.Equal(cut) {
		t.Fatalf("cancelled %+v slots %+v", a, a.Slots)
	}
	if n := must(st.NodeGet(ctx, nodes[0])); n.Labels[store.ReservationLabelID] != "" {
		t.Fatalf("labels after cancel: %v", n.Labels)
	}
	_, err = st.ReservationCancel(ctx, &store.ReservationCancelParams{ID: a.ID})
	wantErr(t, err, store.ErrConflict)
	// Cancelling a placed reservation before its start frees it whole.
	before := t0
	b = must(st.ReservationCancel(ctx, &store.ReservationCancelParams{ID: b.ID, Now: &before}))
	if len(b.Slots) != 0 {
		t.Fatalf("slots of a reservation cancelled before its start: %+v", b.Slots)
	}
	_, err = st.ReservationGet(ctx, "res_missing")
	wantErr(t, err, store.ErrNotFound)

	list := must(st.ReservationList(ctx, &store.ReservationListParams{PoolID: pool.ID, State: store.ReservationCancelled}))
	if len(list) != 2 {
		t.Fatalf("cancelled reservations listed: %d", len(list))
	}
	open := must(st.ReservationsOpen(ctx, []string{pool.ID}))
	if len(open) != 1 || open[0].ID != c.ID || len(open[0].Slots) != 2 {
		t.Fatalf("open reservations: %+v", open)
	}
	if got := must(st.ReservationPoolsOpen(ctx, []string{pool.ID, "pool_without"})); len(got) != 1 || got[0] != pool.ID {
		t.Fatalf("pools with open reservations: %v", got)
	}
	rn := must(st.ReservationNodes(ctx, pool.ID))
	if len(rn) != 2 || rn[0].State != store.NodeReady {
		t.Fatalf("reservation nodes: %+v", rn)
	}
}

// testReservationGrants: a reservation's holder and grants are stored;
// ReservationGrantsOn answers them on its node only inside its window
// (not before, not at its end), with the slots' end, follows an extend,
// ends at a cancel, and ignores reservations without grants.
func testReservationGrants(ctx context.Context, t *testing.T, h *Harness) {
	st := h.Store
	pool := fixture(ctx, t, h)
	nodes := reservationNodes(ctx, t, h, pool, "rg", 2)
	t0 := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	r := must(st.ReservationCreate(ctx, &store.ReservationCreateParams{PoolID: pool.ID, GPUs: 1, Start: t0, End: t0.Add(time.Hour),
		Owner: "team-g", TenantID: store.RootTenant, Grants: []string{store.GrantExec, store.GrantShell}}))
	if r.TenantID != store.RootTenant || len(r.Grants) != 2 || r.Grants[0] != store.GrantExec {
		t.Fatalf("created %+v: want tenant root, grants exec,shell", r)
	}
	plain := must(st.ReservationCreate(ctx, &store.ReservationCreateParams{PoolID: pool.ID, GPUs: 1, Start: t0, End: t0.Add(time.Hour), Owner: "x"}))
	if plain.TenantID != store.RootTenant || len(plain.Grants) != 0 {
		t.Fatalf("created without grants %+v", plain)
	}
	must(st.ReservationPlace(ctx, &store.ReservationPlaceParams{ID: r.ID, Slots: gpuSlots(nodes[0], 0)}))
	must(st.ReservationPlace(ctx, &store.ReservationPlaceParams{ID: plain.ID, Slots: gpuSlots(nodes[0], 1)}))
	at := func(node string, when time.Time) []*store.ReservationGrant {
		return must(st.ReservationGrantsOn(ctx, node, &when))
	}
	if g := at(nodes[0], t0.Add(-time.Second)); len(g) != 0 {
		t.Fatalf("before the start: %+v", g)
	}
	g := at(nodes[0], t0)
	if len(g) != 1 || g[0].ReservationID != r.ID || g[0].TenantID != store.RootTenant || len(g[0].Grants) != 2 || !g[0].End.Equal(t0.Add(time.Hour)) {
		t.Fatalf("at the start: %+v", g)
	}
	if g := at(nodes[1], t0.Add(time.Minute)); len(g) != 0 {
		t.Fatalf("on another node: %+v", g)
	}
	if g := at(nodes[0], t0.Add(time.Hour)); len(g) != 0 {
		t.Fatalf("at the end: %+v", g)
	}
	must(st.ReservationExtend(ctx, &store.ReservationExtendParams{ID: r.ID, End: t0.Add(2 * time.Hour)}))
	if g := at(nodes[0], t0.Add(90*time.Minute)); len(g) != 1 || !g[0].End.Equal(t0.Add(2*time.Hour)) {
		t.Fatalf("after extend: %+v", g)
	}
	cut := t0.Add(10 * time.Minute)
	must(st.ReservationCancel(ctx, &store.ReservationCancelParams{ID: r.ID, Now: &cut}))
	if g := at(nodes[0], t0.Add(11*time.Minute)); len(g) != 0 {
		t.Fatalf("after cancel: %+v", g)
	}
	// A grant flows only from the pool's current owner: a tenant's grant on
	// its own pool gives nothing once the pool is another tenant's.
	holder := must(st.TenantCreate(ctx, &store.TenantCreateParams{Name: "rg-holder-" + store.NewID("x"), ParentID: store.RootTenant}))
	other := must(st.TenantCreate(ctx, &store.TenantCreateParams{Name: "rg-other-" + store.NewID("x"), ParentID: store.RootTenant}))
	own := must(st.PoolCreate(ctx, &store.PoolCreateParams{Name: "rg-own-" + store.NewID("x"), SiteID: pool.SiteID, TenantID: holder.ID}))
	node := reservationNodes(ctx, t, h, own, "rgo", 1)[0]
	mine := must(st.ReservationCreate(ctx, &store.ReservationCreateParams{PoolID: own.ID, GPUs: 1, Start: t0, End: t0.Add(time.Hour),
		Owner: "team-h", TenantID: holder.ID, Grants: []string{store.GrantShell}}))
	must(st.ReservationPlace(ctx, &store.ReservationPlaceParams{ID: mine.ID, Slots: gpuSlots(node, 0)}))
	if g := at(node, t0); len(g) != 1 || g[0].TenantID != holder.ID {
		t.Fatalf("the holder's grant on its own pool: %+v", g)
	}
	must(st.PoolMove(ctx, own.ID, other.ID))
	if g := at(node, t0); len(g) != 0 {
		t.Fatalf("after the pool moved to another tenant, its old owner's grant still gives %+v", g)
	}
	must(st.PoolMove(ctx, own.ID, store.RootTenant))
	if g := at(node, t0); len(g) != 1 {
		t.Fatalf("the pool back with the root, above the holder: %+v, want the grant again", g)
	}
}

// testReservationConcurrentBooking: writers racing for the same GPUs of
// one node in overlapping windows; the store admits exactly the ones that
// do not overlap, refusing the others with ErrConflict.
func testReservationConcurrentBooking(ctx context.Context, t *testing.T, h *Harness) {
	st := h.Store
	pool := fixture(ctx, t, h)
	node := reservationNodes(ctx, t, h, pool, "cb", 1)[0]
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var rs []*store.Reservation
	for i := range 40 {
		// Windows of 2 h starting every 30 min: each overlaps its 3 neighbours on each side.
		start := t0.Add(time.Duration(i) * 30 * time.Minute)
		rs = append(rs, must(st.ReservationCreate(ctx, &store.ReservationCreateParams{PoolID: pool.ID, GPUs: 1,
			Start: start, End: start.Add(2 * time.Hour), Owner: "o"})))
	}
	var wg sync.WaitGroup
	errs := make([]error, len(rs))
	for i, r := range rs {
		wg.Go(func() {
			_, errs[i] = st.ReservationPlace(ctx, &store.ReservationPlaceParams{ID: r.ID, Slots: gpuSlots(node, 0)})
		})
	}
	wg.Wait()
	placed := 0
	for i, err := range errs {
		switch {
		case err == nil:
			placed++
		case !errors.Is(err, store.ErrConflict):
			t.Fatalf("place %d: %v", i, err)
		}
	}
	slots := must(st.ReservationSlots(ctx, &store.ReservationSlotsParams{From: t0.Add(-time.Hour), To: t0.Add(48 * time.Hour)}))
	checkNoOverlap(t, slots)
	if placed == 0 || placed != len(slots) {
		t.Fatalf("%d placements succeeded, %d slots held", placed, len(slots))
	}
}

// checkNoOverlap fails when two slots of one GPU overlap in time.
func checkNoOverlap(t *testing.T, slots []*store.ReservationSlot) {
	t.Helper()
	type key struct {
		node string
		gpu  int
	}
	by := map[key][]*store.ReservationSlot{}
	for _, s := range slots {
		by[key{s.NodeID, s.GPU}] = append(by[key{s.NodeID, s.GPU}], s)
	}
	for k, l := range by {
		for i, a := range l {
			for _, b := range l[i+1:] {
				if a.Start.Before(b.End) && b.Start.Before(a.End) && a.Start.Before(a.End) && b.Start.Before(b.End) {
					t.Fatalf("GPU %d of %s booked twice: %s [%s, %s) and %s [%s, %s)", k.gpu, k.node,
						a.ReservationID, a.Start, a.End, b.ReservationID, b.Start, b.End)
				}
			}
		}
	}
}

// produceReservationEvents writes every reservation.* event for
// testEvents.
func produceReservationEvents(ctx context.Context, t *testing.T, h *Harness, pool *store.Pool) {
	st := h.Store
	node := addNode(ctx, t, h, pool, "ev-res-0").ID // not made ready: testEvents counts node.ready
	t0 := time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	mk := func(i int) *store.Reservation {
		start := t0.Add(time.Duration(i) * 24 * time.Hour)
		return must(st.ReservationCreate(ctx, &store.ReservationCreateParams{PoolID: pool.ID, GPUs: 1, Start: start,
			End: start.Add(time.Hour), Owner: "team-ev"}))
	}
	a, b, c := mk(0), mk(1), mk(2)
	must(st.ReservationPlace(ctx, &store.ReservationPlaceParams{ID: a.ID, Slots: gpuSlots(node, 0)}))
	in := t0.Add(time.Minute)
	must(st.ReservationTransition(ctx, &store.ReservationTransitionParams{ID: a.ID, From: store.ReservationPlaced, To: store.ReservationActive, Now: &in}))
	must(st.ReservationExtend(ctx, &store.ReservationExtendParams{ID: a.ID, End: t0.Add(2 * time.Hour)}))
	must(st.ReservationNodeFailed(ctx, &store.ReservationNodeFailedParams{ID: a.ID, NodeID: node, Reason: "quarantined", Now: &in}))
	end := t0.Add(2 * time.Hour)
	must(st.ReservationTransition(ctx, &store.ReservationTransitionParams{ID: a.ID, From: store.ReservationActive, To: store.ReservationEnded, Now: &end}))
	must(st.ReservationTransition(ctx, &store.ReservationTransitionParams{ID: b.ID, From: store.ReservationPending, To: store.ReservationFailed,
		Reason: "no capacity"}))
	must(st.ReservationCancel(ctx, &store.ReservationCancelParams{ID: c.ID, Reason: "not needed"}))
}
