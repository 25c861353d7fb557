package shard_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/shard"
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

func start(t *testing.T, st store.Store, id string) (*shard.Manager, context.CancelFunc, chan struct{}) {
	t.Helper()
	m, err := shard.New(shard.Config{WorkerID: id, TTL: time.Second, Renew: 100 * time.Millisecond}, st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	return m, cancel, done
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestManagersSplitAndHandOver(t *testing.T) {
	ctx := context.Background()
	st := sqlitetest.Open(t)
	a, stopA, doneA := start(t, st, "worker-a")
	eventually(t, "a alone holds all shards", func() bool { return len(a.Held()) == store.Shards })
	b, stopB, doneB := start(t, st, "worker-b")
	eventually(t, "a and b split the shards", func() bool {
		ha, hb := a.Held(), b.Held()
		if len(ha)+len(hb) != store.Shards || len(hb) == 0 {
			return false
		}
		for n := range ha {
			if _, both := hb[n]; both {
				panic(fmt.Sprintf("shard %d held by both workers", n))
			}
		}
		return true
	})
	// a leaves gracefully: it releases, b takes everything without waiting for expiry.
	stopA()
	<-doneA
	begin := time.Now()
	eventually(t, "b holds all shards", func() bool { return len(b.Held()) == store.Shards })
	t.Logf("after a left, b held all shards in %v", time.Since(begin))
	workers, _ := st.WorkerList(ctx, 0, nil)
	if len(workers) != 1 || workers[0].ID != "worker-b" {
		t.Fatalf("workers after a left: %+v", workers)
	}
	stopB()
	<-doneB
}

// rounds records what RunReconcilers calls, as a Rounder.
type rounds struct {
	mu     sync.Mutex
	fail   bool
	starts [][]int // the shards of each StartRound
	calls  []int   // per StartRound, the Reconcile calls before the next
}

func (r *rounds) Name() string            { return "rounds" }
func (r *rounds) Interval() time.Duration { return 20 * time.Millisecond }

func (r *rounds) StartRound(_ context.Context, shards []int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.starts = append(r.starts, shards)
	r.calls = append(r.calls, 0)
	if r.fail {
		return errors.New("store down")
	}
	return nil
}

func (r *rounds) Reconcile(context.Context, int, store.Fence) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.calls) == 0 {
		panic("Reconcile before any StartRound")
	}
	r.calls[len(r.calls)-1]++
	return nil
}

func (r *rounds) seen() ([][]int, []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.starts), slices.Clone(r.calls)
}

// TestRunReconcilersStartsRounds: a Rounder's StartRound runs once a round,
// with the held shards in order, before that round's passes; a failed one
// skips the round; without shards there is no round.
func TestRunReconcilersStartsRounds(t *testing.T) {
	ctx := context.Background()
	st := sqlitetest.Open(t)
	run := func(m *shard.Manager, r *rounds, until func() bool) {
		t.Helper()
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { shard.RunReconcilers(rctx, m, slog.New(slog.DiscardHandler), r); close(done) }()
		eventually(t, "rounds run", until)
		cancel()
		<-done
	}

	// Not started: the manager holds nothing, so no round begins.
	idle, err := shard.New(shard.Config{WorkerID: "idle", TTL: time.Second, Renew: 100 * time.Millisecond}, st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	none := &rounds{}
	deadline := time.Now().Add(200 * time.Millisecond)
	run(idle, none, func() bool { return time.Now().After(deadline) })
	if starts, _ := none.seen(); len(starts) != 0 {
		t.Fatalf("%d rounds without shards", len(starts))
	}

	m, stop, done := start(t, st, "worker-a")
	defer func() { stop(); <-done }()
	eventually(t, "all shards held", func() bool { return len(m.Held()) == store.Shards })
	ok := &rounds{}
	run(m, ok, func() bool { s, _ := ok.seen(); return len(s) >= 3 })
	// Each round covers the shards held at its start (all 256 unless a
	// renewal was late under load), in order, and passes over each once.
	starts, calls := ok.seen()
	for i := range starts {
		if len(starts[i]) == 0 || !slices.IsSorted(starts[i]) || len(slices.Compact(slices.Clone(starts[i]))) != len(starts[i]) || calls[i] != len(starts[i]) {
			t.Fatalf("round %d: StartRound with shards %v, then %d passes; want them in order, each passed once", i, starts[i], calls[i])
		}
	}
	if len(starts[0]) != store.Shards {
		t.Errorf("first round covered %d shards, want all %d", len(starts[0]), store.Shards)
	}

	failing := &rounds{fail: true}
	run(m, failing, func() bool { s, _ := failing.seen(); return len(s) >= 3 })
	if _, calls := failing.seen(); slices.Max(calls) != 0 {
		t.Fatalf("passes after a failed StartRound: %v", calls)
	}
}
