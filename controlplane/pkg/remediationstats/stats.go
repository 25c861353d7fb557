// Package remediationstats computes each pool's remediation figures over
// the cases kept (docs/remediation.md, "Figures"): counts by outcome and
// time-to-return quantiles, read by the API (remediation.stats) and by
// /metrics. It reads cases only; the reconciler that makes them is
// controlplane/remediation.
package remediationstats

import (
	"cmp"
	"context"
	"math"
	"slices"

	"github.com/better-compute/better-compute/controlplane/store"
)

// PoolStats are one pool's figures over the cases kept: durations in
// seconds (docs/remediation.md, "Figures").
type PoolStats struct {
	PoolID                           string
	Cases, Open, Returned, Escalated int
	// ToQuarantine is, per case acted on, from its detection (the case
	// opened in the round that took the finding) to its quarantine.
	ToQuarantine []float64
	// ToReturn is, per returned case, from detection to return (MTTR).
	ToReturn []float64
	// BetweenNode and BetweenGPU are the times between one incident and
	// the next on the same node, and on the same GPU.
	BetweenNode, BetweenGPU []float64
}

// Stats gives each of pools (ids) its figures from cases; every pool is in
// the answer, with no cases at all when it had none. Cases an operator
// ordered count in Cases, Open and Returned only.
func Stats(pools []string, cases []*store.Remediation) map[string]*PoolStats {
	out := make(map[string]*PoolStats, len(pools))
	for _, p := range pools {
		out[p] = &PoolStats{PoolID: p}
	}
	sorted := slices.SortedFunc(slices.Values(cases), func(a, b *store.Remediation) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	lastNode, lastGPU := map[string]*store.Remediation{}, map[string]*store.Remediation{}
	for _, c := range sorted {
		ps := out[c.PoolID]
		if ps == nil {
			continue
		}
		ps.Cases++
		switch {
		case c.ClosedAt == nil:
			ps.Open++
		case c.State == store.RemediationReturned:
			ps.Returned++
		}
		if c.State == store.RemediationEscalated {
			ps.Escalated++
		}
		if c.Finding == store.FindingOrdered {
			continue
		}
		if c.QuarantinedAt != nil {
			ps.ToQuarantine = append(ps.ToQuarantine, seconds(c.QuarantinedAt.Sub(c.CreatedAt).Seconds()))
		}
		if c.ClosedAt != nil && c.State == store.RemediationReturned {
			ps.ToReturn = append(ps.ToReturn, seconds(c.ClosedAt.Sub(c.CreatedAt).Seconds()))
		}
		if prev := lastNode[c.NodeID]; prev != nil {
			ps.BetweenNode = append(ps.BetweenNode, seconds(c.CreatedAt.Sub(prev.CreatedAt).Seconds()))
		}
		lastNode[c.NodeID] = c
		if c.GPUUUID != "" {
			if prev := lastGPU[c.GPUUUID]; prev != nil {
				ps.BetweenGPU = append(ps.BetweenGPU, seconds(c.CreatedAt.Sub(prev.CreatedAt).Seconds()))
			}
			lastGPU[c.GPUUUID] = c
		}
	}
	return out
}

func seconds(s float64) float64 { return math.Max(s, 0) }

// Quantile returns the q quantile (0 to 1) of xs by the nearest rank, 0
// for none.
func Quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// CaseLister lists cases page by page (store.RemediationStore).
type CaseLister interface {
	RemediationList(ctx context.Context, p *store.RemediationListParams) ([]*store.Remediation, error)
}

// AllCases reads every case q selects, page by page.
func AllCases(ctx context.Context, st CaseLister, q store.RemediationListParams) ([]*store.Remediation, error) {
	var out []*store.Remediation
	q.Limit = 1000
	for {
		page, err := st.RemediationList(ctx, &q)
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		if len(page) < q.Limit {
			return out, nil
		}
		q.Cursor = page[len(page)-1].ID
	}
}
