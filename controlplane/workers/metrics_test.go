package workers_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/clocktest"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
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
	clk := clocktest.New(time.Now())
	done := make(chan error, 1)
	go func() {
		done <- workers.Run(rctx, cfg, st, workers.Options{WorkerID: "w1", Metrics: m, Clock: clk},
			slog.New(slog.DiscardHandler))
	}()
	// The sweeper's first pass, as soon as it holds its lease, ends the
	// overdue command; then it waits on the (fake) clock.
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := clk.Until(wctx, func() bool { return m.count("exec expired") == 1 }); err != nil {
		t.Fatalf("counted %v: %v", m.seen, err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
