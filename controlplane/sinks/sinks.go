// Package sinks delivers the transactional outbox to event sinks: a webhook
// (HMAC-SHA256 signed) and a JSON-lines file (DESIGN.md, "sinks"). Each sink
// has its own dispatcher under the lease singleton:outbox-dispatch:<sink> and
// its own cursor; a batch is delivered, then the cursor moves under the
// lease's fence. A failed delivery is retried with exponential backoff and
// jitter, so every entry reaches every sink at least once (a consumer dedupes
// on the entry id).
package sinks

import (
	"cmp"
	"context"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/lease"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Sink receives outbox entries.
type Sink interface {
	// Name is the sink's name, unique in the configuration.
	Name() string
	// Deliver delivers entries in order; an error retries the whole batch.
	Deliver(ctx context.Context, entries []*store.OutboxEntry) error
}

// Store is what a dispatcher needs.
type Store interface {
	lease.Store
	OutboxList(ctx context.Context, afterID int64, limit int) ([]*store.OutboxEntry, error)
	OutboxCursor(ctx context.Context, sink string) (int64, error)
	FencedTx(ctx context.Context, fence store.Fence, fn func(store.Store) error) error
}

// Config configures a dispatcher.
type Config struct {
	// Holder identifies this process. Required.
	Holder string
	// Poll is how often the outbox is read when idle. Defaults to 1 s.
	Poll time.Duration
	// Batch is the most entries delivered at once. Defaults to 100.
	Batch int
	// RetryBase and RetryMax bound the backoff after a failure. Default to
	// 1 s and 1 min.
	RetryBase, RetryMax time.Duration
}

// LeaseName is a sink's dispatcher lease.
func LeaseName(sink string) string { return "singleton:outbox-dispatch:" + sink }

// Dispatcher delivers the outbox to one sink.
type Dispatcher struct {
	cfg    Config
	sink   Sink
	store  Store
	log    *slog.Logger
	holder *lease.Holder
}

// NewDispatcher returns a Dispatcher for sink; call Run.
func NewDispatcher(cfg Config, sink Sink, st Store, log *slog.Logger) (*Dispatcher, error) {
	cfg.Poll = cmp.Or(cfg.Poll, time.Second)
	cfg.Batch = cmp.Or(cfg.Batch, 100)
	cfg.RetryBase = cmp.Or(cfg.RetryBase, time.Second)
	cfg.RetryMax = cmp.Or(cfg.RetryMax, time.Minute)
	log = log.With("sink", sink.Name())
	h, err := lease.New(lease.Config{Name: LeaseName(sink.Name()), Holder: cfg.Holder}, st, log)
	if err != nil {
		return nil, err
	}
	return &Dispatcher{cfg: cfg, sink: sink, store: st, log: log, holder: h}, nil
}

// Run delivers while holding the sink's lease, until ctx ends.
func (d *Dispatcher) Run(ctx context.Context) error {
	return d.holder.Run(ctx, d.deliverLoop)
}

func (d *Dispatcher) deliverLoop(ctx context.Context, fence store.Fence) error {
	failures := 0
	for {
		n, err := d.once(ctx, fence)
		wait := d.cfg.Poll
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			failures++
			bound := min(d.cfg.RetryMax, d.cfg.RetryBase<<min(failures-1, 16))
			wait = bound/2 + rand.N(bound/2+1)
			d.log.WarnContext(ctx, "Sink delivery failed; retrying", logkey.Err, err, "attempt", failures, "retry_in", wait)
		case n > 0:
			failures = 0
			continue // more may wait
		default:
			failures = 0
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// once delivers one batch and moves the cursor; it returns how many.
func (d *Dispatcher) once(ctx context.Context, fence store.Fence) (int, error) {
	cursor, err := d.store.OutboxCursor(ctx, d.sink.Name())
	if err != nil {
		return 0, err
	}
	entries, err := d.store.OutboxList(ctx, cursor, d.cfg.Batch)
	if err != nil || len(entries) == 0 {
		return 0, err
	}
	if err := d.sink.Deliver(ctx, entries); err != nil {
		return 0, err
	}
	last := entries[len(entries)-1].ID
	err = d.store.FencedTx(ctx, fence, func(tx store.Store) error {
		return tx.OutboxCursorSet(ctx, d.sink.Name(), last)
	})
	return len(entries), err
}
