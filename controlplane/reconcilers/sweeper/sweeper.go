// Package sweeper is the CommandSweeper: a singleton job, under the lease
// singleton:command-sweeper, that drives every overdue or orphaned command
// to exactly one terminal state (DESIGN.md, "Commands").
package sweeper

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/clock"
	"github.com/better-compute/better-compute/controlplane/pkg/lease"
	"github.com/better-compute/better-compute/controlplane/store"
)

// LeaseName is the sweeper's singleton lease.
const LeaseName = "singleton:command-sweeper"

// Store is what the sweeper needs.
type Store interface {
	lease.Store
	store.FencedTransactor
}

// sweepTx is what a sweep's transaction touches.
type sweepTx interface {
	CommandSweep(ctx context.Context, p *store.CommandSweepParams) (*store.CommandSweepResult, error)
}

// Config configures the sweeper.
type Config struct {
	// Holder identifies this process. Required.
	Holder string
	// Interval between sweeps. Defaults to 1 s.
	Interval time.Duration
	// LostAfter is how long a node may be without a session before its
	// in-flight commands end lost (or are re-queued when idempotent).
	// Defaults to 30 s, three default heartbeat intervals.
	LostAfter time.Duration
	// OnSweep, when set, is called after each sweep that changed something.
	OnSweep func(*store.CommandSweepResult)
	// Clock times the sweeps and the lease (lease.Config.Clock); commands'
	// deadlines and sessions' ages are judged in the store, by the
	// database's clock. Defaults to the system clock.
	Clock clock.Clock
}

// Sweeper is the CommandSweeper.
type Sweeper struct {
	cfg    Config
	store  Store
	log    *slog.Logger
	holder *lease.Holder
}

// New returns a Sweeper; call Run.
func New(cfg Config, st Store, log *slog.Logger) (*Sweeper, error) {
	cfg.Interval = cmp.Or(cfg.Interval, time.Second)
	cfg.LostAfter = cmp.Or(cfg.LostAfter, 30*time.Second)
	if cfg.Clock == nil {
		cfg.Clock = clock.System
	}
	h, err := lease.New(lease.Config{Name: LeaseName, Holder: cfg.Holder, Clock: cfg.Clock}, st, log)
	if err != nil {
		return nil, err
	}
	return &Sweeper{cfg: cfg, store: st, log: log.With("job", "command-sweeper"), holder: h}, nil
}

// Run sweeps every Interval while holding the lease, until ctx ends.
func (s *Sweeper) Run(ctx context.Context) error {
	return s.holder.Run(ctx, lease.Every(s.cfg.Interval, s.cfg.Clock, s.sweep))
}

// sweep runs one fenced sweep; a lost fence ends the job.
func (s *Sweeper) sweep(ctx context.Context, fence store.Fence) error {
	var res *store.CommandSweepResult
	err := store.InFencedTx(ctx, s.store, fence, func(tx sweepTx) error {
		var err error
		res, err = tx.CommandSweep(ctx, &store.CommandSweepParams{LostAfter: s.cfg.LostAfter})
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	if n := len(res.Expired) + len(res.Lost) + len(res.Requeued); n > 0 {
		s.log.InfoContext(ctx, "Swept commands", "expired", len(res.Expired), "lost", len(res.Lost), "requeued", len(res.Requeued))
		if s.cfg.OnSweep != nil {
			s.cfg.OnSweep(res)
		}
	}
	return nil
}
