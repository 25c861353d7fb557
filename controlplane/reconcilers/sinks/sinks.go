// Package sinks delivers the transactional outbox to event sinks: a webhook
// (HMAC-SHA256 signed, CloudEvents batches) and a JSON-lines file (DESIGN.md,
// "sinks" and "Events"). Each sink has its own dispatcher under the lease
// singleton:outbox-dispatch:<sink> and its own cursor; a batch of the
// entries whose type the sink takes (Config.Types) is delivered, then the
// cursor moves under the lease's fence.
//
// Delivery is at least once (a consumer dedupes on the CloudEvents id) and
// in outbox order, so in order per subject. A failed delivery is retried
// with exponential backoff and jitter (RetryBase doubling to RetryMax, each
// wait drawn from its upper half), one entry at a time until one succeeds,
// so that a bad entry is found alone. The entry at the head that fails
// MaxAttempts times in a row moves to the dead-letter table with the cursor
// past it in one fenced transaction, and the entries after it (its
// subject's too) flow again; a replay (DeadLetterReplay: sinks.replay)
// delivers it once more, out of order, before the outbox, retried like any
// delivery, back to waiting after MaxAttempts failures. Attempt counts live
// in the dispatcher: a takeover starts them again.
package sinks

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/clock"
	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/pkg/lease"
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
	DeadLetterList(ctx context.Context, p *store.DeadLetterListParams) ([]*store.DeadLetter, error)
	store.FencedTransactor
	tenantStore
}

// deliveryTx is what a dispatcher's transactions touch: the sink's cursor
// and its dead letters.
type deliveryTx interface {
	OutboxCursorSet(ctx context.Context, sink string, lastID int64) error
	DeadLetterInsert(ctx context.Context, d *store.DeadLetter) error
	DeadLetterDelete(ctx context.Context, ids []int64) error
	DeadLetterFailed(ctx context.Context, id int64, lastError string, maxAttempts int) error
}

// Config configures a dispatcher.
type Config struct {
	// Holder identifies this process. Required.
	Holder string
	// Poll is how often the outbox is read when idle. Defaults to 1 s.
	Poll time.Duration
	// Batch is the most entries read and delivered at once, 1 to
	// store.MaxListLimit. Defaults to 500.
	Batch int
	// RetryBase and RetryMax bound the backoff after a failure. Default to
	// 1 s and 1 min.
	RetryBase, RetryMax time.Duration
	// MaxAttempts is how many failed deliveries in a row move the entry at
	// the head to the dead-letter table. Defaults to 10 (with the default
	// backoff, about 5 minutes of failures).
	MaxAttempts int
	// Types are the type prefixes the sink takes (events.Matches); none:
	// every event. Entries of other types are passed over.
	Types []string
	// Tenant, when set (a tenant's id, never a name), makes the sink the
	// tenant's: it takes only the events of that tenant's subtree
	// (tenantFilter; docs/tenants.md) and passes over the others, and its
	// dead letters carry the id. "": every tenant's events and the
	// deployment's.
	Tenant string
	// Wake, when set, ends an idle wait early: a value on it means the
	// outbox was written (by this process, or another one heard through
	// LISTEN), so an event is delivered within a read of its commit rather
	// than up to Poll later. Poll stays the fallback.
	Wake <-chan struct{}
	// Clock times the polls, the backoff and the lease. Defaults to the
	// system clock.
	Clock clock.Clock
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
	tenant *tenantFilter // nil: every tenant's events

	// The delivery state of the lease's holder: after a failed batch, one
	// entry at a time until the cursor passes until, the failed batch's
	// last entry; head and attempts count the failures of the entry at the
	// head.
	until    int64
	head     int64
	attempts int
}

// NewDispatcher returns a Dispatcher for sink; call Run.
func NewDispatcher(cfg Config, sink Sink, st Store, log *slog.Logger) (*Dispatcher, error) {
	cfg.Poll = cmp.Or(cfg.Poll, time.Second)
	cfg.Batch = min(cmp.Or(cfg.Batch, 500), store.MaxListLimit)
	cfg.RetryBase = cmp.Or(cfg.RetryBase, time.Second)
	cfg.RetryMax = cmp.Or(cfg.RetryMax, time.Minute)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, 10)
	cfg.Clock = clock.Or(cfg.Clock)
	if cfg.Batch < 0 || cfg.MaxAttempts < 0 || cfg.RetryBase < 0 || cfg.RetryMax < cfg.RetryBase {
		return nil, fmt.Errorf("sink %s: batch %d, maxAttempts %d, retry %s to %s: want positive values, retryBase <= retryMax",
			sink.Name(), cfg.Batch, cfg.MaxAttempts, cfg.RetryBase, cfg.RetryMax)
	}
	log = log.With("sink", sink.Name())
	h, err := lease.New(lease.Config{Name: LeaseName(sink.Name()), Holder: cfg.Holder, Clock: cfg.Clock}, st, log)
	if err != nil {
		return nil, err
	}
	d := &Dispatcher{cfg: cfg, sink: sink, store: st, log: log, holder: h}
	if cfg.Tenant != "" {
		d.tenant = &tenantFilter{tenant: cfg.Tenant, st: st, now: cfg.Clock.Now}
	}
	return d, nil
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
		var wake <-chan struct{}
		if failures == 0 {
			wake = d.cfg.Wake // a failing sink waits out its backoff
		}
		select {
		case <-ctx.Done():
			return nil
		case <-wake:
		case <-d.cfg.Clock.After(wait):
		}
	}
}

