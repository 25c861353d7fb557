package shard

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/clock"
	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Reconciler is a job that works shard by shard, in rounds: one read finds
// the shards with work (Due), then one pass over each of them (Reconcile).
// Every reconciler over the shards has this shape and is driven by
// RunReconcilers, which keeps the round's bookkeeping: a reconciler keeps
// no "due" state of its own between Due and Reconcile beyond what Due read
// for the passes.
type Reconciler interface {
	// Name names it in logs and metrics.
	Name() string
	// Interval is the time between rounds.
	Interval() time.Duration
	// Due reads, at now and with one query where it can, which of shards
	// (ascending, never empty; the shards this process holds) have work
	// this round, and returns them (any order; others are ignored). A
	// reconciler may keep what it read for the round's passes. On error
	// the round is skipped.
	Due(ctx context.Context, now time.Time, shards []int) ([]int, error)
	// Reconcile does one pass over one shard that Due returned; every
	// write goes through fence.
	Reconcile(ctx context.Context, shard int, fence store.Fence) error
}

// Holder is the shard membership RunReconcilers works under: the fences of
// the shards this process holds and trusts now (a *Manager).
type Holder interface {
	Held() map[int]store.Fence
}

// Round runs one round of r over the shards m holds at now: Due, then
// Reconcile for each due shard still held, in ascending order. It returns
// how many passes ran; errors are logged, never returned (a temporary
// error never ends a loop).
func Round(ctx context.Context, m Holder, now time.Time, log *slog.Logger, r Reconciler) int {
	held := m.Held()
	if len(held) == 0 {
		return 0
	}
	due, err := r.Due(ctx, now, slices.Sorted(maps.Keys(held)))
	if err != nil {
		if ctx.Err() == nil {
			log.WarnContext(ctx, "Reconcile round failed", "reconciler", r.Name(), logkey.Err, err)
		}
		return 0
	}
	slices.Sort(due)
	passes := 0
	for _, n := range slices.Compact(due) {
		fence, ok := held[n]
		if !ok {
			continue
		}
		passes++
		if err := r.Reconcile(ctx, n, fence); err != nil && ctx.Err() == nil {
			log.WarnContext(ctx, "Reconcile failed", "reconciler", r.Name(), "shard", n, logkey.Err, err)
		}
	}
	return passes
}

// RunReconcilers runs each reconciler over the shards m holds until ctx
// ends: a Round every Interval on clk (nil: the system clock).
func RunReconcilers(ctx context.Context, m Holder, clk clock.Clock, log *slog.Logger, rs ...Reconciler) {
	clk = clock.Or(clk)
	done := make(chan struct{})
	for _, r := range rs {
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				select {
				case <-ctx.Done():
					return
				case now := <-clk.After(r.Interval()):
					Round(ctx, m, now, log, r)
				}
			}
		}()
	}
	for range rs {
		<-done
	}
}
