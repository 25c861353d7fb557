// Package liveness is the node liveness reconciler: a node whose last
// heartbeat is older than three heartbeat intervals becomes unreachable, and
// ready again once it heartbeats (issue "Workers at scale"). It runs shard by
// shard under the shard leases.
package liveness

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// Store is what the reconciler needs.
type Store interface {
	FencedTx(ctx context.Context, fence store.Fence, fn func(store.Store) error) error
	NodeLivenessDue(ctx context.Context, p *store.NodeLivenessParams) (bool, error)
}

// Config configures the reconciler.
type Config struct {
	// HeartbeatInterval is the daemons' heartbeat interval. Defaults to 10 s.
	HeartbeatInterval time.Duration
	// Missed is how many intervals without a heartbeat make a node
	// unreachable. Defaults to 3.
	Missed int
	// Interval is how often each shard is reconciled. Defaults to 5 s.
	Interval time.Duration
	// OnChange, when set, sees every transition.
	OnChange func(nodeID, state string)
}

// Reconciler moves nodes between ready and unreachable.
type Reconciler struct {
	cfg   Config
	store Store
	log   *slog.Logger
}

// New returns a Reconciler.
func New(cfg Config, st Store, log *slog.Logger) *Reconciler {
	cfg.HeartbeatInterval = cmp.Or(cfg.HeartbeatInterval, 10*time.Second)
	cfg.Missed = cmp.Or(cfg.Missed, 3)
	cfg.Interval = cmp.Or(cfg.Interval, 5*time.Second)
	return &Reconciler{cfg: cfg, store: st, log: log}
}

// Name names the reconciler.
func (r *Reconciler) Name() string { return "node-liveness" }

// Interval is how often each shard is reconciled.
func (r *Reconciler) Interval() time.Duration { return r.cfg.Interval }

// Reconcile runs one fenced pass over a shard.
func (r *Reconciler) Reconcile(ctx context.Context, shard int, fence store.Fence) error {
	p := &store.NodeLivenessParams{Shard: shard, StaleAfter: time.Duration(r.cfg.Missed) * r.cfg.HeartbeatInterval}
	// A read first: with nothing due, as in a healthy fleet almost always,
	// no write transaction (256 shards every round, each a turn of SQLite's
	// one writer). A node that falls due meanwhile is moved next round.
	due, err := r.store.NodeLivenessDue(ctx, p)
	if err != nil || !due {
		return err
	}
	var unreachable, ready []string
	err = r.store.FencedTx(ctx, fence, func(tx store.Store) error {
		var err error
		unreachable, ready, err = tx.NodeLivenessReconcile(ctx, p)
		return err
	})
	if err != nil {
		return err
	}
	for _, id := range unreachable {
		r.log.InfoContext(ctx, "Node unreachable", "node", id, "missed_heartbeats", r.cfg.Missed)
		if r.cfg.OnChange != nil {
			r.cfg.OnChange(id, store.NodeUnreachable)
		}
	}
	for _, id := range ready {
		r.log.InfoContext(ctx, "Node ready again", "node", id)
		if r.cfg.OnChange != nil {
			r.cfg.OnChange(id, store.NodeReady)
		}
	}
	return nil
}
