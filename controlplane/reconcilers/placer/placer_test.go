package placer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/api"
	"github.com/better-compute/better-compute/controlplane/pkg/client"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/reconcilers/placer"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/postgres"
	"github.com/better-compute/better-compute/controlplane/store/postgres/pgtest"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// eachBackend runs fn against a fresh, migrated store of each backend.
func eachBackend(t *testing.T, fn func(t *testing.T, st store.Store)) {
	for _, b := range []struct {
		name string
		open func(t *testing.T) store.Store
	}{
		{"sqlite", func(t *testing.T) store.Store {
			st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "state.db"))
			if err != nil {
				t.Fatal(err)
			}
			return st
		}},
		{"postgres", func(t *testing.T) store.Store {
			st, err := postgres.Open(context.Background(), pgtest.URL(t))
			if err != nil {
				t.Fatal(err)
			}
			return st
		}},
	} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			st := b.open(t)
			t.Cleanup(func() { st.Close() })
			if _, err := st.Migrate(context.Background()); err != nil {
				t.Fatal(err)
			}
			fn(t, st)
		})
	}
}

// clock is a settable placer.Clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

const h100 = "NVIDIA H100 80GB HBM3"

// simPool makes a pool of n ready nodes (sim-00 ...) with gpus H100s each.
func simPool(t *testing.T, st store.Store, n, gpus int) (*store.Pool, []string) {
	t.Helper()
	ctx := context.Background()
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "site-" + store.NewID("s"), Region: "eu-1"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "pool-" + store.NewID("p"), SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range n {
		id := fmt.Sprintf("sim-%02d-%s", i, pool.ID[len(pool.ID)-4:])
		if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: pool.ID, Hostname: id, MachineID: "m-" + id}); err != nil {
			t.Fatal(err)
		}
		if err := st.NodeSetState(ctx, id, store.NodeReady); err != nil {
			t.Fatal(err)
		}
		setInventory(t, st, id, gpus, -1)
		ids = append(ids, id)
	}
	return pool, ids
}

// setInventory stores an inventory of gpus H100s for node, GPU failed
// (-1: none) failed.
func setInventory(t *testing.T, st store.Store, node string, gpus, failed int) {
	t.Helper()
	inv := &sessionv1.Inventory{}
	for g := range gpus {
		gpu := &sessionv1.GPU{Index: uint32(g), Name: h100, Uuid: fmt.Sprintf("GPU-%s-%d", node, g), MemoryTotalBytes: 81559 << 20}
		if g == failed {
			gpu.Health = &sessionv1.GPUHealth{State: sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED}
		}
		inv.Gpus = append(inv.Gpus, gpu)
	}
	b, err := protojson.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.NodeSetInventory(context.Background(), node, b, fmt.Sprintf("d-%d-%d", gpus, failed)); err != nil {
		t.Fatal(err)
	}
}

