package workers_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/config"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
	"github.com/better-compute/better-compute/controlplane/workers"
)

// finished records CommandFinished calls.
type finished struct {
	mu   sync.Mutex
	seen map[string]int
}

func (f *finished) CommandFinished(kind, state string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen[kind+" "+state]++
}

func (f *finished) count(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seen[key]
}

func TestSweptCommandsAreCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	site, err := st.SiteCreate(ctx, &store.SiteCreateParams{Name: "dc1", Region: "eu-1"})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := st.PoolCreate(ctx, &store.PoolCreateParams{Name: "p", SiteID: site.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.NodeUpsert(ctx, &store.NodeUpsertParams{ID: "node-a", PoolID: pool.ID, Hostname: "a", MachineID: "a"}); err != nil {
		t.Fatal(err)
	}
	long := time.Now().Add(-time.Hour)
	if _, err := st.CommandEnqueue(ctx, &store.CommandEnqueueParams{NodeIDs: []string{"node-a"}, Kind: "exec", SessionSpec: []byte(`{}`),
		Timeout: time.Minute, Now: &long}); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load("", func(string) string { return "" }, config.Flags{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	m := &finished{seen: map[string]int{}}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- workers.Run(rctx, cfg, st, workers.Options{WorkerID: "w1", SweepInterval: 20 * time.Millisecond, Metrics: m},
			slog.New(slog.DiscardHandler))
	}()
	deadline := time.Now().Add(20 * time.Second)
	for m.count("exec expired") != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("counted %v", m.seen)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
