package api

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
)

// eventScopeTTL is how long an event scope trusts what it read of a pool's
// or node's tenant: a stream sees a pool or node moved away within it.
const eventScopeTTL = 10 * time.Second

// eventScope decides which events a caller of a tenant other than the
// root sees (docs/tenants.md, "Events"): an event whose data names a pool
// (poolId) is that pool's tenant's; else one that names a node (nodeId)
// is the tenant of the node's pool now; else one that names a tenant
// (tenantId: an access request's) is that tenant's; any other event (a
// gateway's, an API token's, a CA rotation's) is deployment-wide and shown
// to root callers only. A nil *eventScope (a root caller) sees every
// event.
type eventScope struct {
	s     *Server
	p     *iam.Principal
	read  time.Time
	pools map[string]bool // pool id: within p's subtree
	nodes map[string]bool // node id: its pool within p's subtree
}

// eventScope returns p's event scope, nil for a root caller.
func (s *Server) eventScope(p *iam.Principal) *eventScope {
	if within(p) == "" {
		return nil
	}
	return &eventScope{s: s, p: p}
}

// sees reports whether the caller sees the event whose CloudEvents JSON is
// envelope. Lookups are cached for eventScopeTTL; a store error is
// returned, never guessed.
func (sc *eventScope) sees(ctx context.Context, envelope []byte) (bool, error) {
	if sc == nil {
		return true, nil
	}
	var e struct {
		Data struct {
			NodeID   string `json:"nodeId"`
			PoolID   string `json:"poolId"`
			TenantID string `json:"tenantId"`
		} `json:"data"`
	}
	if json.Unmarshal(envelope, &e) != nil {
		return false, nil
	}
	if time.Since(sc.read) > eventScopeTTL {
		sc.read, sc.pools, sc.nodes = time.Now(), map[string]bool{}, map[string]bool{}
	}
	switch {
	case e.Data.PoolID != "":
		return sc.pool(ctx, e.Data.PoolID)
	case e.Data.NodeID != "":
		if ok, cached := sc.nodes[e.Data.NodeID]; cached {
			return ok, nil
		}
		n, err := sc.s.store.NodeGet(ctx, e.Data.NodeID)
		if errors.Is(err, store.ErrNotFound) {
			sc.nodes[e.Data.NodeID] = false // deleted: its tenant is unknown now
			return false, nil
		}
		if err != nil {
			return false, err
		}
		ok, err := sc.pool(ctx, n.PoolID)
		if err == nil {
			sc.nodes[e.Data.NodeID] = ok
		}
		return ok, err
	case e.Data.TenantID != "":
		return sc.s.sees(ctx, sc.p, e.Data.TenantID)
	}
	return false, nil
}

func (sc *eventScope) pool(ctx context.Context, id string) (bool, error) {
	if ok, cached := sc.pools[id]; cached {
		return ok, nil
	}
	pool, err := sc.s.store.PoolGet(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		sc.pools[id] = false
		return false, nil
	}
	if err != nil {
		return false, err
	}
	ok, err := sc.s.sees(ctx, sc.p, pool.TenantID)
	if err == nil {
		sc.pools[id] = ok
	}
	return ok, err
}