// outboxOf returns the data of every event of typ about subject, oldest
// first.
func outboxOf(t *testing.T, st store.Store, typ, subject string) []events.ReservationData {
	t.Helper()
	entries, err := st.OutboxQuery(context.Background(), &store.OutboxQueryParams{TopicPrefix: typ, Key: subject, Ascending: true, Limit: store.MaxListLimit})
	if err != nil {
		t.Fatal(err)
	}
	var out []events.ReservationData
	for _, e := range entries {
		if e.Topic != typ {
			continue
		}
		env, err := events.Parse(e.Payload)
		if err != nil {
			t.Fatal(err)
		}
		var d events.ReservationData
		if err := json.Unmarshal(env.Data, &d); err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

// TestConcurrentCreates: 1,000 concurrent reservations.create calls, over
// HTTP, for overlapping windows on a pool of 20 simulated nodes of 8 GPUs,
// while two placers (as two scheduler processes around a lease takeover
// would) place the same pool at once. Every request ends placed, with
// exactly the GPUs it asked for, or failed with a reason; and the whole
// history of slots never holds one GPU twice for overlapping time.
func TestConcurrentCreates(t *testing.T) {
	eachBackend(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		pool, _ := simPool(t, st, 20, 8)
		srv := api.New(api.Config{Secret: strings.Repeat("s", 32)}, st, nil)
		hs := httptest.NewServer(srv.Handler())
		defer hs.Close()
		secret, _, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleOperator})
		if err != nil {
			t.Fatal(err)
		}
		c := &client.Client{BaseURL: hs.URL + "/api", Token: secret}

		base := time.Now().Add(time.Hour).Truncate(time.Minute)
		const n = 1000
		var created sync.Map
		var createErrs []error
		var mu sync.Mutex
		done := make(chan struct{})
		// Each reservation created nudges the placers, and each round a
		// placer finishes is announced on rounds: they race the creators
		// and each other, paced by the work, not by a ticker.
		nudge := make(chan struct{}, 1)
		rounds := make(chan struct{}, 1)
		poke := func(ch chan struct{}) {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
		var placers sync.WaitGroup
		for i := range 2 {
			p := placer.New(placer.Config{}, st, nil)
			placers.Go(func() {
				for {
					select {
					case <-done:
						return
					case <-nudge:
					}
					if _, err := p.PlacePool(ctx, st, pool.ID); err != nil && !strings.Contains(err.Error(), "conflict") {
						// A conflict rolls the round back (PostgreSQL's
						// exclusion constraint aborts the transaction): the
						// next round tries again.
						t.Logf("placer %d: %v", i, err)
					}
					poke(rounds)
				}
			})
		}
		sem := make(chan struct{}, 64)
		var wg sync.WaitGroup
		for i := range n {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				rng := rand.New(rand.NewPCG(uint64(i), 7))
				req := &apiv1.CreateReservationRequest{Pool: pool.Name, Owner: fmt.Sprintf("team-%d", i%7), GpuModel: "h100"}
				switch k := rng.IntN(10); {
				case k < 7:
					req.Gpus = []int32{1, 2, 3, 4, 8}[rng.IntN(5)]
				case k < 9:
					req.Gpus = 16
				default:
					req.Nodes = int32(1 + rng.IntN(2))
				}
				start := base.Add(time.Duration(rng.IntN(96)) * 30 * time.Minute)
				req.Start = timestamppb.New(start)
				req.End = timestamppb.New(start.Add(time.Duration(1+rng.IntN(6)) * time.Hour))
				r, err := c.ReservationsCreate(ctx, req)
				if err != nil {
					mu.Lock()
					createErrs = append(createErrs, err)
					mu.Unlock()
					return
				}
				created.Store(r.Id, req)
				poke(nudge)
			})
		}
		wg.Wait()
		if len(createErrs) > 0 {
			t.Fatalf("%d reservations.create calls failed, the first: %v", len(createErrs), createErrs[0])
		}
		// Until nothing is pending.
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		for {
			open, err := st.ReservationsOpen(ctx, []string{pool.ID})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(open, func(r *store.Reservation) bool { return r.State == store.ReservationPending }) {
				break
			}
			poke(nudge)
			select {
			case <-rounds:
			case <-wctx.Done():
				t.Fatal("reservations still pending after 60 s")
			}
		}
		close(done)
		placers.Wait()

		var all []*store.Reservation
		lp := store.ReservationListParams{ListParams: store.ListParams{Limit: store.MaxListLimit}, PoolID: pool.ID}
		for {
			page, err := st.ReservationList(ctx, &lp)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, page...)
			if len(page) < lp.Limit {
				break
			}
			lp.Cursor = page[len(page)-1].ID
		}
		if len(all) != n {
			t.Fatalf("%d reservations, want %d", len(all), n)
		}
		placed, failed := 0, 0
		for _, r := range all {
			v, _ := created.Load(r.ID)
			req := v.(*apiv1.CreateReservationRequest)
			switch r.State {
			case store.ReservationPlaced:
				placed++
				want := int(req.Gpus)
				if req.Nodes > 0 {
					want = int(req.Nodes) * 8
				}
				if len(r.Slots) != want {
					t.Fatalf("%s asked for %d GPUs / %d nodes and holds %d slots", r.ID, req.Gpus, req.Nodes, len(r.Slots))
				}
				if req.Gpus > 0 && req.Gpus <= 8 && len(r.NodeIDs()) != 1 {
					t.Fatalf("%s: %d GPUs spread over %v", r.ID, req.Gpus, r.NodeIDs())
				}
				for _, s := range r.Slots {
					if !s.Start.Equal(req.Start.AsTime()) || !s.End.Equal(req.End.AsTime()) {
						t.Fatalf("%s: slot [%s, %s), window [%s, %s)", r.ID, s.Start, s.End, req.Start.AsTime(), req.End.AsTime())
					}
				}
			case store.ReservationFailed:
				failed++
				if !strings.HasPrefix(r.Reason, "no capacity: ") {
					t.Fatalf("%s failed without a reason: %q", r.ID, r.Reason)
				}
			default:
				t.Fatalf("%s ended %s", r.ID, r.State)
			}
		}
		// The checker over the whole history: every slot ever written,
		// released ones included (an empty range holds nothing).
		slots, err := st.ReservationSlots(ctx, &store.ReservationSlotsParams{PoolID: pool.ID, From: base.Add(-time.Hour), To: base.Add(48 * time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		checkHistory(t, slots)
		if placed == 0 || failed == 0 {
			t.Fatalf("placed %d, failed %d: the pool should both fill and overflow", placed, failed)
		}
		t.Logf("1,000 creates: %d placed (%d GPU slots), %d refused with a reason", placed, len(slots), failed)

		// capacity.summary at a busy time counts every GPU once.
		sum, err := c.CapacitySummary(ctx, &apiv1.CapacitySummaryRequest{Pool: pool.ID, At: timestamppb.New(base.Add(3 * time.Hour))})
		if err != nil {
			t.Fatal(err)
		}
		if len(sum.Models) != 1 || sum.Models[0].Model != h100 || sum.Models[0].Total != 160 ||
			sum.Models[0].Free+sum.Models[0].Reserved+sum.Models[0].Unavailable != 160 || sum.Models[0].Reserved == 0 {
			t.Fatalf("capacity.summary: %v", sum)
		}
	})
}

