// Package wake tells gateways that commands wait for dispatch, right after
// the API commits them, so dispatch does not wait for the gateways' 1-second
// loop (DESIGN.md, "gateway").
//
// In one process (the embedded default) a Bus delivers wake-ups in memory.
// Across processes on PostgreSQL, Bus.Wake also sends NOTIFY on the channel
// better_compute_wake and every gateway's Listener turns the notifications
// it receives into local wake-ups. A wake-up is a hint only: the gateways'
// loop still finds every queued command without one.
//
// The same listener (ListenChannels) also wakes the api's event feed when
// another process commits an outbox write: the store sends NOTIFY on
// postgres.OutboxChannel in every such transaction.
package wake

import (
	"context"
	"sync"
)

// Channel is the PostgreSQL NOTIFY channel.
const Channel = "better_compute_wake"

// Notifier sends wake-ups to other processes (PostgreSQL NOTIFY).
type Notifier interface {
	Notify(ctx context.Context) error
}

// Bus fans wake-ups out to local subscribers and, when set, to other
// processes through its Notifier.
type Bus struct {
	remote Notifier

	mu   sync.Mutex
	subs map[chan struct{}]struct{}
}

// NewBus returns a Bus; remote may be nil (one process).
func NewBus(remote Notifier) *Bus {
	return &Bus{remote: remote, subs: map[chan struct{}]struct{}{}}
}

// Wake wakes every local subscriber and, through the notifier, every other
// process. Errors of the notifier are ignored: the loop is the fallback.
func (b *Bus) Wake(ctx context.Context, _ []string) {
	b.Local()
	if b.remote != nil {
		_ = b.remote.Notify(ctx)
	}
}

// Local wakes the local subscribers only.
func (b *Bus) Local() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for ch := range b.subs {
		select {
		case ch <- struct{}{}:
		default: // a wake-up is already pending: coalesce
		}
	}
}

// Subscribe returns a channel that receives a value after wake-ups (several
// coalesce into one) and a function that ends the subscription.
func (b *Bus) Subscribe() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	b.mu.Lock()
	b.subs[ch] = struct{}{}
	b.mu.Unlock()
	return ch, func() {
		b.mu.Lock()
		delete(b.subs, ch)
		b.mu.Unlock()
	}
}
