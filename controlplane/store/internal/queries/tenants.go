package queries

import (
	"context"
	"errors"
	"fmt"

	"github.com/better-compute/better-compute/controlplane/store"
)

// tenantColumns are a tenant's columns, in scanTenant's order.
const tenantColumns = `id, name, coalesce(parent_id, ''), path, suspended_at, deleted_at, created_at`

func scanTenant(r Row) (*store.Tenant, error) {
	t := &store.Tenant{}
	return t, r.Scan(&t.ID, &t.Name, &t.ParentID, &t.Path, &t.SuspendedAt, &t.DeletedAt, &t.CreatedAt)
}

// withinTenant is the SQL condition "the tenant_id column col lies within
// the tenant whose path is the parameter $n, or $n is empty" (ListParams.Within).
func withinTenant(col string, n int) string {
	p := fmt.Sprintf("CAST($%d AS text)", n)
	return fmt.Sprintf(`(%s = '' OR %s IN (SELECT id FROM tenants WHERE substr(path, 1, length(%s)) = %s))`, p, col, p, p)
}

// TenantCreate inserts a child tenant.
func (s *Store) TenantCreate(ctx context.Context, p *store.TenantCreateParams) (*store.Tenant, error) {
	id := p.ID
	if id == "" {
		id = store.NewID("ten")
	}
	var out *store.Tenant
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		parent, err := scanTenant(q.db.QueryRow(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE id = $1 AND deleted_at IS NULL`+q.d.ForUpdate, p.ParentID))
		if err != nil {
			return q.wrap("create tenant "+p.Name+": parent "+p.ParentID, err)
		}
		out, err = scanTenant(q.db.QueryRow(ctx, `INSERT INTO tenants (id, name, parent_id, path, created_at)
			VALUES ($1, $2, $3, $4, now()) RETURNING `+tenantColumns, id, p.Name, parent.ID, parent.Path+id+"/"))
		return q.wrap("create tenant "+p.Name, err)
	})
	return out, err
}

// TenantGet returns a tenant by id, or a live one by name.
func (s *Store) TenantGet(ctx context.Context, idOrName string) (*store.Tenant, error) {
	t, err := scanTenant(s.db.QueryRow(ctx, `SELECT `+tenantColumns+` FROM tenants
		WHERE id = $1 OR (name = $1 AND deleted_at IS NULL) ORDER BY (id = $1) DESC LIMIT 1`, idOrName))
	if err != nil {
		return nil, s.wrap("get tenant "+idOrName, err)
	}
	return t, nil
}

// TenantList pages live tenants within p.Within by id.
func (s *Store) TenantList(ctx context.Context, p *store.ListParams) ([]*store.Tenant, error) {
	rows, err := s.db.Query(ctx, `SELECT `+tenantColumns+` FROM tenants
		WHERE id > $1 AND deleted_at IS NULL AND `+withinTenant("id", 3)+` ORDER BY id LIMIT $2`,
		p.Cursor, limit(p.Limit), p.Within)
	if err != nil {
		return nil, s.wrap("list tenants", err)
	}
	out, err := collect(rows, scanTenant)
	return out, s.wrap("list tenants", err)
}

// TenantSetSuspended suspends or resumes a live tenant.
func (s *Store) TenantSetSuspended(ctx context.Context, id string, suspended bool) (*store.Tenant, error) {
	if id == store.RootTenant {
		return nil, fmt.Errorf("suspend tenant %s: %w", id, store.ErrTenantRoot)
	}
	sql := `UPDATE tenants SET suspended_at = coalesce(suspended_at, now()) WHERE id = $1 AND deleted_at IS NULL RETURNING ` + tenantColumns
	if !suspended {
		sql = `UPDATE tenants SET suspended_at = NULL WHERE id = $1 AND deleted_at IS NULL RETURNING ` + tenantColumns
	}
	t, err := scanTenant(s.db.QueryRow(ctx, sql, id))
	if err != nil {
		return nil, s.wrap("suspend tenant "+id, err)
	}
	return t, nil
}

// TenantDelete marks a subtree deleted, moving its pools first when asked.
func (s *Store) TenantDelete(ctx context.Context, p *store.TenantDeleteParams) (*store.Tenant, error) {
	if p.ID == store.RootTenant {
		return nil, fmt.Errorf("delete tenant %s: %w", p.ID, store.ErrTenantRoot)
	}
	var out *store.Tenant
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		op := "delete tenant " + p.ID
		t, err := scanTenant(q.db.QueryRow(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE id = $1 AND deleted_at IS NULL`+q.d.ForUpdate, p.ID))
		if err != nil {
			return q.wrap(op, err)
		}
		sub := withinTenant("tenant_id", 1)
		if p.MoveNodesTo != "" {
			to, err := scanTenant(q.db.QueryRow(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE id = $1 AND deleted_at IS NULL`, p.MoveNodesTo))
			if err != nil {
				return q.wrap(op+": move nodes to "+p.MoveNodesTo, err)
			}
			if to.Within(t.Path) {
				return fmt.Errorf("%s: move nodes to %s, which is being deleted with it: %w", op, to.ID, store.ErrConflict)
			}
			if _, err := q.db.Exec(ctx, `UPDATE pools SET tenant_id = $2 WHERE `+sub, t.Path, to.ID); err != nil {
				return q.wrap(op+": move pools", err)
			}
		} else {
			var nodes int
			if err := q.db.QueryRow(ctx, `SELECT count(*) FROM nodes WHERE pool_id IN (SELECT id FROM pools WHERE `+sub+`)`, t.Path).Scan(&nodes); err != nil {
				return q.wrap(op+": count nodes", err)
			}
			if nodes > 0 {
				return fmt.Errorf("%s: its subtree's pools hold %d nodes: %w", op, nodes, store.ErrTenantHasNodes)
			}
		}
		if _, err := q.db.Exec(ctx, `UPDATE tenants SET deleted_at = coalesce(deleted_at, now()) WHERE `+withinTenant("id", 1), t.Path); err != nil {
			return q.wrap(op, err)
		}
		out, err = scanTenant(q.db.QueryRow(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE id = $1`, p.ID))
		return q.wrap(op, err)
	})
	return out, err
}

