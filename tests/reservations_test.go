package tests

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/pkg/shard"
	"github.com/better-compute/better-compute/controlplane/reconcilers/placer"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// TestSchedulersSplitPools: two scheduler processes on PostgreSQL split
// the pools by the scheduler role's own shard membership (placer.Shards
// scheduler-shard:<n> leases); after a kill -9 of one, the other places the
// reservations of its pools within 20 s (the membership's TTL of 10 s, its
// 3 s round, the placer's 1 s round).
func TestSchedulersSplitPools(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	began := time.Now()
	d := newSplitDeployment(t, 0, 0)
	procs := map[string]*splitProc{}
	var ids []string
	for _, name := range []string{"scheduler-1", "scheduler-2"} {
		p := &splitProc{name: name, p: d.start(name, "scheduler")}
		p.id = p.p.WaitLine(`msg="Worker roles running".* worker=(\S+)`, 60*time.Second)[1]
		procs[p.id] = p
		ids = append(ids, p.id)
	}
	slices.Sort(ids)

	// Pools until each scheduler owns two (by the rendezvous hash both
	// compute), each with two nodes of 8 GPUs.
	site, err := d.st.SiteCreate(ctx, &store.SiteCreateParams{Name: "res-site", Region: "eu-1"})
	if err != nil {
		t.Fatal(err)
	}
	owned := map[string][]string{} // worker -> pool ids
	for i := 0; len(owned[ids[0]]) < 2 || len(owned[ids[1]]) < 2; i++ {
		if i == 64 {
			t.Fatalf("64 pools and still not two for each scheduler: %v", owned)
		}
		pool, err := d.st.PoolCreate(ctx, &store.PoolCreateParams{Name: fmt.Sprintf("res-pool-%d", i), SiteID: site.ID})
		if err != nil {
			t.Fatal(err)
		}
		owner := shard.Owner(placer.ShardOf(pool.ID), ids)
		owned[owner] = append(owned[owner], pool.ID)
		for j := range 2 {
			simNode(t, d.st, pool.ID, fmt.Sprintf("res-%d-%d", i, j))
		}
	}
	// Both hold their shares.
	eventually(t, 30*time.Second, func() bool {
		held := schedulerLeases(t, d.st)
		for n := range placer.Shards {
			if held[n] != shard.Owner(n, ids) {
				return false
			}
		}
		return true
	}, func() string {
		return fmt.Sprintf("scheduler shards not split as the hash says: %v", schedulerLeases(t, d.st))
	})
	t.Logf("two schedulers up and split %v after start", time.Since(began).Round(time.Millisecond))

	create := func(pool string) string {
		r, err := d.admin.ReservationsCreate(ctx, &apiv1.CreateReservationRequest{Pool: pool, Gpus: 2, Owner: "team-e2e",
			Start: timestamppb.New(time.Now().Add(time.Hour)), End: timestamppb.New(time.Now().Add(2 * time.Hour))})
		if err != nil {
			t.Fatal(err)
		}
		return r.Id
	}
	placed := func(rids []string) (bool, string) {
		for _, id := range rids {
			r, err := d.admin.ReservationsGet(ctx, &apiv1.GetReservationRequest{Id: id})
			if err != nil {
				t.Fatal(err)
			}
			if r.State != store.ReservationPlaced {
				return false, id + " is " + r.State + " " + r.Reason
			}
		}
		return true, ""
	}
	var first []string
	for _, pools := range owned {
		for _, p := range pools {
			first = append(first, create(p))
		}
	}
	var why string
	eventually(t, 20*time.Second, func() bool { ok, w := placed(first); why = w; return ok },
		func() string { return "reservations of both schedulers' pools not placed: " + why })

	// kill -9 of one; the reservations made after it, in every pool, are
	// placed: the victim's pools by the survivor.
	victim, survivor := procs[ids[0]], procs[ids[1]]
	killed := time.Now()
	victim.p.Kill()
	var after []string
	for _, pools := range owned {
		for _, p := range pools {
			after = append(after, create(p), create(p))
		}
	}
	eventually(t, 30*time.Second, func() bool { ok, w := placed(after); why = w; return ok },
		func() string { return "after the kill -9: " + why })
	took := time.Since(killed)
	t.Logf("kill -9 of %s: %s placed the reservations of its %d pools %v later", victim.name, survivor.name,
		len(owned[victim.id]), took.Round(time.Millisecond))
	if took > 20*time.Second {
		t.Errorf("the victim's pools placed %v after the kill -9, want within 20 s", took)
	}
	for n, holder := range schedulerLeases(t, d.st) {
		if holder != survivor.id {
			t.Errorf("scheduler shard %d held by %q after the kill, want %s", n, holder, survivor.id)
		}
	}
	// No GPU is booked twice, across both processes' writes.
	slots, err := d.st.ReservationSlots(ctx, &store.ReservationSlotsParams{From: time.Now(), To: time.Now().Add(3 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, s := range slots {
		k := fmt.Sprintf("%s/%d", s.NodeID, s.GPU)
		if other, dup := seen[k]; dup {
			t.Errorf("GPU %s held by %s and %s for the same window", k, other, s.ReservationID)
		}
		seen[k] = s.ReservationID
	}
	if want := 2 * (len(first) + len(after)); len(slots) != want {
		t.Errorf("%d GPU slots held, want %d", len(slots), want)
	}
}

// schedulerLeases returns the live holder of each scheduler shard lease.
func schedulerLeases(t *testing.T, st store.Store) map[int]string {
	t.Helper()
	leases, err := st.LeaseList(context.Background(), placer.LeasePrefix)
	if err != nil {
		t.Fatal(err)
	}
	now, err := st.Now(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]string{}
	for _, l := range leases {
		var n int
		if _, err := fmt.Sscanf(strings.TrimPrefix(l.Name, placer.LeasePrefix), "%d", &n); err == nil && l.ExpiresAt.After(now) {
			out[n] = l.Holder
		}
	}
	return out
}

// simNode writes a ready node of pool with 8 H100s, as a joined daemon's
// inventory would say.
func simNode(t *testing.T, st store.Store, pool, id string) {
	t.Helper()
	ctx := context.Background()
	if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: pool, Hostname: id, MachineID: "m-" + id}); err != nil {
		t.Fatal(err)
	}
	if err := st.NodeSetState(ctx, id, store.NodeReady); err != nil {
		t.Fatal(err)
	}
	inv := &sessionv1.Inventory{}
	for g := range 8 {
		inv.Gpus = append(inv.Gpus, &sessionv1.GPU{Index: uint32(g), Name: "NVIDIA H100 80GB HBM3", Uuid: fmt.Sprintf("GPU-%s-%d", id, g),
			MemoryTotalBytes: 81559 << 20})
	}
	b, err := protojson.Marshal(inv)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.NodeSetInventory(ctx, id, b, "sim-"+id); err != nil {
		t.Fatal(err)
	}
}
