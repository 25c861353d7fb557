package liveness_test

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/shard"
	"github.com/better-compute/better-compute/controlplane/reconcilers/liveness"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// countingStore is the real store, counting the reads of due shards and
// the write transactions the reconciler opens.
type countingStore struct {
	store.Store
	mu     sync.Mutex
	reads  int
	writes []string // the fenced lease of each
}

func (c *countingStore) NodeLivenessDue(ctx context.Context, p *store.NodeLivenessDueParams) ([]int, error) {
	c.mu.Lock()
	c.reads++
	c.mu.Unlock()
	return c.Store.NodeLivenessDue(ctx, p)
}

func (c *countingStore) FencedTx(ctx context.Context, fence store.Fence, fn func(store.Store) error) error {
	c.mu.Lock()
	c.writes = append(c.writes, fence.Lease)
	c.mu.Unlock()
	return c.Store.FencedTx(ctx, fence, fn)
}

// take returns the reads and writes since the last take.
func (c *countingStore) take() (int, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, w := c.reads, c.writes
	c.reads, c.writes = 0, nil
	return r, w
}

// TestRoundWritesOnlyWhereDue: one round reads once, then opens a write
// transaction only in the shard of the node that went silent; a round in a
// healthy fleet writes nothing.
func TestRoundWritesOnlyWhereDue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	past := now.Add(-time.Hour)
	ids := []string{"node_a", "node_b", "node_c", "node_d", "node_silent"}
	for _, id := range ids {
		if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: pool.ID, Hostname: id, MachineID: id}); err != nil {
			t.Fatal(err)
		}
		if err := st.NodeSetState(ctx, id, store.NodeReady); err != nil {
			t.Fatal(err)
		}
		at := &now
		if id == "node_silent" {
			at = &past
		}
		if _, _, err := st.SessionOpen(ctx, &store.SessionOpenParams{NodeID: id, SessionID: "s_" + id, GatewayID: "gw", Now: at}); err != nil {
			t.Fatal(err)
		}
	}
	fences := held{}
	for n := range store.Shards {
		l, ok, err := st.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: shard.LeaseName(n), Holder: "test", TTL: time.Hour})
		if err != nil || !ok {
			t.Fatalf("acquire shard %d: %v", n, err)
		}
		fences[n] = store.Fence{Lease: l.Name, Holder: l.Holder, Epoch: l.Epoch}
	}

	cs := &countingStore{Store: st}
	var changed []string
	r := liveness.New(liveness.Config{OnChange: func(id, state string) { changed = append(changed, id+" "+state) }},
		cs, slog.New(slog.DiscardHandler))
	round := func() { shard.Round(ctx, fences, time.Now(), slog.New(slog.DiscardHandler), r) }

	silentShard := []string{shard.LeaseName(store.ShardOf("node_silent"))}
	round()
	if reads, writes := cs.take(); reads != 1 || !slices.Equal(writes, silentShard) {
		t.Fatalf("round read %d times and wrote %v, want one read and only %v", reads, writes, silentShard)
	}
	if want := []string{"node_silent " + store.NodeUnreachable}; !slices.Equal(changed, want) {
		t.Fatalf("changes %v, want %v", changed, want)
	}
	// Nothing due now: a whole round writes nothing.
	round()
	if reads, writes := cs.take(); reads != 1 || len(writes) != 0 {
		t.Fatalf("healthy round read %d times and wrote %v, want one read and no write", reads, writes)
	}
	// The node heartbeats again: its shard alone is written, and it is ready.
	if _, err := st.SessionHeartbeatBatch(ctx, "gw", []string{"s_node_silent"}, nil); err != nil {
		t.Fatal(err)
	}
	changed = nil
	round()
	if reads, writes := cs.take(); reads != 1 || !slices.Equal(writes, silentShard) {
		t.Fatalf("round read %d times and wrote %v, want one read and only %v", reads, writes, silentShard)
	}
	if want := []string{"node_silent " + store.NodeReady}; !slices.Equal(changed, want) {
		t.Fatalf("changes %v, want %v", changed, want)
	}
}

// TestPoweredOffHeardFromAgain: a node its BMC reported off stays
// powered-off through the heartbeat the report itself left, and is ready
// again at the first round after it heartbeats past one heartbeat interval,
// without reconnecting (issue 15: "bmc on" after "bmc off").
func TestPoweredOffHeardFromAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := sqlitetest.Open(t)
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "s", Region: "r"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	const id, interval = "node_bmc", 10 * time.Second
	if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: id, PoolID: pool.ID, Hostname: id, MachineID: id}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.SessionOpen(ctx, &store.SessionOpenParams{NodeID: id, SessionID: "s1", GatewayID: "gw"}); err != nil {
		t.Fatal(err)
	}
	if err := st.NodeSetState(ctx, id, store.NodePoweredOff); err != nil {
		t.Fatal(err)
	}
	n, err := st.NodeGet(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	n0 := store.ShardOf(id)
	l, ok, err := st.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: shard.LeaseName(n0), Holder: "test", TTL: time.Hour})
	if err != nil || !ok {
		t.Fatalf("acquire shard %d: %v", n0, err)
	}
	fence := store.Fence{Lease: l.Name, Holder: l.Holder, Epoch: l.Epoch}
	var changed []string
	r := liveness.New(liveness.Config{HeartbeatInterval: interval, OnChange: func(id, state string) { changed = append(changed, id+" "+state) }},
		st, slog.New(slog.DiscardHandler))
	round := func() { shard.Round(ctx, held{n0: fence}, time.Now(), slog.New(slog.DiscardHandler), r) }
	state := func() string {
		t.Helper()
		n, err := st.NodeGet(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return n.State
	}
	// The heartbeat the report left, flushed right after it.
	if _, err := st.SessionHeartbeatBatch(ctx, "gw", []string{"s1"}, nil); err != nil {
		t.Fatal(err)
	}
	round()
	if got := state(); got != store.NodePoweredOff || len(changed) != 0 {
		t.Fatalf("after the report's own heartbeat: state %s, changes %v; want %s, none", got, changed, store.NodePoweredOff)
	}
	// A heartbeat more than an interval after the mark (written with a
	// clock that far on: the reconciler judges by the database's).
	later := n.UpdatedAt.Add(interval + time.Second)
	if _, err := st.SessionHeartbeatBatch(ctx, "gw", []string{"s1"}, &later); err != nil {
		t.Fatal(err)
	}
	round()
	if got, want := state(), store.NodeReady; got != want || !slices.Equal(changed, []string{id + " " + want}) {
		t.Fatalf("after a heartbeat past the interval: state %s, changes %v; want %s", got, changed, want)
	}
}

// held is a shard membership that holds exactly its fences.
type held map[int]store.Fence

func (h held) Held() map[int]store.Fence { return h }
