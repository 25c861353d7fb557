// Package feed fans the outbox out to the readers inside one api process:
// the event stream GET {basePath}/events/watch and the fleet page (DESIGN.md,
// "Events"). One loop per process reads the outbox after the newest entry it
// has, with the store's OutboxList (which sees only a gap-free prefix, so no
// entry that commits late is ever passed over), keeps the most recent
// entries in memory and wakes every waiting reader; however many readers
// there are, the database sees one reader.
//
// A reader keeps its own cursor (an outbox id) and calls Next. A cursor the
// memory still covers is answered from it; an older one is read from the
// store, and a cursor below what retention pruned (store
// OutboxPrunedThrough) is a *GapError, never a silent skip.
//
// The loop reads when told (Notify; the wake-up channels Run is given: the
// store's OutboxWritten, for every write of the process, and on PostgreSQL
// a wake.Bus that LISTENs on postgres.OutboxChannel, for the writes of other
// processes) and otherwise every Poll, the fallback that bounds how late an
// event reaches the readers when a wake-up is lost.
package feed

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
)

// Store is what the feed reads.
type Store interface {
	OutboxList(ctx context.Context, afterID int64, limit int) ([]*store.OutboxEntry, error)
	OutboxMaxID(ctx context.Context) (int64, error)
	OutboxPrunedThrough(ctx context.Context) (int64, error)
}

// Config configures a Feed.
type Config struct {
	// Poll is how often the outbox is read when nothing told the feed to.
	// Defaults to 500 ms.
	Poll time.Duration
	// Buffer is how many of the newest entries are kept in memory for
	// readers. Defaults to 4,096.
	Buffer int
	// Batch is the most entries one read takes. Defaults to 500.
	Batch int
}

// Event is one outbox entry as readers get it.
type Event struct {
	// ID is the outbox id: the stream's event id and the resume cursor.
	ID int64
	// Type is the CloudEvents type (the outbox topic).
	Type string
	// Subject is the id of the object the event is about.
	Subject string
	// Time is when the entry was written.
	Time time.Time
	// JSON is the CloudEvents 1.0 envelope (events.FromOutbox).
	JSON []byte
}

// GapError is Next's answer to a cursor below what retention pruned: the
// events after it are partly gone.
type GapError struct {
	// After is the reader's cursor.
	After int64
	// PrunedThrough is the highest id retention deleted.
	PrunedThrough int64
}

func (e *GapError) Error() string {
	return fmt.Sprintf("events after id %d are gone: retention pruned the outbox through id %d; "+
		"list what is left with events list and watch again without a resume id", e.After, e.PrunedThrough)
}

// Feed is the process's outbox reader. Its methods are safe for
// concurrent use.
type Feed struct {
	cfg  Config
	st   Store
	log  *slog.Logger
	wake chan struct{}

	ready chan struct{} // closed once head is known

	woken atomic.Int64 // reads a wake-up started that found entries

	mu      sync.Mutex
	head    int64         // every entry up to head is settled
	from    int64         // ring holds every entry with from < id <= head
	ring    []*Event      // in id order
	changed chan struct{} // closed and replaced when head moves
}

// New returns a Feed on st; call Run.
func New(cfg Config, st Store, log *slog.Logger) *Feed {
	cfg.Poll = cmp.Or(cfg.Poll, 500*time.Millisecond)
	cfg.Buffer = cmp.Or(cfg.Buffer, 4096)
	cfg.Batch = cmp.Or(cfg.Batch, 500)
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Feed{cfg: cfg, st: st, log: log, wake: make(chan struct{}, 1), ready: make(chan struct{}),
		changed: make(chan struct{})}
}

// Notify tells the feed that an entry was written: it reads the outbox now
// rather than at the next poll. It never blocks.
func (f *Feed) Notify() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// Run reads the outbox until ctx ends. Each of wakeups (nil ones are
// ignored) is a further source of Notify: the store's OutboxWritten, a
// wake.Bus subscription.
func (f *Feed) Run(ctx context.Context, wakeups ...<-chan struct{}) error {
	for _, w := range wakeups {
		if w == nil {
			continue
		}
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-w:
					f.Notify()
				}
			}
		}()
	}
	for ctx.Err() == nil {
		if err := f.start(ctx); err == nil {
			break
		} else if ctx.Err() == nil {
			f.log.WarnContext(ctx, "Event feed cannot read the outbox; retrying", logkey.Err, err)
		}
		f.sleep(ctx)
	}
	woke := false // the read that follows a wake-up
	for ctx.Err() == nil {
		n, err := f.read(ctx, woke)
		woke = false
		switch {
		case ctx.Err() != nil:
		case err != nil:
			f.log.WarnContext(ctx, "Event feed cannot read the outbox; retrying", logkey.Err, err)
		case n == f.cfg.Batch:
			continue // more may wait
		}
		woke = f.sleep(ctx)
	}
	return nil
}