// checkHistory fails when two slots of one GPU overlap in time.
func checkHistory(t *testing.T, slots []*store.ReservationSlot) {
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
		slices.SortFunc(l, func(a, b *store.ReservationSlot) int { return a.Start.Compare(b.Start) })
		for i := 1; i < len(l); i++ {
			if l[i].Start.Before(l[i-1].End) && l[i].Start.Before(l[i].End) {
				t.Fatalf("GPU %d of %s booked twice: %s [%s, %s) and %s [%s, %s)", k.gpu, k.node,
					l[i-1].ReservationID, l[i-1].Start, l[i-1].End, l[i].ReservationID, l[i].Start, l[i].End)
			}
		}
	}
}

// TestSwapAndFail: a placed reservation whose node is quarantined before
// its start moves to a healthy node (reservation.placed naming the old
// one); when it cannot move, it fails with reservation.failed and a reason.
func TestSwapAndFail(t *testing.T) {
	eachBackend(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		pool, nodes := simPool(t, st, 3, 8)
		clk := &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
		p := placer.New(placer.Config{Clock: clk}, st, nil)
		start := clk.Now().Add(time.Hour)
		mk := func(gpus int) *store.Reservation {
			r, err := st.ReservationCreate(ctx, &store.ReservationCreateParams{PoolID: pool.ID, GPUs: gpus, Start: start,
				End: start.Add(4 * time.Hour), Owner: "team-a"})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		round := func() *placer.Result {
			t.Helper()
			res, err := p.PlacePool(ctx, st, pool.ID)
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		get := func(id string) *store.Reservation {
			t.Helper()
			r, err := st.ReservationGet(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		a := mk(8)
		if res := round(); res.Placed != 1 {
			t.Fatalf("round: %+v", res)
		}
		first := get(a.ID).NodeIDs()
		if !slices.Equal(first, nodes[:1]) {
			t.Fatalf("placed on %v, want %v (best fit, then id)", first, nodes[:1])
		}
		// A 2-GPU request goes next to nothing whole: best fit takes a
		// node, and the 8-GPU holder's node is full.
		b := mk(2)
		round()
		if got := get(b.ID).NodeIDs(); !slices.Equal(got, nodes[1:2]) {
			t.Fatalf("2 GPUs placed on %v, want %v", got, nodes[1:2])
		}
		// A 4-GPU request takes the partly used node (fewest free that fit).
		c := mk(4)
		round()
		if got := get(c.ID).NodeIDs(); !slices.Equal(got, nodes[1:2]) {
			t.Fatalf("4 GPUs placed on %v, want the fuller node %v", got, nodes[1:2])
		}

		// Quarantine a's node before the start: a moves to the free node.
		if _, err := st.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: nodes[0], Reason: store.DisruptionQuarantined,
			Owner: "remediation:test"}); err != nil {
			t.Fatal(err)
		}
		if res := round(); res.Moved != 1 {
			t.Fatalf("round after the quarantine: %+v", res)
		}
		if got := get(a.ID); got.State != store.ReservationPlaced || !slices.Equal(got.NodeIDs(), nodes[2:3]) || !strings.Contains(got.Reason, nodes[0]) {
			t.Fatalf("after the swap: %s on %v (%q)", got.State, got.NodeIDs(), got.Reason)
		}
		moved := outboxOf(t, st, events.ReservationPlaced, a.ID)
		if len(moved) != 2 || !slices.Equal(moved[1].PreviousNodeIDs, nodes[:1]) || !slices.Equal(moved[1].NodeIDs, nodes[2:3]) {
			t.Fatalf("reservation.placed events: %+v", moved)
		}

		// Now a's new node fails a GPU: nowhere to go (node 0 out, node 1
		// holds 6 of 8 GPUs): a fails, with an event and a reason.
		setInventory(t, st, nodes[2], 8, 3)
		if res := round(); res.Failed != 1 {
			t.Fatalf("round after the GPU failure: %+v", res)
		}
		got := get(a.ID)
		if got.State != store.ReservationFailed || !strings.Contains(got.Reason, "GPU 3 unhealthy") || len(got.Slots) != 0 {
			t.Fatalf("after an impossible swap: %s %q slots %d", got.State, got.Reason, len(got.Slots))
		}
		fails := outboxOf(t, st, events.ReservationFailed, a.ID)
		if len(fails) != 1 || fails[0].Owner != "team-a" || fails[0].PreviousState != store.ReservationPlaced || fails[0].Reason != got.Reason ||
			!slices.Equal(fails[0].NodeIDs, nodes[2:3]) {
			t.Fatalf("reservation.failed events: %+v", fails)
		}
		// The failed reservation freed its GPUs.
		if s, err := placer.Summarize(ctx, st, placer.NewFacts(), pool.ID, start, start.Add(time.Hour), 0); err != nil ||
			s.Models[0].Reserved != 6 || s.Models[0].Unavailable != 9 || s.Models[0].Free != 9 {
			t.Fatalf("summary after the failure: %+v, %v", s, err)
		}
	})
}

// TestLifecycle: placed → active at the start (the node's labels name the
// reservation and its owner, NodeReservedNow returns it), a GPU failing
// while active sends reservation.node-failed naming the owner once, and
// active → ended at the end (labels gone).
func TestLifecycle(t *testing.T) {
	eachBackend(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		pool, nodes := simPool(t, st, 2, 8)
		t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
		clk := &clock{t: t0}
		p := placer.New(placer.Config{Clock: clk}, st, nil)
		r, err := st.ReservationCreate(ctx, &store.ReservationCreateParams{PoolID: pool.ID, Nodes: 1, Start: t0.Add(time.Hour),
			End: t0.Add(3 * time.Hour), Owner: "team-b", Now: &t0})
		if err != nil {
			t.Fatal(err)
		}
		round := func() *placer.Result {
			t.Helper()
			res, err := p.PlacePool(ctx, st, pool.ID)
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		if res := round(); res.Placed != 1 {
			t.Fatalf("round: %+v", res)
		}
		at := t0.Add(30 * time.Minute)
		if got, err := st.NodeReservedNow(ctx, nodes[0], &at); err != nil || got != nil {
			t.Fatalf("reserved before the start: %v, %v", got, err)
		}
		clk.set(t0.Add(time.Hour))
		if res := round(); res.Activated != 1 {
			t.Fatalf("round at the start: %+v", res)
		}
		n, err := st.NodeGet(ctx, nodes[0])
		if err != nil {
			t.Fatal(err)
		}
		if n.Labels[store.ReservationLabelID] != r.ID || n.Labels[store.ReservationLabelOwner] != "team-b" {
			t.Fatalf("labels of the active reservation's node: %v", n.Labels)
		}
		at = t0.Add(90 * time.Minute)
		if got, err := st.NodeReservedNow(ctx, nodes[0], &at); err != nil || got == nil || got.ID != r.ID {
			t.Fatalf("NodeReservedNow while active: %v, %v", got, err)
		}
		// A GPU fails: remediation goes ahead, the owner is told once.
		setInventory(t, st, nodes[0], 8, 5)
		if res := round(); res.NodeFailed != 1 {
			t.Fatalf("round after the GPU failure: %+v", res)
		}
		round()
		nf := outboxOf(t, st, events.ReservationNodeFailed, r.ID)
		if len(nf) != 1 || nf[0].Owner != "team-b" || nf[0].NodeID != nodes[0] || !strings.Contains(nf[0].Reason, "GPU 5") ||
			nf[0].State != store.ReservationActive {
			t.Fatalf("reservation.node-failed events: %+v", nf)
		}
		clk.set(t0.Add(3 * time.Hour))
		if res := round(); res.Ended != 1 {
			t.Fatalf("round at the end: %+v", res)
		}
		if n, _ := st.NodeGet(ctx, nodes[0]); n.Labels[store.ReservationLabelID] != "" {
			t.Fatalf("labels after the end: %v", n.Labels)
		}
		for _, typ := range []string{events.ReservationCreated, events.ReservationPlaced, events.ReservationActive, events.ReservationEnded} {
			if got := outboxOf(t, st, typ, r.ID); len(got) != 1 || got[0].Owner != "team-b" {
				t.Fatalf("%s events: %+v", typ, got)
			}
		}
		if got := outboxOf(t, st, events.ReservationEnded, r.ID)[0]; got.PreviousState != store.ReservationActive || got.State != store.ReservationEnded {
			t.Fatalf("reservation.ended: %+v", got)
		}
	})
}

// TestDrainWaitsForReservation: nodes.drain of a node an active
// reservation holds is refused (CONFLICT naming the reservation and its
// owner); once the reservation is cancelled the drain goes ahead.
func TestDrainWaitsForReservation(t *testing.T) {
	eachBackend(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		pool, nodes := simPool(t, st, 1, 8)
		now := time.Now()
		r, err := st.ReservationCreate(ctx, &store.ReservationCreateParams{PoolID: pool.ID, GPUs: 2, Start: now.Add(-time.Minute),
			End: now.Add(time.Hour), Owner: "team-c"})
		if err != nil {
			t.Fatal(err)
		}
		p := placer.New(placer.Config{}, st, nil)
		if res, err := p.PlacePool(ctx, st, pool.ID); err != nil || res.Placed != 1 {
			t.Fatalf("place: %+v, %v", res, err)
		}
		if res, err := p.PlacePool(ctx, st, pool.ID); err != nil || res.Activated != 1 {
			t.Fatalf("activate: %+v, %v", res, err)
		}
		srv := api.New(api.Config{Secret: strings.Repeat("s", 32)}, st, nil)
		hs := httptest.NewServer(srv.Handler())
		defer hs.Close()
		secret, _, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleOperator})
		if err != nil {
			t.Fatal(err)
		}
		c := &client.Client{BaseURL: hs.URL + "/api", Token: secret}
		_, err = c.NodesDrain(ctx, &apiv1.NodeRequest{Id: nodes[0]})
		var ae *client.Error
		if !errors.As(err, &ae) || ae.Code != "CONFLICT" || !strings.Contains(ae.Message, r.ID) || !strings.Contains(ae.Message, "team-c") {
			t.Fatalf("drain of a reserved node: %v", err)
		}
		// Nor is it deleted under its reservation.
		admin, _, err := iam.Create(ctx, st, iam.CreateParams{Role: store.RoleAdmin})
		if err != nil {
			t.Fatal(err)
		}
		_, err = (&client.Client{BaseURL: hs.URL + "/api", Token: admin}).NodesDelete(ctx, &apiv1.NodeRequest{Id: nodes[0]})
		if !errors.As(err, &ae) || ae.Code != "CONFLICT" || !strings.Contains(ae.Message, r.ID) {
			t.Fatalf("delete of a reserved node: %v", err)
		}
		if _, err := st.NodeGet(ctx, nodes[0]); err != nil {
			t.Fatalf("the refused delete removed the node: %v", err)
		}
		// The node's labels are visible to selectors meanwhile.
		n, err := c.NodesGet(ctx, &apiv1.NodeRequest{Id: nodes[0]})
		if err != nil || n.GetNode().GetLabels()[store.ReservationLabelOwner] != "team-c" {
			t.Fatalf("nodes.get of the reserved node: %v, %v", n, err)
		}
		if _, err := c.ReservationsCancel(ctx, &apiv1.CancelReservationRequest{Id: r.ID, Reason: "maintenance"}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.NodesDrain(ctx, &apiv1.NodeRequest{Id: nodes[0]}); err != nil {
			t.Fatalf("drain after the cancel: %v", err)
		}
	})
}

