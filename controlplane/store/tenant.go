package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// RootTenant is the id (and name) of the tenant at the top of the tree
// (migration 0024, docs/tenants.md). Every row that existed before tenants
// is its; it can be neither suspended nor deleted.
const RootTenant = "root"

// MaxTenantDepth is the deepest a tenant may sit below the root (the root
// is depth 0): a bound on the tree a caller can grow.
const MaxTenantDepth = 8

// ErrTenantHasNodes is TenantDelete's error when the subtree still owns
// pools with nodes and no tenant to move them to was given.
var ErrTenantHasNodes = errors.New("tenant still owns nodes")

// ErrTenantRoot is the error of suspending or deleting the root tenant.
var ErrTenantRoot = errors.New("the root tenant can be neither suspended nor deleted")

// Tenant is one node of the tenant tree (docs/tenants.md).
type Tenant struct {
	ID   string
	Name string
	// ParentID is "" for the root tenant only.
	ParentID string
	// Path is the ids from the root down to this tenant, each followed by
	// '/': "root/" for the root, "root/ten_x/" for a child of it. A tenant
	// is within another when its Path starts with the other's.
	Path        string
	SuspendedAt *time.Time
	DeletedAt   *time.Time
	CreatedAt   time.Time
}

// Depth is how far below the root t sits (the root is 0).
func (t *Tenant) Depth() int { return strings.Count(t.Path, "/") - 1 }

// Within reports whether t is the tenant of path or below it.
func (t *Tenant) Within(path string) bool { return strings.HasPrefix(t.Path, path) }

// TenantStore keeps the tenant tree.
type TenantStore interface {
	// TenantCreate inserts a child of p.ParentID: ErrNotFound when the
	// parent does not exist or is deleted, ErrConflict when a live tenant
	// has the name.
	TenantCreate(ctx context.Context, p *TenantCreateParams) (*Tenant, error)
	// TenantGet returns a tenant by id or by the name of a live one;
	// deleted ones are returned by id only, with DeletedAt set.
	TenantGet(ctx context.Context, idOrName string) (*Tenant, error)
	// TenantList pages the live tenants within p.Within by id.
	TenantList(ctx context.Context, p *ListParams) ([]*Tenant, error)
	// TenantSetSuspended suspends (or resumes) a live tenant and returns
	// it: ErrNotFound when there is none, ErrTenantRoot for the root.
	// Suspending one already suspended keeps its first time.
	TenantSetSuspended(ctx context.Context, id string, suspended bool) (*Tenant, error)
	// TenantDelete marks the tenant and every tenant below it deleted, in
	// one transaction. When the subtree's pools hold nodes it returns
	// ErrTenantHasNodes, unless p.MoveNodesTo names a live tenant outside
	// the subtree: then every pool of the subtree (with its nodes) moves
	// there first. ErrTenantRoot for the root, ErrNotFound when the tenant
	// or MoveNodesTo is not live.
	TenantDelete(ctx context.Context, p *TenantDeleteParams) (*Tenant, error)
	// TenantsStopped returns the ids of every live-or-deleted tenant that
	// is suspended or deleted, or lies below one that is: the tenants
	// whose tokens may do nothing.
	TenantsStopped(ctx context.Context) ([]string, error)
	// PoolMove moves a pool, and so its nodes and everything bound to it,
	// to a live tenant: ErrNotFound when either is missing.
	PoolMove(ctx context.Context, poolID, tenantID string) (*Pool, error)
	// NodeMove moves a node, and so its commands and events, into another
	// pool (of any tenant) in one transaction and returns it: ErrNotFound
	// when the node, the pool or the pool's live tenant is missing,
	// ErrNodeHeld (an ErrConflict) while the node is out of service for an
	// owner (a repair, a drain, a rollout), in an open rollout, holds a
	// reservation slot that has not ended, or has an open remediation case
	// (then a *NodeRemediatingError naming the case: a case stays its
	// pool's, so a node that moved away from its case would leave the old
	// tenant acting on it).
	NodeMove(ctx context.Context, nodeID, poolID string) (*Node, error)
}

// ErrNodeHeld is NodeMove's error for a node that a reservation, rollout,
// disruption owner or open remediation case holds; errors.Is(err,
// ErrConflict) holds too.
var ErrNodeHeld = fmt.Errorf("node is held by a reservation, a rollout, a disruption owner or a remediation case: %w", ErrConflict)

// NodeRemediatingError is NodeMove's error for a node with an open
// remediation case; errors.Is(err, ErrNodeHeld) and errors.Is(err,
// ErrConflict) hold too.
type NodeRemediatingError struct {
	NodeID string
	CaseID string // the open case's id (rem_…)
	State  string // the case's state
}

func (e *NodeRemediatingError) Error() string {
	return "node " + e.NodeID + " has open remediation case " + e.CaseID + " (" + e.State + ")"
}

// Unwrap makes the error an ErrNodeHeld.
func (e *NodeRemediatingError) Unwrap() error { return ErrNodeHeld }

// TenantCreateParams are TenantCreate's inputs. ID defaults to a new ten_ id.
type TenantCreateParams struct {
	ID       string
	Name     string
	ParentID string
}

// TenantDeleteParams are TenantDelete's inputs.
type TenantDeleteParams struct {
	ID string
	// MoveNodesTo, when set, is the live tenant that receives the
	// subtree's pools and their nodes.
	MoveNodesTo string
}
