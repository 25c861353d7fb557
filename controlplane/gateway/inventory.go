package gateway

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// inventoryInterval is how often reported inventories are stored, all of
// them in one transaction.
const inventoryInterval = 250 * time.Millisecond

// inventoryWrite is one node's inventory to store.
type inventoryWrite struct {
	doc    []byte // protojson of the Inventory message
	digest string
}

// inventoryBatch holds the inventories reported since the last write, the
// latest per node. Written one by one, each in a transaction of its own,
// they were most of the writes of a fleet connecting for the first time,
// and on SQLite each took a turn of the one writer ahead of the session
// rows that daemons wait on.
type inventoryBatch struct {
	mu sync.Mutex
	m  map[string]inventoryWrite
}

func (b *inventoryBatch) put(nodeID string, w inventoryWrite) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]inventoryWrite{}
	}
	b.m[nodeID] = w
}

func (b *inventoryBatch) take() map[string]inventoryWrite {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := b.m
	b.m = nil
	return m
}

// putBack queues again the writes of a batch that failed, except for nodes
// that reported a newer inventory meanwhile.
func (b *inventoryBatch) putBack(m map[string]inventoryWrite) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]inventoryWrite{}
	}
	for id, w := range m {
		if _, newer := b.m[id]; !newer {
			b.m[id] = w
		}
	}
}

// inventoryLoop stores the reported inventories every inventoryInterval,
// and once more when ctx ends.
func (g *Gateway) inventoryLoop(ctx context.Context) {
	t := time.NewTicker(inventoryInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := g.storeInventories(final); err != nil {
				g.log.Warn("Inventories not stored at shutdown", "error", err)
			}
			return
		case <-t.C:
			if err := g.storeInventories(ctx); err != nil && ctx.Err() == nil {
				g.log.WarnContext(ctx, "Inventories not stored; retrying", "error", err)
			}
		}
	}
}

// storeInventories writes the pending inventories in one transaction; a
// node deleted meanwhile is skipped. On failure they stay pending.
func (g *Gateway) storeInventories(ctx context.Context) error {
	m := g.inventories.take()
	if len(m) == 0 {
		return nil
	}
	err := g.store.Tx(ctx, func(tx store.Store) error {
		for id, w := range m {
			if err := tx.NodeSetInventory(ctx, id, w.doc, w.digest); err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
		}
		return nil
	})
	if err != nil {
		g.inventories.putBack(m)
	}
	return err
}