// once delivers pending replays or one batch of the outbox and moves the
// cursor; it returns how many entries it handled (delivered, passed over
// or dead-lettered).
func (d *Dispatcher) once(ctx context.Context, fence store.Fence) (int, error) {
	if n, err := d.replay(ctx, fence); n > 0 || err != nil {
		return n, err
	}
	cursor, err := d.store.OutboxCursor(ctx, d.sink.Name())
	if err != nil {
		return 0, err
	}
	n, single := d.cfg.Batch, cursor < d.until
	if single {
		n = 1
	}
	entries, err := d.store.OutboxList(ctx, cursor, n)
	if err != nil || len(entries) == 0 {
		return 0, err
	}
	matched := make([]*store.OutboxEntry, 0, len(entries))
	for _, e := range entries {
		if !events.Matches(d.cfg.Types, e.Topic) {
			continue
		}
		if d.tenant != nil {
			ok, err := d.tenant.keeps(ctx, e)
			if err != nil {
				return 0, err
			}
			if !ok {
				continue
			}
		}
		matched = append(matched, e)
	}
	last := entries[len(entries)-1].ID
	if len(matched) > 0 {
		if err := d.sink.Deliver(ctx, matched); err != nil {
			return d.failed(ctx, fence, matched[0], matched[len(matched)-1].ID, single, err)
		}
	}
	d.attempts = 0
	err = store.InFencedTx(ctx, d.store, fence, func(tx deliveryTx) error {
		return tx.OutboxCursorSet(ctx, d.sink.Name(), last)
	})
	return len(entries), err
}

// failed counts a failed delivery whose first entry is head: delivery goes
// one entry at a time, and the head's MaxAttempts-th failure moves it to the
// dead-letter table and the cursor past it.
func (d *Dispatcher) failed(ctx context.Context, fence store.Fence, head *store.OutboxEntry, last int64, single bool, cause error) (int, error) {
	if d.head != head.ID {
		d.head, d.attempts = head.ID, 0
	}
	d.attempts++
	d.until = max(d.until, last)
	if !single || d.attempts < d.cfg.MaxAttempts {
		return 0, cause
	}
	err := store.InFencedTx(ctx, d.store, fence, func(tx deliveryTx) error {
		if err := tx.DeadLetterInsert(ctx, &store.DeadLetter{Sink: d.sink.Name(), Entry: *head, Attempts: d.attempts,
			LastError: cause.Error(), TenantID: d.cfg.Tenant}); err != nil {
			return err
		}
		return tx.OutboxCursorSet(ctx, d.sink.Name(), head.ID)
	})
	if err != nil {
		return 0, fmt.Errorf("dead-letter outbox entry %d: %w", head.ID, err)
	}
	d.log.ErrorContext(ctx, "Sink gave up on an event: moved to the dead-letter table", "outbox_id", head.ID,
		"type", head.Topic, "subject", head.Key, "attempts", d.attempts, logkey.Err, cause)
	d.attempts = 0
	return 1, nil
}

// replay delivers one batch of the sink's dead letters marked for replay:
// delivered, they leave the table; failed, each counts an attempt. A dead
// letter for another tenant than the sink's now (the configuration gave
// the sink to another tenant since) is not delivered: its replay ends,
// its last error says why, and it stays for the root's callers to see.
func (d *Dispatcher) replay(ctx context.Context, fence store.Fence) (int, error) {
	dls, err := d.store.DeadLetterList(ctx, &store.DeadLetterListParams{Sink: d.sink.Name(), Replay: true, Limit: d.cfg.Batch})
	if err != nil || len(dls) == 0 {
		return 0, err
	}
	entries := make([]*store.OutboxEntry, 0, len(dls))
	ids := make([]int64, 0, len(dls))
	var others []*store.DeadLetter
	for _, dl := range dls {
		if dl.TenantID != d.cfg.Tenant {
			others = append(others, dl)
			continue
		}
		entries, ids = append(entries, &dl.Entry), append(ids, dl.ID)
	}
	if len(others) > 0 {
		err := store.InFencedTx(ctx, d.store, fence, func(tx deliveryTx) error {
			for _, dl := range others {
				// maxAttempts 0: the replay ends at once.
				if err := tx.DeadLetterFailed(ctx, dl.ID, fmt.Sprintf("not replayed: dead-lettered for tenant %q, and the sink is now tenant %q's",
					dl.TenantID, d.cfg.Tenant), 0); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
		d.log.WarnContext(ctx, "Dead letters of another tenant than the sink's were not replayed", "events", len(others))
		if len(ids) == 0 {
			return len(others), nil
		}
	}
	cause := d.sink.Deliver(ctx, entries)
	err = store.InFencedTx(ctx, d.store, fence, func(tx deliveryTx) error {
		if cause == nil {
			return tx.DeadLetterDelete(ctx, ids)
		}
		for _, id := range ids {
			if err := tx.DeadLetterFailed(ctx, id, cause.Error(), d.cfg.MaxAttempts); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if cause != nil {
		return 0, fmt.Errorf("replay dead letters: %w", cause)
	}
	d.log.InfoContext(ctx, "Replayed dead-lettered events", "events", len(ids))
	return len(ids), nil
}
