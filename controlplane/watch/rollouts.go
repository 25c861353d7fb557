package watch

import (
	"context"
	"fmt"

	"github.com/better-compute/better-compute/controlplane/store"
)

// rolloutRow is a rollout in progress (or halted) on the page.
type rolloutRow struct {
	ID, Pool, Version, State, Reason string
	Wave                             int
	Nodes, Upgraded, Out, Failed     int
}

// maxRollouts bounds the rollouts the page lists (a pool has at most one
// in progress).
const maxRollouts = 20

// rollouts reads the rollouts in progress or halted, with their progress.
func (h *Handler) rollouts(ctx context.Context, pl *places) ([]rolloutRow, error) {
	ros, err := h.store.RolloutList(ctx, &store.RolloutListParams{Active: true, ListParams: store.ListParams{Limit: maxRollouts}})
	if err != nil {
		return nil, fmt.Errorf("list rollouts: %w", err)
	}
	var out []rolloutRow
	for _, ro := range ros {
		nodes, err := h.store.RolloutNodes(ctx, ro.ID)
		if err != nil {
			return nil, fmt.Errorf("read rollout %s: %w", ro.ID, err)
		}
		row := rolloutRow{ID: ro.ID, Pool: pl.poolName[ro.PoolID], Version: ro.Version, State: ro.State, Reason: ro.Reason,
			Wave: ro.CurrentWave, Nodes: len(nodes)}
		if row.Pool == "" {
			row.Pool = ro.PoolID
		}
		for _, n := range nodes {
			switch n.State {
			case store.RolloutNodeUpgraded:
				row.Upgraded++
			case store.RolloutNodeFailed:
				row.Failed++
			case store.RolloutNodeDraining, store.RolloutNodeUpgrading, store.RolloutNodeSoaking, store.RolloutNodeRollingBack:
				row.Out++
			}
		}
		out = append(out, row)
	}
	return out, nil
}
