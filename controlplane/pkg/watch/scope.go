package watch

import (
	"context"
	"fmt"

	"github.com/better-compute/better-compute/controlplane/store"
)

// scope is the part of the fleet a page session sees (docs/tenants.md,
// "The fleet page"): the pools of its token's tenant's subtree, read once
// a request, and so their nodes, GPUs, cases, breakers, reservations,
// rollouts, commands and events. A nil *scope (a root session) sees the
// whole fleet. What lies outside it is answered as what does not exist.
type scope struct {
	pools  map[string]bool // pool id: within the subtree
	within string          // the subtree's path, a store list filter
}

// scopeOf reads s's scope: nil for a root session.
func (h *Handler) scopeOf(ctx context.Context, s *session) (*scope, error) {
	if s.within == "" {
		return nil, nil
	}
	sc := &scope{pools: map[string]bool{}, within: s.within}
	for lp := (store.ListParams{Limit: store.MaxListLimit, Within: s.within}); ; {
		pools, err := h.store.PoolList(ctx, &lp)
		if err != nil {
			return nil, fmt.Errorf("list the session's pools: %w", err)
		}
		for _, p := range pools {
			sc.pools[p.ID] = true
		}
		if len(pools) < lp.Limit {
			return sc, nil
		}
		lp.Cursor = pools[len(pools)-1].ID
	}
}

// path is the scope as a store list filter (store.ListParams.Within): ""
// for a nil scope, every tenant's.
func (sc *scope) path() string {
	if sc == nil {
		return ""
	}
	return sc.within
}

// pool reports whether the pool poolID lies within the scope.
func (sc *scope) pool(poolID string) bool { return sc == nil || sc.pools[poolID] }

// restrict returns the part of snapshot s within sc: its pools, their
// nodes and their GPUs (s itself for a nil scope). The cached snapshot is
// the whole fleet's, shared by every session; a tenant's session gets
// this view of it.
func (sc *scope) restrict(s *snapshot) *snapshot {
	if sc == nil {
		return s
	}
	out := &snapshot{At: s.At, key: s.key, gpu: map[string]*fleetNode{}, byID: map[string]*fleetNode{}}
	for _, p := range s.Pools {
		if sc.pools[p.ID] {
			out.Pools = append(out.Pools, p)
		}
	}
	for _, n := range s.Nodes {
		if !sc.pools[n.PoolID] {
			continue
		}
		out.Nodes = append(out.Nodes, n)
		out.byID[n.ID] = n
		for i := range n.GPUs {
			out.gpu[n.GPUs[i].UUID] = n
		}
	}
	return out
}

// nodeCounts are the node counts by site, state and cordon of the nodes of
// s (a restricted snapshot), as store.NodeCounts gives the whole fleet's.
func nodeCounts(s *snapshot) []*store.NodeCount {
	type k struct{ site, state string }
	by := map[k]*store.NodeCount{}
	var out []*store.NodeCount
	for _, n := range s.Nodes {
		c := by[k{n.SiteID, n.State}]
		if c == nil {
			c = &store.NodeCount{SiteID: n.SiteID, State: n.State}
			by[k{n.SiteID, n.State}] = c
			out = append(out, c)
		}
		c.Nodes++
		if n.Cordoned {
			c.Cordoned++
		}
	}
	return out
}

// openCommands counts the open commands of the nodes of s (a restricted
// snapshot) by state, as store.CommandCountOpen counts the whole fleet's.
func (h *Handler) openCommands(ctx context.Context, s *snapshot) (map[string]int, error) {
	out := map[string]int{}
	for _, state := range openCommandStates {
		for lp := (store.CommandListParams{State: state, ListParams: store.ListParams{Limit: store.MaxListLimit}}); ; {
			cs, err := h.store.CommandList(ctx, &lp)
			if err != nil {
				return nil, fmt.Errorf("list %s commands: %w", state, err)
			}
			for _, c := range cs {
				if s.byID[c.NodeID] != nil {
					out[state]++
				}
			}
			if len(cs) < lp.Limit {
				break
			}
			lp.Cursor = cs[len(cs)-1].ID
		}
	}
	return out, nil
}

// sees reports whether an event whose data names poolID and nodeID lies
// within sc (snap restricted to it), as the API's event scope decides: the
// pool's tenant's, else the tenant of the node's pool now; an event that
// names neither is the deployment's, outside every tenant's scope.
func (sc *scope) sees(snap *snapshot, poolID, nodeID string) bool {
	switch {
	case sc == nil:
		return true
	case poolID != "":
		return sc.pools[poolID]
	case nodeID != "":
		return snap.byID[nodeID] != nil
	}
	return false
}
