package shard

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Reconciler is a job that works shard by shard.
type Reconciler interface {
	// Name names it in logs and metrics.
	Name() string
	// Interval is how often each held shard is reconciled.
	Interval() time.Duration
	// Reconcile does one pass over one shard; every write goes through
	// fence.
	Reconcile(ctx context.Context, shard int, fence store.Fence) error
}

// Rounder is a Reconciler that reads once, at the start of every round,
// what its passes over the held shards need: one query a round rather than
// one a shard.
type Rounder interface {
	Reconciler
	// StartRound is called before the round's first Reconcile, with the
	// shards the round covers (ascending; never none: a round without
	// shards is skipped). On error the round is skipped.
	StartRound(ctx context.Context, shards []int) error
}

// RunReconcilers runs each reconciler over the shards m holds until ctx ends:
// a round every Interval, calling StartRound first where the reconciler is
// a Rounder.
func RunReconcilers(ctx context.Context, m *Manager, log *slog.Logger, rs ...Reconciler) {
	done := make(chan struct{})
	for _, r := range rs {
		go func() {
			defer func() { done <- struct{}{} }()
			tick := time.NewTicker(r.Interval())
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				held := m.Held()
				if len(held) == 0 {
					continue
				}
				if rr, ok := r.(Rounder); ok {
					if err := rr.StartRound(ctx, slices.Sorted(maps.Keys(held))); err != nil {
						if ctx.Err() == nil {
							log.WarnContext(ctx, "Reconcile round failed", "reconciler", r.Name(), logkey.Err, err)
						}
						continue
					}
				}
				for n, fence := range held {
					if err := r.Reconcile(ctx, n, fence); err != nil && ctx.Err() == nil {
						log.WarnContext(ctx, "Reconcile failed", "reconciler", r.Name(), "shard", n, logkey.Err, err)
					}
				}
			}
		}()
	}
	for range rs {
		<-done
	}
}
