package queries

import (
	"context"
	"sync"
)

// outboxWrite begins an outbox write in s's transaction: it takes the
// dialect's OutboxWriteLock, runs its OutboxNotify, and marks the
// transaction so that its commit signals OutboxWritten's subscribers. Once
// per transaction: the lock is held and the notification pending until the
// transaction ends, so a batch of a thousand command results pays for them
// once.
func (s *Store) outboxWrite(ctx context.Context) error {
	if s.wrote != nil && *s.wrote {
		return nil
	}
	if s.d.OutboxWriteLock != "" {
		if _, err := s.db.Exec(ctx, s.d.OutboxWriteLock); err != nil {
			return s.wrap("lock outbox", err)
		}
	}
	if s.d.OutboxNotify != "" {
		if _, err := s.db.Exec(ctx, s.d.OutboxNotify); err != nil {
			return s.wrap("notify outbox readers", err)
		}
	}
	if s.wrote != nil {
		*s.wrote = true
	}
	return nil
}

// OutboxWritten returns a channel that receives a value after each commit,
// through this handle, of a transaction that wrote to the outbox (several
// coalesce into one pending value), and the function that ends the
// subscription.
func (s *Store) OutboxWritten() (<-chan struct{}, func()) { return s.written.subscribe() }

// signal fans a coalescing wake-up out to its subscribers.
type signal struct {
	mu   sync.Mutex
	subs map[chan struct{}]struct{}
}

func newSignal() *signal { return &signal{subs: map[chan struct{}]struct{}{}} }

func (g *signal) subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	g.mu.Lock()
	g.subs[ch] = struct{}{}
	g.mu.Unlock()
	return ch, func() {
		g.mu.Lock()
		delete(g.subs, ch)
		g.mu.Unlock()
	}
}

func (g *signal) fire() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for ch := range g.subs {
		select {
		case ch <- struct{}{}:
		default: // one is pending already
		}
	}
}
