package gateway

import "sync"

// latest holds, per node, the latest value reported since the last write,
// for a loop that writes them in one transaction: inventories and clock
// skews. The zero value is empty and ready.
type latest[T any] struct {
	mu sync.Mutex
	m  map[string]T
}

// put records v as nodeID's latest.
func (b *latest[T]) put(nodeID string, v T) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]T{}
	}
	b.m[nodeID] = v
}

// take returns everything recorded and empties b.
func (b *latest[T]) take() map[string]T {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.m
	b.m = nil
	return m
}

// putBack queues again the values of a write that failed, except for nodes
// that reported a newer one meanwhile.
func (b *latest[T]) putBack(m map[string]T) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]T{}
	}
	for id, v := range m {
		if _, newer := b.m[id]; !newer {
			b.m[id] = v
		}
	}
}