// TenantsStopped returns every tenant at or below a suspended or deleted one.
func (s *Store) TenantsStopped(ctx context.Context) ([]string, error) {
	rows, err := s.db.Query(ctx, `SELECT t.id FROM tenants t WHERE EXISTS (
		SELECT 1 FROM tenants s WHERE (s.suspended_at IS NOT NULL OR s.deleted_at IS NOT NULL)
			AND substr(t.path, 1, length(s.path)) = s.path) ORDER BY t.id`)
	if err != nil {
		return nil, s.wrap("list stopped tenants", err)
	}
	ids, err := collect(rows, func(r Row) (*string, error) {
		var id string
		return &id, r.Scan(&id)
	})
	out := make([]string, len(ids))
	for i, id := range ids {
		out[i] = *id
	}
	return out, s.wrap("list stopped tenants", err)
}

// PoolMove moves a pool to a live tenant.
func (s *Store) PoolMove(ctx context.Context, poolID, tenantID string) (*store.Pool, error) {
	var out *store.Pool
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		if _, err := scanTenant(q.db.QueryRow(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE id = $1 AND deleted_at IS NULL`, tenantID)); err != nil {
			return q.wrap("move pool "+poolID+" to tenant "+tenantID, err)
		}
		pool := &poolRow{}
		err := q.db.QueryRow(ctx, `UPDATE pools SET tenant_id = $2 WHERE id = $1 RETURNING `+poolColumns, poolID, tenantID).Scan(pool.fields()...)
		if err != nil {
			return q.wrap("move pool "+poolID+" to tenant "+tenantID, err)
		}
		out = &pool.Pool
		return nil
	})
	return out, err
}

// NodeMove moves a node into another pool of a live tenant, unless
// something holds it (store.ErrNodeHeld).
func (s *Store) NodeMove(ctx context.Context, nodeID, poolID string) (*store.Node, error) {
	op := "move node " + nodeID + " to pool " + poolID
	var out *store.Node
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		var n int
		if err := q.db.QueryRow(ctx, `SELECT count(*) FROM pools p JOIN tenants t ON t.id = p.tenant_id
			WHERE p.id = $1 AND t.deleted_at IS NULL`, poolID).Scan(&n); err != nil {
			return q.wrap(op, err)
		}
		if n == 0 {
			return fmt.Errorf("%s: pool: %w", op, store.ErrNotFound)
		}
		// An open case stays its pool's (remediations.pool_id): moving the
		// node away from it would leave the old tenant pausing, resuming
		// or returning (rebooting) a node now another's.
		open, err := q.RemediationOpenFor(ctx, nodeID)
		switch {
		case err == nil:
			return fmt.Errorf("%s: %w", op, &store.NodeRemediatingError{NodeID: nodeID, CaseID: open.ID, State: open.State})
		case !errors.Is(err, store.ErrNotFound):
			return err
		}
		var held int
		err = q.db.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM nodes WHERE id = $1 AND disruption <> '')
			+ (SELECT count(*) FROM reservation_slots WHERE node_id = $1 AND starts_at < ends_at AND ends_at > coalesce($2, now()))
			+ (SELECT count(*) FROM rollout_nodes rn JOIN rollouts r ON r.id = rn.rollout_id
				WHERE rn.node_id = $1 AND r.state IN ('pending', 'running', 'paused', 'rolling-back', 'halted'))`,
			nodeID, q.clock(nil)).Scan(&held)
		if err != nil {
			return q.wrap(op, err)
		}
		if held > 0 {
			return fmt.Errorf("%s: %w", op, store.ErrNodeHeld)
		}
		if err := q.exec1(ctx, op, `UPDATE nodes SET pool_id = $2, updated_at = now() WHERE id = $1`, nodeID, poolID); err != nil {
			return err
		}
		out, err = q.NodeGet(ctx, nodeID)
		return err
	})
	return out, err
}
