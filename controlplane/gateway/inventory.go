package gateway

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// inventoryInterval is how often reported inventories are stored, all of
// them in one transaction.
const inventoryInterval = 250 * time.Millisecond

// inventoryWrite is one node's inventory to store.
type inventoryWrite struct {
	doc      []byte // protojson of the Inventory message
	digest   string
	attempts int // failed writes so far
	// gpus are the inventory's GPUs, for the GPUs' placements
	// (store.GPUStore; issue 44), at the time it came.
	gpus []store.GPUSeen
	at   time.Time
}

// gpusSeen returns the GPUs of inv as a placement records them, at most
// maxPlacedGPUs.
func gpusSeen(inv *sessionv1.Inventory) []store.GPUSeen {
	out := make([]store.GPUSeen, 0, min(len(inv.GetGpus()), maxPlacedGPUs))
	for _, g := range inv.GetGpus() {
		if len(out) == maxPlacedGPUs {
			break
		}
		if g.GetUuid() == "" || !text(g.GetUuid(), maxGPUUUIDLen) {
			continue
		}
		out = append(out, store.GPUSeen{UUID: g.GetUuid(), Serial: textOrNone(g.GetSerial(), maxGPUUUIDLen),
			Model: textOrNone(g.GetName(), maxGPUUUIDLen), Health: gpuHealth(g.GetHealth().GetState())})
	}
	return out
}

// maxPlacedGPUs bounds the GPUs of one inventory that are placed (a
// machine has 8 or 16; bcd reports what NVML enumerates).
const maxPlacedGPUs = 256

// maxGPUUUIDLen bounds a placement's UUID, serial and model: a GPU whose
// UUID is longer (or not text) is left out, a serial or model longer (or
// not text) is left empty. Cutting bytes could split a UTF-8 character,
// which PostgreSQL refuses for the whole write.
const maxGPUUUIDLen = 128

// textOrNone is v when it is text of at most n bytes (text), "" otherwise.
func textOrNone(v string, n int) string {
	if !text(v, n) {
		return ""
	}
	return v
}

// gpuHealth names a GPU health state as a placement keeps it.
func gpuHealth(h sessionv1.GPUHealthState) string {
	switch h {
	case sessionv1.GPUHealthState_GPU_HEALTH_STATE_OK:
		return store.GPUHealthOK
	case sessionv1.GPUHealthState_GPU_HEALTH_STATE_DEGRADED:
		return store.GPUHealthDegraded
	case sessionv1.GPUHealthState_GPU_HEALTH_STATE_FAILED:
		return store.GPUHealthFailed
	}
	return ""
}

// maxInventoryAttempts bounds how often one inventory is tried; one the
// database refuses (PostgreSQL's jsonb takes no NUL character) is then
// dropped instead of failing every batch after it.
const maxInventoryAttempts = 3

// inventoryBatch holds the inventories reported since the last write, the
// latest per node. Written one by one, each in a transaction of its own,
// they were most of the writes of a fleet connecting for the first time,
// and on SQLite each took a turn of the one writer ahead of the session
// rows that daemons wait on.
type inventoryBatch = latest[inventoryWrite]

// inventoryLoop stores the reported inventories every inventoryInterval,
// and once more when ctx ends.
func (g *Gateway) inventoryLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := g.storeInventories(final); err != nil {
				g.log.Warn("Inventories not stored at shutdown", logkey.Err, err)
			}
			return
		case <-g.cfg.Clock.After(inventoryInterval):
			if err := g.storeInventories(ctx); err != nil && ctx.Err() == nil {
				g.log.WarnContext(ctx, "Inventories not stored; retrying", logkey.Err, err)
			}
		}
	}
}

// inventoryTx is what storing a node's inventory touches: its row and its
// GPUs' placements.
type inventoryTx interface {
	NodeSetInventory(ctx context.Context, id string, inventory []byte, digest string) error
	GPUPlacementsSet(ctx context.Context, p *store.GPUPlacementsSetParams) error
}

// storeInventories writes the pending inventories in one transaction, in
// node id order; a node deleted meanwhile is skipped. When the transaction
// fails, each is tried in one of its own, so that one the database refuses
// holds up no other; those that fail stay pending, up to
// maxInventoryAttempts.
func (g *Gateway) storeInventories(ctx context.Context) error {
	m := g.inventories.take()
	if len(m) == 0 {
		return nil
	}
	ids := slices.Sorted(maps.Keys(m))
	// write stores a node's inventory and its GPUs' placements, in the
	// caller's transaction.
	write := func(st inventoryTx, id string) error {
		w := m[id]
		if err := st.NodeSetInventory(ctx, id, w.doc, w.digest); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return nil
			}
			return err
		}
		at := w.at
		err := st.GPUPlacementsSet(ctx, &store.GPUPlacementsSetParams{NodeID: id, GPUs: w.gpus, Now: &at})
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		return nil
	}
	err := store.InTx(ctx, g.store, func(tx inventoryTx) error {
		for _, id := range ids {
			if err := write(tx, id); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil || ctx.Err() != nil {
		if err != nil {
			g.inventories.putBack(m)
		}
		return err
	}
	failed := map[string]inventoryWrite{}
	for _, id := range ids {
		if err := store.InTx(ctx, g.store, func(tx inventoryTx) error { return write(tx, id) }); err != nil {
			w := m[id]
			if w.attempts++; w.attempts < maxInventoryAttempts {
				failed[id] = w
			} else {
				g.log.WarnContext(ctx, "Inventory dropped: the database refused it", logkey.NodeID, id, logkey.Err, err)
			}
		}
	}
	g.inventories.putBack(failed)
	return err
}
