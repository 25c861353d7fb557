package placer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/inventory"
	"github.com/better-compute/better-compute/controlplane/store"
)

// GPU is what placement knows of one GPU of a node's inventory.
type GPU struct {
	// Index is the NVML index; UUID the device's.
	Index int
	UUID  string
	// Model is the NVML product name ("NVIDIA H100 80GB HBM3").
	Model string
	// MemoryMiB is its framebuffer in MiB.
	MemoryMiB int64
	// Healthy is true when its health is "ok" (inventory.HealthName).
	Healthy bool
	// lower is Model in lower case, for matching.
	lower string
}

// Node is a node as placement sees it.
type Node struct {
	ID     string
	PoolID string
	Labels map[string]string
	// Unavailable says why nothing may be placed on the node ("" when it
	// is in service): not ready, cordoned, or out of service for a
	// disruption (quarantined, draining, remediating, upgrading).
	Unavailable string
	GPUs        []GPU
}

// unavailable is why n takes no placement, "" when it may.
func unavailable(n *store.Node) string {
	switch {
	case n.Disruption != "":
		return "out of service (" + n.Disruption + ")"
	case n.Cordoned:
		return "cordoned"
	case n.State != store.NodeReady:
		return "not ready (" + n.State + ")"
	}
	return ""
}

// FactsStore is what Facts reads.
type FactsStore interface {
	ReservationNodes(ctx context.Context, poolID string) ([]*store.Node, error)
	NodeInventories(ctx context.Context, ids []string) (map[string][]byte, error)
}

// Facts reads the nodes of pools with their GPUs, decoding a node's
// inventory only when its digest changed since the last read: one light
// query a read, however many nodes. Safe for concurrent use.
type Facts struct {
	mu    sync.Mutex
	cache map[string]cachedGPUs
	lists map[string]cachedList // pool ("" every pool) -> its last read, for Recent
}

type cachedList struct {
	at    time.Time
	nodes []*Node
}

type cachedGPUs struct {
	digest string
	gpus   []GPU
}

// NewFacts returns an empty Facts.
func NewFacts() *Facts { return &Facts{cache: map[string]cachedGPUs{}, lists: map[string]cachedList{}} }

// Recent returns Nodes(poolID) as read within maxAge (on the monotonic
// clock), reading again when the last read is older: for readers that may
// lag the fleet by maxAge (capacity.summary: 2 s), as the fleet page and
// the metrics do. The nodes returned are shared: callers must not change
// them.
func (f *Facts) Recent(ctx context.Context, st FactsStore, poolID string, maxAge time.Duration) ([]*Node, error) {
	f.mu.Lock()
	c, ok := f.lists[poolID]
	f.mu.Unlock()
	if ok && maxAge > 0 && time.Since(c.at) < maxAge {
		return c.nodes, nil
	}
	at := time.Now()
	nodes, err := f.Nodes(ctx, st, poolID)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.lists[poolID] = cachedList{at: at, nodes: nodes}
	f.mu.Unlock()
	return nodes, nil
}

// Nodes returns the nodes of poolID (every pool when empty), by id.
func (f *Facts) Nodes(ctx context.Context, st FactsStore, poolID string) ([]*Node, error) {
	nodes, err := st.ReservationNodes(ctx, poolID)
	if err != nil {
		return nil, fmt.Errorf("read nodes of pool %s: %w", poolID, err)
	}
	f.mu.Lock()
	var stale []string
	for _, n := range nodes {
		if c, ok := f.cache[n.ID]; !ok || c.digest != n.InventoryDigest {
			stale = append(stale, n.ID)
		}
	}
	f.mu.Unlock()
	if len(stale) > 0 {
		invs, err := st.NodeInventories(ctx, stale)
		if err != nil {
			return nil, fmt.Errorf("read inventories of pool %s: %w", poolID, err)
		}
		decoded := make(map[string][]GPU, len(stale))
		for _, id := range stale {
			decoded[id] = gpusOf(invs[id])
		}
		f.mu.Lock()
		for _, n := range nodes {
			if g, ok := decoded[n.ID]; ok {
				f.cache[n.ID] = cachedGPUs{digest: n.InventoryDigest, gpus: g}
			}
		}
		f.mu.Unlock()
	}
	out := make([]*Node, len(nodes))
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, n := range nodes {
		out[i] = &Node{ID: n.ID, PoolID: n.PoolID, Labels: n.Labels, Unavailable: unavailable(n), GPUs: f.cache[n.ID].gpus}
	}
	return out, nil
}

// gpusOf decodes the GPUs of a stored inventory.
func gpusOf(b []byte) []GPU {
	var out []GPU
	for _, g := range inventory.Decode(b).GetGpus() {
		out = append(out, GPU{Index: int(g.GetIndex()), UUID: g.GetUuid(), Model: g.GetName(), lower: strings.ToLower(g.GetName()),
			MemoryMiB: int64(g.GetMemoryTotalBytes() >> 20), Healthy: inventory.HealthName(g.GetHealth()) == "ok"})
	}
	return out
}

// matches reports whether g is of model (lower case: a case-insensitive
// substring of its product name; "" any) with at least minMiB of memory.
func (g *GPU) matches(model string, minMiB int64) bool {
	if model != "" && !strings.Contains(g.lower, model) {
		return false
	}
	return g.MemoryMiB >= minMiB
}
