package shard_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/shard"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
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
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
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
