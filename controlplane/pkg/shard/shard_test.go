package shard_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/clocktest"
	"github.com/better-compute/better-compute/controlplane/pkg/shard"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

func TestOwnerSpreadsAndMovesLittle(t *testing.T) {
	workers := []string{"w1", "w2", "w3"}
	count := map[string]int{}
	owner := map[int]string{}
	for n := range store.Shards {
		owner[n] = shard.Owner(n, workers)
		count[owner[n]]++
	}
	for _, w := range workers {
		if count[w] < 50 || count[w] > 120 {
			t.Fatalf("worker %s owns %d of 256 shards: %v", w, count[w], count)
		}
	}
	moved := 0
	for n := range store.Shards {
		if o := shard.Owner(n, []string{"w1", "w3"}); o != owner[n] {
			if owner[n] != "w2" {
				t.Fatalf("shard %d moved from %s although %s stayed", n, owner[n], owner[n])
			}
			moved++
		}
	}
	if moved != count["w2"] {
		t.Fatalf("moved %d shards, want exactly w2's %d", moved, count["w2"])
	}
}

// renew is the managers' round interval in these tests, on a fake clock.
const renew = 100 * time.Millisecond

// start runs a manager on clk; the returned function stops it and waits.
func start(t *testing.T, st store.Store, clk *clocktest.Clock, id string) (*shard.Manager, func()) {
	t.Helper()
	m, err := shard.New(shard.Config{WorkerID: id, TTL: time.Second, Renew: renew, Clock: clk}, st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return m, stop
}

// rounds advances clk one round interval at a time, each time waiting for
// all running managers (waiting: how many) to finish their round, until
// cond holds; it fails the test after 20 rounds.
func rounds(t *testing.T, clk *clocktest.Clock, waiting int, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for range 20 {
		if err := clk.BlockUntil(ctx, waiting); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if cond() {
			return
		}
		clk.Advance(renew)
	}
	t.Fatalf("%s: not after 20 rounds", what)
}

func TestManagersSplitAndHandOver(t *testing.T) {
	ctx := context.Background()
	st := sqlitetest.Open(t)
	clk := clocktest.New(time.Now())
	a, stopA := start(t, st, clk, "worker-a")
	rounds(t, clk, 1, "a alone holds all shards", func() bool { return len(a.Held()) == store.Shards })
	b, _ := start(t, st, clk, "worker-b")
	rounds(t, clk, 2, "a and b split the shards", func() bool {
		ha, hb := a.Held(), b.Held()
		if len(ha)+len(hb) != store.Shards || len(hb) == 0 {
			return false
		}
		for n := range ha {
			if _, both := hb[n]; both {
				t.Fatalf("shard %d held by both workers", n)
			}
		}
		return true
	})
	// a leaves gracefully: it releases, and b takes everything at its
	// next round, without waiting for the leases to expire.
	stopA()
	clk.Advance(renew)
	rounds(t, clk, 1, "b holds all shards", func() bool { return len(b.Held()) == store.Shards })
	workers, _ := st.WorkerList(ctx, 0, nil)
	if len(workers) != 1 || workers[0].ID != "worker-b" {
		t.Fatalf("workers after a left: %+v", workers)
	}
}

// TestHeldOnlyWhileTrusted: a manager whose renewals stop (its store
// refuses them) stops trusting its shards at the end of the trust window
// on its clock, TTL − Renew/2 after its last renewal.
func TestHeldOnlyWhileTrusted(t *testing.T) {
	st := &failingRenew{Store: sqlitetest.Open(t)}
	clk := clocktest.New(time.Now())
	m, _ := start(t, st, clk, "worker-a")
	rounds(t, clk, 1, "all shards held", func() bool { return len(m.Held()) == store.Shards })
	st.fail.Store(true)
	// TTL 1 s, Renew 100 ms: trusted until 950 ms after the last renewal.
	for range 9 {
		clk.Advance(renew)
		if err := clk.BlockUntil(t.Context(), 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(m.Held()); n != store.Shards {
		t.Fatalf("held %d shards 900 ms after the last renewal, want all %d", n, store.Shards)
	}
	clk.Advance(renew)
	if n := len(m.Held()); n != 0 {
		t.Fatalf("held %d shards past the trust window", n)
	}
}

// failingRenew is a store whose lease renewals fail while fail is set.
type failingRenew struct {
	store.Store
	fail atomic.Bool
}

func (s *failingRenew) LeaseRenew(ctx context.Context, p *store.LeaseRenewParams) (*store.Lease, bool, error) {
	if s.fail.Load() {
		return nil, false, errors.New("store down")
	}
	return s.Store.LeaseRenew(ctx, p)
}

// held is a shard membership that holds exactly its fences.
type held map[int]store.Fence

func (h held) Held() map[int]store.Fence { return h }

// recorder records what a round calls, as a Reconciler whose Due returns
// due (and fails when fail is set).
type recorder struct {
	mu     sync.Mutex
	fail   bool
	due    []int
	asked  [][]int // the shards of each Due
	passes [][]int // per Due, the shards passed over before the next
}

func (r *recorder) Name() string            { return "recorder" }
func (r *recorder) Interval() time.Duration { return time.Second }

func (r *recorder) Due(_ context.Context, _ time.Time, shards []int) ([]int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, shards)
	r.passes = append(r.passes, nil)
	if r.fail {
		return nil, errors.New("store down")
	}
	return r.due, nil
}

func (r *recorder) Reconcile(_ context.Context, n int, _ store.Fence) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.passes) == 0 {
		panic("Reconcile before any Due")
	}
	r.passes[len(r.passes)-1] = append(r.passes[len(r.passes)-1], n)
	return nil
}

