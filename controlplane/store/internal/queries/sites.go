package queries

import (
	"cmp"
	"context"

	"github.com/better-compute/better-compute/controlplane/store"
)

// siteColumns are a site's columns, in siteRow.fields' order.
const siteColumns = `id, name, region, tenant_id, created_at`

// siteRow scans siteColumns.
type siteRow struct{ store.Site }

func (x *siteRow) fields() []any {
	return []any{&x.ID, &x.Name, &x.Region, &x.TenantID, &x.CreatedAt}
}

// SiteCreate inserts a site.
func (s *Store) SiteCreate(ctx context.Context, p *store.SiteCreateParams) (*store.Site, error) {
	id := p.ID
	if id == "" {
		id = store.NewID("site")
	}
	site := &siteRow{}
	err := s.db.QueryRow(ctx, `INSERT INTO sites (id, name, region, tenant_id, created_at) VALUES ($1, $2, $3, $4, now())
		RETURNING `+siteColumns, id, p.Name, p.Region, cmp.Or(p.TenantID, store.RootTenant)).
		Scan(site.fields()...)
	if err != nil {
		return nil, s.wrap("create site "+p.Name, err)
	}
	return &site.Site, nil
}

// SiteGet returns a site by id or name: the site whose id it is wins over
// one whose name it is (names shaped like ids are refused by the API, but
// a row made before that rule may hold one).
func (s *Store) SiteGet(ctx context.Context, idOrName string) (*store.Site, error) {
	site := &siteRow{}
	err := s.db.QueryRow(ctx, `SELECT `+siteColumns+` FROM sites WHERE id = $1 OR name = $1
		ORDER BY (id = $1) DESC LIMIT 1`, idOrName).
		Scan(site.fields()...)
	if err != nil {
		return nil, s.wrap("get site "+idOrName, err)
	}
	return &site.Site, nil
}

// SiteList pages sites by id.
func (s *Store) SiteList(ctx context.Context, p *store.ListParams) ([]*store.Site, error) {
	rows, err := s.db.Query(ctx, `SELECT `+siteColumns+` FROM sites WHERE id > $1 AND `+withinTenant("tenant_id", 3)+` ORDER BY id LIMIT $2`,
		p.Cursor, limit(p.Limit), p.Within)
	if err != nil {
		return nil, s.wrap("list sites", err)
	}
	out, err := collect(rows, func(r Row) (*store.Site, error) {
		site := &siteRow{}
		return &site.Site, r.Scan(site.fields()...)
	})
	return out, s.wrap("list sites", err)
}

// poolColumns are a pool's columns, in poolRow.fields' order.
const poolColumns = `id, name, site_id, disruption_budget, remediation_concurrency, tenant_id, created_at`

// poolRow scans poolColumns.
type poolRow struct{ store.Pool }

func (p *poolRow) fields() []any {
	return []any{&p.ID, &p.Name, &p.SiteID, &p.DisruptionBudget, &p.RemediationConcurrency, &p.TenantID, &p.CreatedAt}
}

// PoolCreate inserts a pool.
func (s *Store) PoolCreate(ctx context.Context, p *store.PoolCreateParams) (*store.Pool, error) {
	id := p.ID
	if id == "" {
		id = store.NewID("pool")
	}
	if _, err := s.SiteGet(ctx, p.SiteID); err != nil {
		return nil, err
	}
	pool := &poolRow{}
	err := s.db.QueryRow(ctx, `INSERT INTO pools (id, name, site_id, tenant_id, created_at) VALUES ($1, $2, $3, $4, now())
		RETURNING `+poolColumns, id, p.Name, p.SiteID, cmp.Or(p.TenantID, store.RootTenant)).
		Scan(pool.fields()...)
	if err != nil {
		return nil, s.wrap("create pool "+p.Name, err)
	}
	return &pool.Pool, nil
}

// PoolGet returns a pool by id or name: the pool whose id it is wins over
// one whose name it is, so that a pool named like another's id never
// stands in for it (the API refuses such names; a row made before that
// rule may hold one).
func (s *Store) PoolGet(ctx context.Context, idOrName string) (*store.Pool, error) {
	pool := &poolRow{}
	err := s.db.QueryRow(ctx, `SELECT `+poolColumns+` FROM pools WHERE id = $1 OR name = $1
		ORDER BY (id = $1) DESC LIMIT 1`, idOrName).
		Scan(pool.fields()...)
	if err != nil {
		return nil, s.wrap("get pool "+idOrName, err)
	}
	return &pool.Pool, nil
}

// PoolList pages pools by id.
func (s *Store) PoolList(ctx context.Context, p *store.ListParams) ([]*store.Pool, error) {
	rows, err := s.db.Query(ctx, `SELECT `+poolColumns+` FROM pools WHERE id > $1 AND `+withinTenant("tenant_id", 3)+` ORDER BY id LIMIT $2`,
		p.Cursor, limit(p.Limit), p.Within)
	if err != nil {
		return nil, s.wrap("list pools", err)
	}
	out, err := collect(rows, func(r Row) (*store.Pool, error) {
		pool := &poolRow{}
		return &pool.Pool, r.Scan(pool.fields()...)
	})
	return out, s.wrap("list pools", err)
}
