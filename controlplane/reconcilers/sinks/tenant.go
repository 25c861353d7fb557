package sinks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// TenantTTL is how long a tenant sink trusts what it read of its tenant
// and of a pool's or node's tenant: a pool or node moved away stops
// reaching it within this, as on an event stream (docs/tenants.md).
const TenantTTL = 10 * time.Second

// tenantStore is what a tenant sink reads to place an event.
type tenantStore interface {
	TenantGet(ctx context.Context, idOrName string) (*store.Tenant, error)
	PoolGet(ctx context.Context, idOrName string) (*store.Pool, error)
	NodeGet(ctx context.Context, id string) (*store.Node, error)
}

// tenantFilter keeps the events of a tenant's subtree (Config.Tenant, the
// tenant's id), by the rule of the API's event streams (docs/tenants.md,
// "Events"): an event whose data names a pool (poolId) is that pool's
// tenant's; else one that names a node (nodeId) is the tenant of the
// node's pool now; else one that names a tenant (tenantId: an access
// request's) is that tenant's; an event that names none of them is the
// deployment's, never a tenant's. The tenant is read by its id only, never by a name (a tenant
// named like the id is not it): a deleted tenant, or an id that names
// none, has no events, and no tenant made later can take them.
type tenantFilter struct {
	tenant string
	st     tenantStore
	now    func() time.Time

	read  time.Time
	path  string          // the tenant's path; "" while it does not exist
	pools map[string]bool // pool id: within the subtree
	nodes map[string]bool // node id: its pool within the subtree
}

// keeps reports whether the event of outbox entry e is the tenant's.
func (f *tenantFilter) keeps(ctx context.Context, e *store.OutboxEntry) (bool, error) {
	if now := f.now(); f.path == "" || now.Sub(f.read) >= TenantTTL {
		t, err := f.st.TenantGet(ctx, f.tenant)
		switch {
		case errors.Is(err, store.ErrNotFound):
			f.path = ""
		case err != nil:
			return false, fmt.Errorf("read tenant %s: %w", f.tenant, err)
		case t.ID != f.tenant || t.DeletedAt != nil:
			f.path = ""
		default:
			f.path = t.Path
		}
		f.read, f.pools, f.nodes = now, map[string]bool{}, map[string]bool{}
	}
	if f.path == "" {
		return false, nil
	}
	var env struct {
		Data struct {
			NodeID   string `json:"nodeId"`
			PoolID   string `json:"poolId"`
			TenantID string `json:"tenantId"`
		} `json:"data"`
	}
	if json.Unmarshal(e.Payload, &env) != nil {
		return false, nil
	}
	switch {
	case env.Data.PoolID != "":
		return f.pool(ctx, env.Data.PoolID)
	case env.Data.NodeID != "":
		if ok, cached := f.nodes[env.Data.NodeID]; cached {
			return ok, nil
		}
		n, err := f.st.NodeGet(ctx, env.Data.NodeID)
		if errors.Is(err, store.ErrNotFound) {
			f.nodes[env.Data.NodeID] = false
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("read node %s: %w", env.Data.NodeID, err)
		}
		ok, err := f.pool(ctx, n.PoolID)
		if err == nil {
			f.nodes[env.Data.NodeID] = ok
		}
		return ok, err
	case env.Data.TenantID != "":
		return f.tenantWithin(ctx, env.Data.TenantID)
	}
	return false, nil
}

// tenantWithin reports whether the tenant id lies within the subtree (a
// deleted one does not), read once per TenantTTL like a pool's.
func (f *tenantFilter) tenantWithin(ctx context.Context, id string) (bool, error) {
	key := "tenant " + id
	if ok, cached := f.pools[key]; cached {
		return ok, nil
	}
	t, err := f.st.TenantGet(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		f.pools[key] = false
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read tenant %s: %w", id, err)
	}
	f.pools[key] = t.ID == id && t.DeletedAt == nil && t.Within(f.path)
	return f.pools[key], nil
}

func (f *tenantFilter) pool(ctx context.Context, id string) (bool, error) {
	if ok, cached := f.pools[id]; cached {
		return ok, nil
	}
	p, err := f.st.PoolGet(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		f.pools[id] = false
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read pool %s: %w", id, err)
	}
	t, err := f.st.TenantGet(ctx, p.TenantID)
	if errors.Is(err, store.ErrNotFound) {
		f.pools[id] = false
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read tenant %s: %w", p.TenantID, err)
	}
	f.pools[id] = t.Within(f.path)
	return f.pools[id], nil
}
