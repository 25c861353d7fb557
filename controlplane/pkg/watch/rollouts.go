package watch

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/better-compute/better-compute/controlplane/pkg/healthgate"
	"github.com/better-compute/better-compute/controlplane/store"
)

// rolloutRow is a rollout in progress (or halted) on the page.
type rolloutRow struct {
	ID, Pool, Version, State, Reason string
	Wave                             int
	Nodes, Upgraded, Out, Failed     int
	// Waves are the rollout's waves in order, with their figures.
	Waves []waveRow
}

// waveRow is one wave of a rollout: its nodes by outcome, the session
// drops and bcd restarts its upgraded nodes showed while watched (the
// health gate's figures, migration 0018_rollout_watch), and its verdict.
type waveRow struct {
	Wave                                                  int
	Nodes, Upgraded, Out, Failed, Skipped, Drops, Pending int
	Verdict                                               string
	// Gate is the wave's health gate in one line (healthgate.Report's
	// verdict and figures, issue 30), "" before it is decided.
	Gate string
}

// maxRollouts bounds the rollouts the page lists (a pool has at most one
// in progress).
const maxRollouts = 20

// rollouts reads the rollouts in progress or halted, with their progress.
func (h *Handler) rollouts(ctx context.Context, sc *scope, pl *places) ([]rolloutRow, error) {
	ros, err := h.store.RolloutList(ctx, &store.RolloutListParams{Active: true, ListParams: store.ListParams{Limit: maxRollouts}})
	if err == nil && sc != nil {
		// A tenant's session: its pools' own (at most one each), not the
		// first maxRollouts of the fleet's.
		ros = nil
		for _, id := range slices.Sorted(maps.Keys(sc.pools)) {
			rs, err := h.store.RolloutList(ctx, &store.RolloutListParams{PoolID: id, Active: true, ListParams: store.ListParams{Limit: 1}})
			if err != nil {
				return nil, fmt.Errorf("list rollouts: %w", err)
			}
			if ros = append(ros, rs...); len(ros) >= maxRollouts {
				break
			}
		}
	}
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
		waves := map[int]*waveRow{}
		for _, n := range nodes {
			if n.Wave > 0 {
				w := waves[n.Wave]
				if w == nil {
					w = &waveRow{Wave: n.Wave}
					waves[n.Wave] = w
				}
				w.Nodes++
				w.Drops += n.Drops
				switch n.State {
				case store.RolloutNodeUpgraded:
					w.Upgraded++
				case store.RolloutNodeFailed:
					w.Failed++
				case store.RolloutNodeSkipped:
					w.Skipped++
				case store.RolloutNodePending:
					w.Pending++
				default:
					w.Out++
				}
			}
			switch n.State {
			case store.RolloutNodeUpgraded:
				row.Upgraded++
			case store.RolloutNodeFailed:
				row.Failed++
			case store.RolloutNodeDraining, store.RolloutNodeUpgrading, store.RolloutNodeSoaking, store.RolloutNodeRollingBack:
				row.Out++
			}
		}
		gates := map[int]*healthgate.Report{}
		for i := range ro.Gates {
			gates[ro.Gates[i].Wave] = &ro.Gates[i]
		}
		for i := 1; i <= ro.CurrentWave || waves[i] != nil; i++ {
			w := waves[i]
			if w == nil {
				continue
			}
			if g := gates[i]; g != nil {
				w.Gate = "health gate " + g.Verdict
				if g.Pending {
					w.Gate += " (soak extended)"
				}
				w.Gate += " — " + g.Summary()
			}
			switch {
			case w.Failed > 0:
				w.Verdict = "failed: the rollout halts"
			case w.Upgraded+w.Skipped == w.Nodes:
				w.Verdict = "passed"
			default:
				w.Verdict = "in progress"
			}
			row.Waves = append(row.Waves, *w)
		}
		out = append(out, row)
	}
	return out, nil
}
