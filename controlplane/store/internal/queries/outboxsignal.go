package queries

import (
	"context"
	"sync"
	"time"
)

// outboxWrite begins an outbox write in s's transaction: it takes the
// dialect's OutboxWriteLock and marks the transaction so that its commit
// signals OutboxWritten's subscribers and, through the notifier, other
// processes (OutboxNotify). Once per transaction: the lock is held until
// the transaction ends, so a batch of a thousand command results pays for
// them once.
func (s *Store) outboxWrite(ctx context.Context) error {
	if s.wrote != nil && *s.wrote {
		return nil
	}
	if s.d.OutboxWriteLock != "" {
		if _, err := s.db.Exec(ctx, s.d.OutboxWriteLock); err != nil {
			return s.wrap("lock outbox", err)
		}
	}
	if s.wrote != nil {
		*s.wrote = true
	}
	return nil
}

// notifier sends the dialect's OutboxNotify after commits that wrote to
// the outbox, on a statement of its own, coalescing: while one is being
// sent, any number of commits make one more. A NOTIFY inside each writing
// transaction made PostgreSQL take its database-wide notification lock at
// every such commit, so writers committed one at a time (at 1,000 event
// transactions a second the sinks fell seconds behind, seen in
// tests/bench/delivery). A notification lost with its process leaves the
// readers to their poll.
type notifier struct {
	pool Pool
	stmt string
	kick chan struct{}
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

func newNotifier(pool Pool, stmt string) *notifier {
	if stmt == "" {
		return nil
	}
	n := &notifier{pool: pool, stmt: stmt, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go n.run()
	return n
}

// wake asks for one notification (after a commit); nil-safe.
func (n *notifier) wake() {
	if n == nil {
		return
	}
	select {
	case n.kick <- struct{}{}:
	default: // one is pending already
	}
}

func (n *notifier) run() {
	defer close(n.done)
	for {
		select {
		case <-n.stop:
			return
		case <-n.kick:
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, _ = n.pool.Exec(ctx, n.stmt) // readers poll when it fails
			cancel()
		}
	}
}

// close stops the notifier; nil-safe.
func (n *notifier) close() {
	if n == nil {
		return
	}
	n.once.Do(func() { close(n.stop) })
	<-n.done
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