func (r *recorder) seen() ([][]int, [][]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.asked), slices.Clone(r.passes)
}

// TestRoundPassesOverDueShards: a round asks Due once, with the held shards
// in order, then passes once over each due shard it still holds, in order
// (a due shard named twice is passed once; one not held is skipped); a
// failed Due skips the round's passes; without shards there is no round.
func TestRoundPassesOverDueShards(t *testing.T) {
	ctx := t.Context()
	log := slog.New(slog.DiscardHandler)
	none := &recorder{}
	if n := shard.Round(ctx, held{}, time.Now(), log, none); n != 0 {
		t.Fatalf("%d passes without shards", n)
	}
	if asked, _ := none.seen(); len(asked) != 0 {
		t.Fatalf("Due asked %d times without shards", len(asked))
	}
	h := held{}
	for n := 0; n < 64; n++ {
		h[n] = store.Fence{Lease: shard.LeaseName(n), Holder: "w", Epoch: 1}
	}
	r := &recorder{due: []int{40, 3, 7, 3, 200}}
	if n := shard.Round(ctx, h, time.Now(), log, r); n != 3 {
		t.Fatalf("%d passes, want 3", n)
	}
	asked, passes := r.seen()
	if len(asked) != 1 || len(asked[0]) != 64 || !slices.IsSorted(asked[0]) {
		t.Fatalf("Due asked with %v, want once with the 64 held shards in order", asked)
	}
	if want := []int{3, 7, 40}; !slices.Equal(passes[0], want) {
		t.Fatalf("passes %v, want %v", passes[0], want)
	}
	failing := &recorder{fail: true, due: []int{1}}
	if n := shard.Round(ctx, h, time.Now(), log, failing); n != 0 {
		t.Fatalf("%d passes after a failed Due", n)
	}
}

// TestRunReconcilersRoundsOnTheClock: RunReconcilers runs a round each
// Interval of its clock, and none before.
func TestRunReconcilersRoundsOnTheClock(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	clk := clocktest.New(time.Now())
	r := &recorder{due: []int{1}}
	done := make(chan struct{})
	go func() {
		shard.RunReconcilers(ctx, held{1: {Lease: shard.LeaseName(1), Holder: "w", Epoch: 1}}, clk, slog.New(slog.DiscardHandler), r)
		close(done)
	}()
	defer func() { cancel(); <-done }()
	wait := func() {
		t.Helper()
		if err := clk.BlockUntil(t.Context(), 1); err != nil {
			t.Fatal(err)
		}
	}
	wait()
	clk.Advance(r.Interval() - time.Millisecond)
	if asked, _ := r.seen(); len(asked) != 0 {
		t.Fatalf("a round before the interval passed: %v", asked)
	}
	for i := 1; i <= 3; i++ {
		clk.Advance(time.Millisecond)
		wait() // the round ran and the loop waits again
		if asked, passes := r.seen(); len(asked) != i || !slices.Equal(passes[i-1], []int{1}) {
			t.Fatalf("after %d intervals: Due %v, passes %v", i, asked, passes)
		}
		clk.Advance(r.Interval() - time.Millisecond)
	}
}
