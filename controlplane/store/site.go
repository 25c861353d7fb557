package store

import (
	"context"
	"time"
)

// DefaultRegion is the region of a gateway configured with none
// (host.gateway.region unset), and so of the embedded default's site.
const DefaultRegion = "default"

// Site is a physical location in a region.
type Site struct {
	ID     string
	Name   string
	Region string
	// TenantID owns the site (RootTenant for sites made before tenants).
	TenantID  string
	CreatedAt time.Time
}

// SiteStore keeps sites.
type SiteStore interface {
	// SiteCreate inserts a site; ErrConflict when the name is taken.
	SiteCreate(ctx context.Context, p *SiteCreateParams) (*Site, error)
	// SiteGet returns the site whose id, else whose name, is idOrName:
	// an id always wins over a name.
	SiteGet(ctx context.Context, idOrName string) (*Site, error)
	SiteList(ctx context.Context, p *ListParams) ([]*Site, error)
}

// SiteCreateParams are SiteCreate's inputs. ID defaults to a new site_ id.
type SiteCreateParams struct {
	ID     string
	Name   string
	Region string
	// TenantID owns the site; defaults to RootTenant.
	TenantID string
}

// Pool is a group of nodes at one site; join tokens are bound to a pool.
type Pool struct {
	ID     string
	Name   string
	SiteID string
	// DisruptionBudget is "N" or "N%" (DisruptionStore); default
	// DefaultDisruptionBudget.
	DisruptionBudget string
	// RemediationConcurrency is how many remediation actions may run at
	// once on the pool's quarantined nodes.
	RemediationConcurrency int
	// TenantID owns the pool and so its nodes, join tokens, reservations,
	// rollouts and commands (docs/tenants.md).
	TenantID  string
	CreatedAt time.Time
}

// PoolStore keeps pools.
type PoolStore interface {
	// PoolCreate inserts a pool; ErrConflict when the name is taken,
	// ErrNotFound when the site does not exist.
	PoolCreate(ctx context.Context, p *PoolCreateParams) (*Pool, error)
	// PoolGet returns the pool whose id, else whose name, is idOrName:
	// an id always wins over a name, so that a pool named like another
	// pool's id never stands in for it.
	PoolGet(ctx context.Context, idOrName string) (*Pool, error)
	PoolList(ctx context.Context, p *ListParams) ([]*Pool, error)
}

// PoolCreateParams are PoolCreate's inputs. ID defaults to a new pool_ id.
type PoolCreateParams struct {
	ID     string
	Name   string
	SiteID string
	// TenantID owns the pool; defaults to RootTenant.
	TenantID string
}
