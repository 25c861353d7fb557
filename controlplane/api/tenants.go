package api

import (
	"context"
	"errors"
	"fmt"

	"github.com/better-compute/better-compute/controlplane/pkg/iam"
	"github.com/better-compute/better-compute/controlplane/store"
	apiv1 "github.com/better-compute/better-compute/proto/api/v1"
)

// Tenancy (docs/tenants.md). A caller's token holds its role within its
// tenant's subtree. The one rule for a resource outside it: the caller is
// told NOT_FOUND, worded as for a resource that does not exist, so a tenant
// learns nothing of another's names or ids. The checks live here, beside
// invoke's role check, so that policies (issue 46) replace both in one
// place.

// sees reports whether the tenant tenantID lies within p's subtree. A root
// caller sees everything without a read.
func (s *Server) sees(ctx context.Context, p *iam.Principal, tenantID string) (bool, error) {
	if p.TenantPath == store.RootTenant+"/" {
		return true, nil
	}
	if tenantID == "" {
		tenantID = store.RootTenant
	}
	if tenantID == p.TenantID {
		return true, nil
	}
	t, err := s.store.TenantGet(ctx, tenantID)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return p.Sees(t.Path), nil
}

// within is p's subtree as a store list filter: "" for a root caller (no
// filter), else its tenant's path.
func within(p *iam.Principal) string {
	if p.TenantPath == store.RootTenant+"/" {
		return ""
	}
	return p.TenantPath
}

// tenant resolves a tenant id or name for field within p's subtree; a live
// tenant outside it is NOT_FOUND as one that does not exist. "" is p's own.
func (s *Server) tenant(ctx context.Context, p *iam.Principal, field, v string) (*store.Tenant, error) {
	if v == "" {
		v = p.TenantID
	}
	if err := id(field, v); err != nil {
		return nil, err
	}
	t, err := s.store.TenantGet(ctx, v)
	if err == nil && (t.DeletedAt != nil || !p.Sees(t.Path)) {
		err = store.ErrNotFound
	}
	return t, fieldNotFound(err, field, "no tenant "+v)
}

// below resolves a tenant strictly below p's own: what an admin may
// suspend, resume or delete (an admin of the parent).
func (s *Server) below(ctx context.Context, p *iam.Principal, field, v string) (*store.Tenant, error) {
	if v == "" {
		return nil, invalid(field, "is required")
	}
	t, err := s.tenant(ctx, p, field, v)
	if err != nil {
		return nil, err
	}
	if t.ID == store.RootTenant {
		return nil, &Error{Code: apiv1.CodeInvalidArgument, Field: field, Message: "the root tenant can be neither suspended nor deleted"}
	}
	if t.ID == p.TenantID {
		return nil, &Error{Code: apiv1.CodePermissionDenied, Field: field,
			Message: "a token may not suspend, resume or delete its own tenant: ask an admin of its parent"}
	}
	return t, nil
}

// tenantOut is t as the API answers it; suspended is whether t or a
// tenant above it is stopped.
func (s *Server) tenantOut(ctx context.Context, t *store.Tenant) (*apiv1.Tenant, error) {
	stopped, err := s.stoppedTenants(ctx)
	if err != nil {
		return nil, err
	}
	return tenantMessage(t, stopped), nil
}

// stoppedTenants reads the ids of the stopped tenants (and those below
// them) once, for a call that answers one tenant or a page of them.
func (s *Server) stoppedTenants(ctx context.Context) (map[string]bool, error) {
	ids, err := s.store.TenantsStopped(ctx)
	if err != nil {
		return nil, err
	}
	stopped := make(map[string]bool, len(ids))
	for _, id := range ids {
		stopped[id] = true
	}
	return stopped, nil
}

func tenantMessage(t *store.Tenant, stopped map[string]bool) *apiv1.Tenant {
	return &apiv1.Tenant{Id: t.ID, Name: t.Name, ParentId: t.ParentID, CreateTime: ts(t.CreatedAt),
		SuspendTime: tsp(t.SuspendedAt), DeleteTime: tsp(t.DeletedAt), Suspended: stopped[t.ID]}
}

func (s *Server) tenantsCreate(ctx context.Context, p *iam.Principal, r *apiv1.CreateTenantRequest) (*apiv1.Tenant, error) {
	if err := name("name", r.GetName()); err != nil {
		return nil, err
	}
	parent, err := s.tenant(ctx, p, "parent", r.GetParent())
	if err != nil {
		return nil, err
	}
	if parent.Depth()+1 > store.MaxTenantDepth {
		return nil, invalid("parent", "a tenant may sit at most %d levels below the root", store.MaxTenantDepth)
	}
	t, err := s.store.TenantCreate(ctx, &store.TenantCreateParams{Name: r.GetName(), ParentID: parent.ID})
	switch {
	case errors.Is(err, store.ErrConflict):
		return nil, &Error{Code: apiv1.CodeConflict, Field: "name", Message: "a tenant named " + r.GetName() + " exists"}
	case errors.Is(err, store.ErrNotFound):
		return nil, &Error{Code: apiv1.CodeNotFound, Field: "parent", Message: "no tenant " + r.GetParent()}
	case err != nil:
		return nil, err
	}
	return s.tenantOut(ctx, t)
}