// TestReconcileUnderFence: the reconciler's path (Due, then
// Reconcile under the pool's scheduler-shard fence) places a pending
// reservation, skips a round with nothing due, swaps when a node changes,
// and writes nothing once its lease is lost.
func TestReconcileUnderFence(t *testing.T) {
	eachBackend(t, func(t *testing.T, st store.Store) {
		ctx := context.Background()
		pool, nodes := simPool(t, st, 2, 8)
		n := placer.ShardOf(pool.ID)
		l, ok, err := st.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: placer.LeaseName(n), Holder: "w1", TTL: time.Minute})
		if err != nil || !ok {
			t.Fatalf("acquire: %v %v", ok, err)
		}
		fence := store.Fence{Lease: l.Name, Holder: l.Holder, Epoch: l.Epoch}
		clk := &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
		p := placer.New(placer.Config{Clock: clk}, st, nil)
		round := func(f store.Fence) error {
			t.Helper()
			due, err := p.Due(ctx, clk.Now(), []int{n})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(due, n) {
				return nil
			}
			return p.Reconcile(ctx, n, f)
		}
		r, err := st.ReservationCreate(ctx, &store.ReservationCreateParams{PoolID: pool.ID, GPUs: 8, Start: clk.Now().Add(time.Hour),
			End: clk.Now().Add(2 * time.Hour), Owner: "team-f"})
		if err != nil {
			t.Fatal(err)
		}
		if err := round(fence); err != nil {
			t.Fatal(err)
		}
		got, _ := st.ReservationGet(ctx, r.ID)
		if got.State != store.ReservationPlaced || !slices.Equal(got.NodeIDs(), nodes[:1]) {
			t.Fatalf("after a round: %s on %v", got.State, got.NodeIDs())
		}
		if err := round(fence); err != nil { // nothing due, nodes unchanged: skipped
			t.Fatal(err)
		}
		if _, err := st.DisruptionAdmit(ctx, &store.DisruptionAdmitParams{NodeID: nodes[0], Reason: store.DisruptionQuarantined, Owner: "t"}); err != nil {
			t.Fatal(err)
		}
		if err := round(fence); err != nil {
			t.Fatal(err)
		}
		if got, _ := st.ReservationGet(ctx, r.ID); !slices.Equal(got.NodeIDs(), nodes[1:2]) {
			t.Fatalf("after the quarantine: on %v, want %v", got.NodeIDs(), nodes[1:2])
		}
		// Another holder takes the lease: the old fence writes nothing.
		if err := st.LeaseRelease(ctx, l.Name, l.Holder, l.Epoch); err != nil {
			t.Fatal(err)
		}
		if _, ok, err := st.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: l.Name, Holder: "w2", TTL: time.Minute}); err != nil || !ok {
			t.Fatalf("takeover: %v %v", ok, err)
		}
		r2, err := st.ReservationCreate(ctx, &store.ReservationCreateParams{PoolID: pool.ID, GPUs: 1, Start: clk.Now().Add(time.Hour),
			End: clk.Now().Add(2 * time.Hour), Owner: "team-f"})
		if err != nil {
			t.Fatal(err)
		}
		if err := round(fence); !errors.Is(err, store.ErrFenced) {
			t.Fatalf("a round under a lost lease: %v, want ErrFenced", err)
		}
		if got, _ := st.ReservationGet(ctx, r2.ID); got.State != store.ReservationPending {
			t.Fatalf("written under a lost lease: %s", got.State)
		}
	})
}
