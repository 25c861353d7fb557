package placer

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// SummaryStore is what Summarize reads.
type SummaryStore interface {
	FactsStore
	ReservationSlots(ctx context.Context, p *store.ReservationSlotsParams) ([]*store.ReservationSlot, error)
}

// ModelCount counts the GPUs of one model: Total = Free + Reserved +
// Unavailable.
type ModelCount struct {
	Model string
	Total int
	// Reserved GPUs are held by a reservation for some of the window
	// (whatever their node's state); Unavailable ones are not, and sit on
	// a node out of service (not ready, cordoned, disrupted) or are
	// unhealthy; Free ones are the rest.
	Reserved, Unavailable, Free int
}

// Summary is a pool's GPUs over a window, by model.
type Summary struct {
	// Nodes counts the nodes with GPUs.
	Nodes  int
	Models []ModelCount // by model name
}

// Summarize counts the GPUs of poolID (every pool when empty) over [from,
// to) by model: two queries (the nodes without inventories, skipped when
// Facts read them within maxAge; and the held slots of the window) and the
// inventories Facts has not decoded yet. Reservations are always read
// fresh; node states may lag by maxAge (0: none).
func Summarize(ctx context.Context, st SummaryStore, facts *Facts, poolID string, from, to time.Time, maxAge time.Duration) (*Summary, error) {
	nodes, err := facts.Recent(ctx, st, poolID, maxAge)
	if err != nil {
		return nil, err
	}
	slots, err := st.ReservationSlots(ctx, &store.ReservationSlotsParams{PoolID: poolID, From: from, To: to})
	if err != nil {
		return nil, fmt.Errorf("summarize capacity: %w", err)
	}
	held := make(map[gpuKey]bool, len(slots))
	for _, s := range slots {
		held[gpuKey{s.NodeID, s.GPU}] = true
	}
	by := map[string]*ModelCount{}
	sum := &Summary{}
	for _, n := range nodes {
		if len(n.GPUs) == 0 {
			continue
		}
		sum.Nodes++
		for _, g := range n.GPUs {
			m := by[g.Model]
			if m == nil {
				m = &ModelCount{Model: g.Model}
				by[g.Model] = m
			}
			m.Total++
			switch {
			case held[gpuKey{n.ID, g.Index}]:
				m.Reserved++
			case n.Unavailable != "" || !g.Healthy:
				m.Unavailable++
			default:
				m.Free++
			}
		}
	}
	for _, m := range by {
		sum.Models = append(sum.Models, *m)
	}
	slices.SortFunc(sum.Models, func(a, b ModelCount) int { return cmp.Compare(a.Model, b.Model) })
	return sum, nil
}
