// Package lease holds a named lease of the store for as long as a job runs:
// acquire, renew, and give the job a context that ends the moment the lease
// can no longer be trusted (DESIGN.md, "Workers"; STYLE.md, "Leases and
// loops").
//
// "Lease not acquired" is a normal result, retried quietly. The holder
// trusts its lease only until TTL − Margin after the last successful renewal,
// measured on the monotonic clock (Config.Clock; the system clock's readings
// carry one), and every write the job makes goes through the fence it is
// handed, so a paused or partitioned old holder changes nothing. The lease's
// expiry in the store is on the database's clock.
package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/clock"
	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Store is what a lease holder needs.
type Store interface {
	LeaseAcquire(ctx context.Context, p *store.LeaseAcquireParams) (*store.Lease, bool, error)
	LeaseRenew(ctx context.Context, p *store.LeaseRenewParams) (*store.Lease, bool, error)
	LeaseRelease(ctx context.Context, name, holder string, epoch int64) error
	LeaseGet(ctx context.Context, name string) (*store.Lease, error)
}

// Config configures a Holder.
type Config struct {
	// Name is the lease, such as singleton:command-sweeper.
	Name string
	// Holder identifies this process (its worker id).
	Holder string
	// TTL is the lease's life. Defaults to 15 s.
	TTL time.Duration
	// Renew is the renewal interval. Defaults to TTL / 3.
	Renew time.Duration
	// Margin is how long before expiry the holder stops trusting the lease.
	// Defaults to Renew / 2.
	Margin time.Duration
	// Retry is how often a non-holder tries to acquire. Defaults to Renew.
	Retry time.Duration
	// Clock times renewals, retries and the trust window. Defaults to the
	// system clock.
	Clock clock.Clock
}

// Holder runs a job while holding a lease.
type Holder struct {
	cfg   Config
	store Store
	log   *slog.Logger
}

// New returns a Holder; call Run.
func New(cfg Config, st Store, log *slog.Logger) (*Holder, error) {
	if cfg.Name == "" || cfg.Holder == "" {
		return nil, errors.New("lease: name and holder are required")
	}
	cfg.TTL = cmp.Or(cfg.TTL, 15*time.Second)
	cfg.Renew = cmp.Or(cfg.Renew, cfg.TTL/3)
	cfg.Margin = cmp.Or(cfg.Margin, cfg.Renew/2)
	cfg.Retry = cmp.Or(cfg.Retry, cfg.Renew)
	if cfg.Clock == nil {
		cfg.Clock = clock.System
	}
	if cfg.Renew+cfg.Margin >= cfg.TTL {
		return nil, fmt.Errorf("lease %s: renew %v + margin %v must be below ttl %v", cfg.Name, cfg.Renew, cfg.Margin, cfg.TTL)
	}
	return &Holder{cfg: cfg, store: st, log: log.With("lease", cfg.Name)}, nil
}

// Job runs while the lease is held. ctx ends when the lease is lost or Run
// stops; fence must guard every write the job makes.
type Job func(ctx context.Context, fence store.Fence) error

// Run acquires the lease whenever it is free, runs job while holding it, and
// releases it when ctx ends. A job error is logged and the lease released,
// then Run tries again. Run returns nil when ctx ends.
func (h *Holder) Run(ctx context.Context, job Job) error {
	for {
		l, ok, err := h.store.LeaseAcquire(ctx, &store.LeaseAcquireParams{Name: h.cfg.Name, Holder: h.cfg.Holder, TTL: h.cfg.TTL})
		switch {
		case ctx.Err() != nil:
			h.releaseIfOurs(ctx)
			return nil
		case err != nil:
			h.log.WarnContext(ctx, "Lease acquire failed", logkey.Err, err)
		case ok:
			h.hold(ctx, l, job)
		}
		// Jitter spreads contenders so they do not retry in lockstep.
		wait := h.cfg.Retry/2 + rand.N(h.cfg.Retry)
		select {
		case <-ctx.Done():
			return nil
		case <-h.cfg.Clock.After(wait):
		}
	}
}

// Every is the job of a singleton that works in passes: pass runs at once
// and then every interval (on clock) while the lease is held. A pass's
// error ends the job (Run logs it, releases the lease and tries again).
func Every(interval time.Duration, clk clock.Clock, pass Job) Job {
	return func(ctx context.Context, fence store.Fence) error {
		for {
			if err := pass(ctx, fence); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return nil
			case <-clk.After(interval):
			}
		}
	}
}

// hold runs job under l until the lease is lost, the job ends or ctx ends.
func (h *Holder) hold(ctx context.Context, l *store.Lease, job Job) {
	clk := h.cfg.Clock
	trustUntil := clk.Now().Add(h.cfg.TTL - h.cfg.Margin) // monotonic
	jctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	fence := store.Fence{Lease: l.Name, Holder: l.Holder, Epoch: l.Epoch}
	h.log.InfoContext(ctx, "Lease acquired", "epoch", l.Epoch)
	done := make(chan error, 1)
	go func() { done <- job(jctx, fence) }()
	// One timer at a time, for the next renewal or, when that is later,
	// the end of the trust window, so the job ends the moment the lease can
	// no longer be trusted; armed again once a renewal is done, so a fake
	// clock's pending waits are exactly what the holder waits on.
	next := func() <-chan time.Time { return clk.After(min(h.cfg.Renew, trustUntil.Sub(clk.Now()))) }
	tick := next()
	for {
		select {
		case err := <-done:
			if err != nil && jctx.Err() == nil {
				h.log.ErrorContext(ctx, "Job under lease failed", logkey.Err, err)
			}
			h.release(ctx, l)
			return
		case <-ctx.Done():
			cancel(ctx.Err())
			<-done
			h.release(ctx, l)
			return
		case <-tick:
			if !clk.Now().Before(trustUntil) {
				cancel(errors.New("lease expired before renewal"))
				<-done
				h.log.WarnContext(ctx, "Lease no longer trusted", "epoch", l.Epoch)
				return
			}
			start := clk.Now()
			nl, ok, err := h.store.LeaseRenew(ctx, &store.LeaseRenewParams{Name: l.Name, Holder: l.Holder, Epoch: l.Epoch, TTL: h.cfg.TTL})
			switch {
			case err != nil:
				h.log.WarnContext(ctx, "Lease renew failed", logkey.Err, err)
			case !ok:
				cancel(errors.New("lease lost"))
				<-done
				h.log.WarnContext(ctx, "Lease lost", "epoch", l.Epoch)
				return
			default:
				l = nl
				trustUntil = start.Add(h.cfg.TTL - h.cfg.Margin)
			}
			tick = next()
		}
	}
}

// releaseIfOurs releases the lease when the store says this holder has it:
// an acquire cut short by cancellation may have taken it unseen.
func (h *Holder) releaseIfOurs(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if l, err := h.store.LeaseGet(rctx, h.cfg.Name); err == nil && l.Holder == h.cfg.Holder {
		h.release(ctx, l)
	}
}

func (h *Holder) release(ctx context.Context, l *store.Lease) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := h.store.LeaseRelease(rctx, l.Name, l.Holder, l.Epoch); err != nil {
		h.log.WarnContext(ctx, "Lease release failed", logkey.Err, err)
		return
	}
	h.log.InfoContext(ctx, "Lease released", "epoch", l.Epoch)
}