func (s *Server) tenantsList(ctx context.Context, p *iam.Principal, r *apiv1.ListTenantsRequest) (*apiv1.ListTenantsResponse, error) {
	lp, err := page(r.GetPage())
	if err != nil {
		return nil, err
	}
	lp.Within = p.TenantPath
	ts, err := s.store.TenantList(ctx, &lp)
	if err != nil {
		return nil, err
	}
	stopped, err := s.stoppedTenants(ctx) // once for the page, not once a tenant
	if err != nil {
		return nil, err
	}
	out := &apiv1.ListTenantsResponse{NextCursor: next(ts, lp, func(x *store.Tenant) string { return x.ID })}
	for _, x := range ts {
		out.Tenants = append(out.Tenants, tenantMessage(x, stopped))
	}
	return out, nil
}

func (s *Server) tenantsGet(ctx context.Context, p *iam.Principal, r *apiv1.TenantRequest) (*apiv1.Tenant, error) {
	t, err := s.tenant(ctx, p, "tenant", r.GetTenant())
	if err != nil {
		return nil, err
	}
	return s.tenantOut(ctx, t)
}

// tenantsSuspend returns tenants.suspend (suspend) or tenants.resume.
// Either takes effect on this process at once and on every other within
// iam.DefaultStoppedRefresh plus one read (docs/tenants.md).
func (s *Server) tenantsSuspend(suspend bool) func(context.Context, *iam.Principal, *apiv1.TenantRequest) (*apiv1.Tenant, error) {
	return func(ctx context.Context, p *iam.Principal, r *apiv1.TenantRequest) (*apiv1.Tenant, error) {
		t, err := s.below(ctx, p, "tenant", r.GetTenant())
		if err != nil {
			return nil, err
		}
		if t, err = s.store.TenantSetSuspended(ctx, t.ID, suspend); err != nil {
			return nil, fieldNotFound(err, "tenant", "no tenant "+r.GetTenant())
		}
		s.auth.Forget()
		s.live.checkNow() // its event streams and tunnels in this process end now
		return s.tenantOut(ctx, t)
	}
}

func (s *Server) tenantsDelete(ctx context.Context, p *iam.Principal, r *apiv1.DeleteTenantRequest) (*apiv1.Tenant, error) {
	t, err := s.below(ctx, p, "tenant", r.GetTenant())
	if err != nil {
		return nil, err
	}
	params := &store.TenantDeleteParams{ID: t.ID}
	if r.GetMoveNodesTo() != "" {
		to, err := s.tenant(ctx, p, "moveNodesTo", r.GetMoveNodesTo())
		if err != nil {
			return nil, err
		}
		if to.Within(t.Path) {
			return nil, invalid("moveNodesTo", "tenant %s is deleted with %s: move the nodes outside it", to.Name, t.Name)
		}
		params.MoveNodesTo = to.ID
	}
	t, err = s.store.TenantDelete(ctx, params)
	switch {
	case errors.Is(err, store.ErrTenantHasNodes):
		return nil, &Error{Code: apiv1.CodeConflict, Field: "moveNodesTo",
			Message: "tenant " + r.GetTenant() + " (or one below it) still owns nodes: move them with moveNodesTo (--move-nodes-to)"}
	case err != nil:
		return nil, fieldNotFound(err, "tenant", "no tenant "+r.GetTenant())
	}
	s.auth.Forget()
	s.live.checkNow()
	return s.tenantOut(ctx, t)
}

// poolsMove moves a pool (and so its nodes) to another tenant; both the
// pool and the tenant must lie within the caller's subtree.
func (s *Server) poolsMove(ctx context.Context, p *iam.Principal, r *apiv1.MovePoolRequest) (*apiv1.Pool, error) {
	pool, err := s.pool(ctx, p, "pool", r.GetPool())
	if err != nil {
		return nil, err
	}
	if r.GetTenant() == "" {
		return nil, invalid("tenant", "is required")
	}
	t, err := s.tenant(ctx, p, "tenant", r.GetTenant())
	if err != nil {
		return nil, err
	}
	pool, err = s.store.PoolMove(ctx, pool.ID, t.ID)
	if err != nil {
		return nil, fieldNotFound(err, "pool", "no pool "+r.GetPool())
	}
	return poolOut(pool), nil
}

