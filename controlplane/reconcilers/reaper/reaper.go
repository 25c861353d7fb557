// Package reaper cleans up after gateways that died without warning (kill
// -9, a lost machine): a singleton job, under the lease
// singleton:gateway-reaper, that closes, fenced, the sessions of every
// gateway whose lease has expired, so that the CommandSweeper re-queues or
// loses their commands within the gateway lease TTL plus its LostAfter, and
// deletes a dead gateway's row and lease once it has been dead for
// PruneAfter (DESIGN.md, "Dead gateways are cleaned up").
//
// A gateway that was only paused past its lease finds its sessions gone
// when it resumes: it closes the streams whose rows it no longer holds, and
// their nodes reconnect.
package reaper

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/clock"
	"github.com/better-compute/better-compute/controlplane/pkg/lease"
	"github.com/better-compute/better-compute/controlplane/store"
)

// LeaseName is the reaper's singleton lease.
const LeaseName = "singleton:gateway-reaper"

// Store is what the reaper needs.
type Store interface {
	lease.Store
	store.FencedTransactor
}

// reapTx is what a reaping pass's transaction touches.
type reapTx interface {
	GatewayReap(ctx context.Context, p *store.GatewayReapParams) (*store.GatewayReapResult, error)
}

// Config configures the reaper.
type Config struct {
	// Holder identifies this process. Required.
	Holder string
	// Interval between passes. Defaults to 5 s.
	Interval time.Duration
	// PruneAfter is how long a dead gateway's row and lease are kept, for
	// doctor and the fleet page to show. Defaults to 24 h.
	PruneAfter time.Duration
	// Clock times the passes and the lease; leases' expiry is judged in the
	// store, by the database's clock. Defaults to the system clock.
	Clock clock.Clock
}

// Reaper is the dead-gateway job.
type Reaper struct {
	cfg    Config
	store  Store
	log    *slog.Logger
	holder *lease.Holder
}

// New returns a Reaper; call Run.
func New(cfg Config, st Store, log *slog.Logger) (*Reaper, error) {
	cfg.Interval = cmp.Or(cfg.Interval, 5*time.Second)
	cfg.PruneAfter = cmp.Or(cfg.PruneAfter, 24*time.Hour)
	if cfg.Clock == nil {
		cfg.Clock = clock.System
	}
	if cfg.Interval < 0 || cfg.PruneAfter < 0 {
		return nil, fmt.Errorf("reaper: negative interval %s or retention %s", cfg.Interval, cfg.PruneAfter)
	}
	h, err := lease.New(lease.Config{Name: LeaseName, Holder: cfg.Holder, Clock: cfg.Clock}, st, log)
	if err != nil {
		return nil, err
	}
	return &Reaper{cfg: cfg, store: st, log: log.With("job", "gateway-reaper"), holder: h}, nil
}

// Run reaps every Interval while holding the lease, until ctx ends.
func (r *Reaper) Run(ctx context.Context) error {
	return r.holder.Run(ctx, lease.Every(r.cfg.Interval, r.cfg.Clock, r.reap))
}

// reap runs one fenced pass; a lost fence ends the job.
func (r *Reaper) reap(ctx context.Context, fence store.Fence) error {
	var res *store.GatewayReapResult
	err := store.InFencedTx(ctx, r.store, fence, func(tx reapTx) error {
		var err error
		res, err = tx.GatewayReap(ctx, &store.GatewayReapParams{LeasePrefix: store.GatewayLeasePrefix, PruneAfter: r.cfg.PruneAfter})
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if res.Sessions > 0 || len(res.Pruned) > 0 {
		r.log.InfoContext(ctx, "Reaped dead gateways", "dead", res.Dead, "sessions", res.Sessions, "pruned", res.Pruned)
	}
	return nil
}