// sleep waits for a Notify, the poll interval or ctx; it reports whether
// a Notify ended it.
func (f *Feed) sleep(ctx context.Context) bool {
	t := time.NewTimer(f.cfg.Poll)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-f.wake:
		return true
	case <-t.C:
	}
	return false
}

// WokenReads returns how many reads of the outbox that a wake-up (Notify,
// or one of Run's channels) started, rather than the poll, found new
// entries.
func (f *Feed) WokenReads() int64 { return f.woken.Load() }

// start learns where the outbox ends. OutboxList after the newest id waits,
// under the read lock, for every writer that took a lower id, so what
// follows the newest id is read in order from then on.
func (f *Feed) start(ctx context.Context) error {
	newest, err := f.st.OutboxMaxID(ctx)
	if err != nil {
		return err
	}
	entries, err := f.st.OutboxList(ctx, newest, f.cfg.Batch)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.head, f.from = newest, newest
	f.mu.Unlock()
	f.append(entries)
	close(f.ready)
	return nil
}

// read takes the entries after head into the ring; it returns how many.
// woke says a wake-up started it: one that finds entries is counted
// (WokenReads) before readers see them.
func (f *Feed) read(ctx context.Context, woke bool) (int, error) {
	f.mu.Lock()
	head := f.head
	f.mu.Unlock()
	entries, err := f.st.OutboxList(ctx, head, f.cfg.Batch)
	if err != nil {
		return 0, fmt.Errorf("read outbox after %d: %w", head, err)
	}
	if woke && len(entries) > 0 {
		f.woken.Add(1)
	}
	f.append(entries)
	return len(entries), nil
}

// append adds entries (in id order, all above head) and wakes the readers.
func (f *Feed) append(entries []*store.OutboxEntry) {
	if len(entries) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range entries {
		if e.ID <= f.head {
			continue
		}
		f.ring = append(f.ring, eventOf(e))
		f.head = e.ID
	}
	if over := len(f.ring) - f.cfg.Buffer; over > 0 {
		f.from = f.ring[over-1].ID
		f.ring = append(f.ring[:0:0], f.ring[over:]...)
	}
	close(f.changed)
	f.changed = make(chan struct{})
}

// eventOf is an outbox entry as readers get it.
func eventOf(e *store.OutboxEntry) *Event {
	return &Event{ID: e.ID, Type: e.Topic, Subject: e.Key, Time: e.CreatedAt,
		JSON: events.FromOutbox(e.ID, e.Topic, e.Key, e.Payload, e.CreatedAt)}
}

// Head returns the id of the newest entry the feed has read, waiting until
// the feed has started: a reader that wants only what happens from now on
// starts its cursor there.
func (f *Feed) Head(ctx context.Context) (int64, error) {
	select {
	case <-f.ready:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.head, nil
}

// Next returns up to limit events after the cursor after, oldest first,
// waiting until there is at least one or ctx ends (then ctx's error). A
// cursor below what retention pruned is a *GapError.
func (f *Feed) Next(ctx context.Context, after int64, limit int) ([]*Event, error) {
	limit = max(limit, 1)
	if _, err := f.Head(ctx); err != nil {
		return nil, err
	}
	for {
		f.mu.Lock()
		head, from, changed := f.head, f.from, f.changed
		var out []*Event
		if after < head && after >= from {
			i := sort.Search(len(f.ring), func(i int) bool { return f.ring[i].ID > after })
			out = append(out, f.ring[i:min(i+limit, len(f.ring))]...)
		}
		f.mu.Unlock()
		switch {
		case len(out) > 0:
			return out, nil
		case after < from:
			out, err := f.catchUp(ctx, after, limit)
			if err != nil || len(out) > 0 {
				return out, err
			}
			// Nothing after the cursor although the ring starts above it:
			// only a prune racing this read does that; look again.
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(f.cfg.Poll):
			}
			continue
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
		}
	}
}

// catchUp reads from the store what the ring no longer holds. The pruned
// mark is read after the entries: entries read before a prune began at or
// below the mark are whole; otherwise a cursor below the mark may have lost
// entries to it.
func (f *Feed) catchUp(ctx context.Context, after int64, limit int) ([]*Event, error) {
	entries, err := f.st.OutboxList(ctx, after, limit)
	if err != nil {
		return nil, fmt.Errorf("read outbox after %d: %w", after, err)
	}
	pruned, err := f.st.OutboxPrunedThrough(ctx)
	if err != nil {
		return nil, fmt.Errorf("read outbox retention: %w", err)
	}
	if after < pruned && (len(entries) == 0 || entries[0].ID > pruned) {
		return nil, &GapError{After: after, PrunedThrough: pruned}
	}
	out := make([]*Event, 0, len(entries))
	for _, e := range entries {
		out = append(out, eventOf(e))
	}
	return out, nil
}
