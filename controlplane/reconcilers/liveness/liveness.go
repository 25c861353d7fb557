// Package liveness is the node liveness reconciler: a node whose last
// heartbeat is older than three heartbeat intervals becomes unreachable, and
// ready again once it heartbeats (issue "Workers at scale"). A node its own
// BMC reported off (powered-off) is never made unreachable, and is ready
// again once it heartbeats more than one heartbeat interval after it was
// marked off: the message that carried the report is itself recorded as a
// heartbeat, at the gateway's next flush, and does not count (issue 15). It
// runs shard by shard under the shard leases.
package liveness

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/shard"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Store is what the reconciler needs.
type Store interface {
	store.FencedTransactor
	NodeLivenessDue(ctx context.Context, p *store.NodeLivenessDueParams) ([]int, error)
}

// livenessTx is what a shard's liveness transaction touches.
type livenessTx interface {
	NodeLivenessReconcile(ctx context.Context, p *store.NodeLivenessParams) (unreachable, ready []string, err error)
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

// Reconciler moves nodes between ready and unreachable, and powered-off
// nodes heard from again to ready. It is a shard.Reconciler: Due finds,
// with one read, the shards where a node is due to move, and Reconcile
// opens a write transaction only for those.
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

var _ shard.Reconciler = (*Reconciler)(nil)

// staleAfter is the heartbeat age that makes a node unreachable.
func (r *Reconciler) staleAfter() time.Duration {
	return time.Duration(r.cfg.Missed) * r.cfg.HeartbeatInterval
}

// Due reads which of shards have a node due to move. In a healthy fleet
// none has, and the round writes nothing: one read a round, not one write
// transaction (or one read) a shard, each a turn of SQLite's one writer.
// Heartbeat ages are judged on the database's clock (like the leases), not
// at now.
func (r *Reconciler) Due(ctx context.Context, _ time.Time, shards []int) ([]int, error) {
	return r.store.NodeLivenessDue(ctx, &store.NodeLivenessDueParams{
		Shards: shards, StaleAfter: r.staleAfter(), PoweredOffGrace: r.cfg.HeartbeatInterval})
}

// Reconcile runs one fenced pass over shard n.
func (r *Reconciler) Reconcile(ctx context.Context, n int, fence store.Fence) error {
	p := &store.NodeLivenessParams{Shard: n, StaleAfter: r.staleAfter(), PoweredOffGrace: r.cfg.HeartbeatInterval}
	var unreachable, ready []string
	err := store.InFencedTx(ctx, r.store, fence, func(tx livenessTx) error {
		var err error
		unreachable, ready, err = tx.NodeLivenessReconcile(ctx, p)
		return err
	})
	if err != nil {
		return err
	}
	for _, id := range unreachable {
		r.log.InfoContext(ctx, "Node unreachable", logkey.NodeID, id, "missed_heartbeats", r.cfg.Missed)
		if r.cfg.OnChange != nil {
			r.cfg.OnChange(id, store.NodeUnreachable)
		}
	}
	for _, id := range ready {
		r.log.InfoContext(ctx, "Node ready again", logkey.NodeID, id)
		if r.cfg.OnChange != nil {
			r.cfg.OnChange(id, store.NodeReady)
		}
	}
	return nil
}
