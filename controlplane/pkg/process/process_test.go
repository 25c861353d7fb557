package process

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
	"github.com/better-compute/better-compute/controlplane/store/sqlite/sqlitetest"
)

// TestRegistrar: a process registers at once, a silent row (a killed
// process) is pruned by a live one, and a clean stop deletes its own row.
func TestRegistrar(t *testing.T) {
	ctx := context.Background()
	st := sqlitetest.Open(t)
	old := time.Now().Add(-time.Hour)
	if _, err := st.ProcessHeartbeat(ctx, &store.ProcessHeartbeatParams{ID: "killed", Roles: []string{"api"}, Now: &old}); err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{ID: "p1", Roles: []string{"sinks", "iam"}, Version: "1.0.0", HeartbeatInterval: 10 * time.Millisecond,
		PruneAfter: time.Minute}, st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ps, err := st.ProcessList(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) == 1 && ps[0].ID == "p1" && ps[0].Version == "1.0.0" && ps[0].Schema != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes = %+v, want only p1 (killed pruned)", ps)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ps, err := st.ProcessList(ctx); err != nil || len(ps) != 0 {
		t.Fatalf("after stop: processes = %+v, %v; want none", ps, err)
	}
}

// TestNewRefuses: a config without an id, or pruning faster than three
// heartbeats, is refused.
func TestNewRefuses(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	if _, err := New(Config{}, nil, log); err == nil {
		t.Fatal("no id: no error")
	}
	if _, err := New(Config{ID: "x", HeartbeatInterval: time.Second, PruneAfter: 2 * time.Second}, nil, log); err == nil {
		t.Fatal("prune under 3 intervals: no error")
	}
}