// nodesMove moves a node into a pool of another tenant (nodes.move): the
// node, the tenant and the pool must lie within the caller's subtree
// (else NOT_FOUND), the pool must belong to the tenant and sit at the
// node's site (INVALID_ARGUMENT); without a pool the tenant must have
// exactly one there. A held node is CONFLICT (store.ErrNodeHeld), one
// with an open remediation case too, naming the case
// (store.NodeRemediatingError).
func (s *Server) nodesMove(ctx context.Context, p *iam.Principal, r *apiv1.MoveNodeRequest) (*apiv1.NodeResponse, error) {
	n, err := s.node(ctx, p, r.GetId())
	if err != nil {
		return nil, err
	}
	if r.GetTenant() == "" {
		return nil, invalid("tenant", "is required")
	}
	t, err := s.tenant(ctx, p, "tenant", r.GetTenant())
	if err != nil {
		return nil, err
	}
	from, err := s.store.PoolGet(ctx, n.PoolID)
	if err != nil {
		return nil, err
	}
	var to *store.Pool
	if r.GetPool() != "" {
		if to, err = s.pool(ctx, p, "pool", r.GetPool()); err != nil {
			return nil, err
		}
		if to.TenantID != t.ID {
			return nil, invalid("pool", "pool %s is not tenant %s's", r.GetPool(), r.GetTenant())
		}
		if to.SiteID != from.SiteID {
			return nil, invalid("pool", "pool %s is at another site than node %s", r.GetPool(), n.ID)
		}
	} else {
		// The tenant's own pools at the node's site: one page bounds the read.
		pools, err := s.store.PoolList(ctx, &store.ListParams{Limit: store.MaxListLimit, Within: t.Path})
		if err != nil {
			return nil, err
		}
		var names []string
		for _, x := range pools {
			if x.TenantID == t.ID && x.SiteID == from.SiteID {
				to = x
				names = append(names, x.Name)
			}
		}
		if len(names) != 1 {
			return nil, invalid("pool", "tenant %s has %d pools at node %s's site (%v): name one with pool (--pool)",
				r.GetTenant(), len(names), n.ID, names)
		}
	}
	if to.ID == n.PoolID {
		return &apiv1.NodeResponse{Node: nodeOut(n, s.gatewayOf(ctx, n.ID), true)}, nil
	}
	n, err = s.store.NodeMove(ctx, n.ID, to.ID)
	var open *store.NodeRemediatingError
	switch {
	case errors.As(err, &open):
		// A case stays its pool's: moved, the node would be left to the
		// old tenant's remediation.return|pause|resume.
		return nil, &Error{Code: apiv1.CodeConflict, Field: "id", Message: fmt.Sprintf("node %s has open remediation case %s (%s): "+
			"move it once the case is closed: return the node with remediation return %s (--reset-gpu, --reboot or --force as "+
			"its GPUs read), or let remediation return it", r.GetId(), open.CaseID, open.State, open.CaseID)}
	case errors.Is(err, store.ErrNodeHeld):
		return nil, &Error{Code: apiv1.CodeConflict, Field: "id",
			Message: "node " + r.GetId() + " is held by a reservation, a rollout, a repair or a drain: move it once that ends"}
	case err != nil:
		return nil, fieldNotFound(err, "id", "no node "+r.GetId())
	}
	return &apiv1.NodeResponse{Node: nodeOut(n, s.gatewayOf(ctx, n.ID), true)}, nil
}

// poolSeen returns nil when pool poolID lies within p's subtree, an error
// wrapping store.ErrNotFound when it does not (or no longer exists), so
// that a row of another tenant's pool is answered as one that does not
// exist.
func (s *Server) poolSeen(ctx context.Context, p *iam.Principal, poolID string) error {
	if within(p) == "" {
		return nil
	}
	pool, err := s.store.PoolGet(ctx, poolID)
	if err != nil {
		return err
	}
	ok, err := s.sees(ctx, p, pool.TenantID)
	if err == nil && !ok {
		err = fmt.Errorf("pool %s: %w", poolID, store.ErrNotFound)
	}
	return err
}

// poolsSeen returns a filter of rows by their pool for p's lists: true
// for a pool within p's subtree, each pool read once a call.
func (s *Server) poolsSeen(p *iam.Principal) func(ctx context.Context, poolID string) (bool, error) {
	seen := map[string]bool{}
	return func(ctx context.Context, poolID string) (bool, error) {
		if within(p) == "" {
			return true, nil
		}
		if ok, cached := seen[poolID]; cached {
			return ok, nil
		}
		err := s.poolSeen(ctx, p, poolID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return false, err
		}
		seen[poolID] = err == nil
		return err == nil, nil
	}
}

// isNotFound reports whether err is an API NOT_FOUND.
func isNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == apiv1.CodeNotFound
}

// tokenSeen reports whether the API token id belongs to p's subtree.
func (s *Server) tokenSeen(ctx context.Context, p *iam.Principal, id string) (bool, error) {
	t, err := s.store.APITokenGet(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return s.sees(ctx, p, t.TenantID)
}
