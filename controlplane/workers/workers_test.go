package workers_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/clocktest"
	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite"
	"github.com/better-compute/better-compute/controlplane/workers"
)

func TestRolesTakeLeasesAndReleaseThem(t *testing.T) {
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
	cfg, err := config.Load("", func(string) string { return "" }, config.Flags{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Sinks.Files = []config.FileSink{{Name: "audit-file", Path: filepath.Join(dir, "events.jsonl")}}
	rctx, stop := context.WithCancel(ctx)
	clk := clocktest.New(time.Now())
	done := make(chan error, 1)
	go func() {
		done <- workers.Run(rctx, cfg, st, workers.Options{WorkerID: "w1", ShardRenew: 200 * time.Millisecond, ShardTTL: 2 * time.Second, Clock: clk}, slog.New(slog.DiscardHandler))
	}()
	held := func(prefix string) int {
		ls, _ := st.LeaseList(ctx, prefix)
		n := 0
		for _, l := range ls {
			if l.Holder == "w1" {
				n++
			}
		}
		return n
	}
	// Every job takes its lease at once and then waits on the (fake)
	// clock: check the leases each time one of them moves on.
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := clk.Until(wctx, func() bool {
		return held("shard:") == store.Shards && held("singleton:command-sweeper") == 1 && held("singleton:outbox-dispatch:audit-file") == 1 &&
			held("singleton:iam:token-expiry") == 1 && held("singleton:retention") == 1
	}); err != nil {
		t.Fatalf("leases held: shards %d sweeper %d sink %d iam %d retention %d: %v", held("shard:"), held("singleton:command-sweeper"),
			held("singleton:outbox-dispatch:"), held("singleton:iam:"), held("singleton:retention"), err)
	}
	if ws, _ := st.WorkerList(ctx, 0, nil); len(ws) != 1 || ws[0].ID != "w1" {
		t.Fatalf("workers = %+v", ws)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := held(""); n != 0 {
		t.Fatalf("%d leases still held after stop", n)
	}
	if ws, _ := st.WorkerList(ctx, 0, nil); len(ws) != 0 {
		t.Fatalf("worker still registered after stop: %+v", ws)
	}
}
