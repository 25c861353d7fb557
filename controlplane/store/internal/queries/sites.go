package queries

import (
	"context"

	"github.com/better-compute/better-compute/controlplane/store"
)

// SiteCreate inserts a site.
func (s *Store) SiteCreate(ctx context.Context, p *store.SiteCreateParams) (*store.Site, error) {
	id := p.ID
	if id == "" {
		id = store.NewID("site")
	}
	site := &store.Site{}
	err := s.db.QueryRow(ctx, `INSERT INTO sites (id, name, region, created_at) VALUES ($1, $2, $3, now())
		RETURNING id, name, region, created_at`, id, p.Name, p.Region).
		Scan(&site.ID, &site.Name, &site.Region, &site.CreatedAt)
	if err != nil {
		return nil, s.wrap("create site "+p.Name, err)
	}
	return site, nil
}

// SiteGet returns a site by id or name.
func (s *Store) SiteGet(ctx context.Context, idOrName string) (*store.Site, error) {
	site := &store.Site{}
	err := s.db.QueryRow(ctx, `SELECT id, name, region, created_at FROM sites WHERE id = $1 OR name = $1`, idOrName).
		Scan(&site.ID, &site.Name, &site.Region, &site.CreatedAt)
	if err != nil {
		return nil, s.wrap("get site "+idOrName, err)
	}
	return site, nil
}

// SiteList pages sites by id.
func (s *Store) SiteList(ctx context.Context, p *store.ListParams) ([]*store.Site, error) {
	rows, err := s.db.Query(ctx, `SELECT id, name, region, created_at FROM sites WHERE id > $1 ORDER BY id LIMIT $2`,
		p.Cursor, limit(p.Limit))
	if err != nil {
		return nil, s.wrap("list sites", err)
	}
	out, err := collect(rows, func(r Row) (*store.Site, error) {
		site := &store.Site{}
		return site, r.Scan(&site.ID, &site.Name, &site.Region, &site.CreatedAt)
	})
	return out, s.wrap("list sites", err)
}

// poolColumns are a pool's columns, in poolRow.fields' order.
const poolColumns = `id, name, site_id, disruption_budget, remediation_concurrency, created_at`

// poolRow scans poolColumns.
type poolRow struct{ store.Pool }

func (p *poolRow) fields() []any {
	return []any{&p.ID, &p.Name, &p.SiteID, &p.DisruptionBudget, &p.RemediationConcurrency, &p.CreatedAt}
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
	err := s.db.QueryRow(ctx, `INSERT INTO pools (id, name, site_id, created_at) VALUES ($1, $2, $3, now())
		RETURNING `+poolColumns, id, p.Name, p.SiteID).
		Scan(pool.fields()...)
	if err != nil {
		return nil, s.wrap("create pool "+p.Name, err)
	}
	return &pool.Pool, nil
}

// PoolGet returns a pool by id or name.
func (s *Store) PoolGet(ctx context.Context, idOrName string) (*store.Pool, error) {
	pool := &poolRow{}
	err := s.db.QueryRow(ctx, `SELECT `+poolColumns+` FROM pools WHERE id = $1 OR name = $1`, idOrName).
		Scan(pool.fields()...)
	if err != nil {
		return nil, s.wrap("get pool "+idOrName, err)
	}
	return &pool.Pool, nil
}

// PoolList pages pools by id.
func (s *Store) PoolList(ctx context.Context, p *store.ListParams) ([]*store.Pool, error) {
	rows, err := s.db.Query(ctx, `SELECT `+poolColumns+` FROM pools WHERE id > $1 ORDER BY id LIMIT $2`,
		p.Cursor, limit(p.Limit))
	if err != nil {
		return nil, s.wrap("list pools", err)
	}
	out, err := collect(rows, func(r Row) (*store.Pool, error) {
		pool := &poolRow{}
		return &pool.Pool, r.Scan(pool.fields()...)
	})
	return out, s.wrap("list pools", err)
}
