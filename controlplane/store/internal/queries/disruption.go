package queries

import (
	"context"
	"fmt"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
)

// outOfService is the condition, on a nodes row, of a node that counts
// against its pool's disruption budget: held out of service, or out by its
// state (DESIGN.md, "The disruption budget": whatever the reason).
const outOfService = `(disruption <> '' OR state IN ('` + store.NodeUnreachable + `', '` +
	store.NodePoweredOff + `', '` + store.NodeDraining + `', '` + store.NodeClockSkewed + `'))`

// poolBudget reads a pool's budget and counts. Inside DisruptionAdmit it
// runs after the pool's row is locked, so the counts cannot change under it.
func (s *Store) poolBudget(ctx context.Context, poolID string, lock bool) (*store.PoolBudget, error) {
	b := &store.PoolBudget{PoolID: poolID}
	suffix := ""
	if lock {
		suffix = s.d.LockParent
	}
	err := s.db.QueryRow(ctx, `SELECT disruption_budget, remediation_concurrency FROM pools WHERE id = $1`+suffix, poolID).
		Scan(&b.Spec, &b.RemediationConcurrency)
	if err != nil {
		return nil, s.wrap("read budget of pool "+poolID, err)
	}
	err = s.db.QueryRow(ctx, `SELECT count(*),
		coalesce(sum(CASE WHEN `+outOfService+` THEN 1 ELSE 0 END), 0),
		coalesce(sum(CASE WHEN disruption = $2 THEN 1 ELSE 0 END), 0)
		FROM nodes WHERE pool_id = $1`, poolID, store.DisruptionRemediating).
		Scan(&b.Nodes, &b.OutOfService, &b.Remediating)
	if err != nil {
		return nil, s.wrap("count out-of-service nodes of pool "+poolID, err)
	}
	b.Budget = store.ResolveBudget(b.Spec, b.Nodes)
	return b, nil
}

// PoolBudget reads a pool's budget and what counts against it now.
func (s *Store) PoolBudget(ctx context.Context, poolID string) (*store.PoolBudget, error) {
	return s.poolBudget(ctx, poolID, false)
}

// PoolSetBudget sets a pool's budget spec and remediation concurrency.
func (s *Store) PoolSetBudget(ctx context.Context, p *store.PoolSetBudgetParams) error {
	spec := ""
	if p.Spec != "" {
		var err error
		if spec, err = store.ParseBudget(p.Spec); err != nil {
			return fmt.Errorf("set budget of pool %s: %w", p.PoolID, err)
		}
	}
	if p.RemediationConcurrency < 0 {
		return fmt.Errorf("set budget of pool %s: remediation concurrency %d: want 1 or more", p.PoolID, p.RemediationConcurrency)
	}
	return s.exec1(ctx, "set budget of pool "+p.PoolID, `UPDATE pools SET
		disruption_budget = CASE WHEN $2 = '' THEN disruption_budget ELSE $2 END,
		remediation_concurrency = CASE WHEN $3 = 0 THEN remediation_concurrency ELSE $3 END
		WHERE id = $1`, p.PoolID, spec, p.RemediationConcurrency)
}

// DisruptionAdmit admits a node's disruption against its pool's budget in
// one transaction that locks the pool's row (store.DisruptionStore).
func (s *Store) DisruptionAdmit(ctx context.Context, p *store.DisruptionAdmitParams) (*store.DisruptionAdmission, error) {
	if !store.KnownDisruption(p.Reason) {
		return nil, fmt.Errorf("admit disruption of node %s: unknown reason %q", p.NodeID, p.Reason)
	}
	if p.Owner == "" {
		return nil, fmt.Errorf("admit disruption of node %s: an owner is required", p.NodeID)
	}
	var out *store.DisruptionAdmission
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		var poolID string
		if err := q.db.QueryRow(ctx, `SELECT pool_id FROM nodes WHERE id = $1`, p.NodeID).Scan(&poolID); err != nil {
			return q.wrap("admit disruption of node "+p.NodeID, err)
		}
		// The pool's row first, then the node's: every admission locks in
		// this order, so two never deadlock.
		b, err := q.poolBudget(ctx, poolID, true)
		if err != nil {
			return err
		}
		var held, owner, state string
		err = q.db.QueryRow(ctx, `SELECT disruption, disruption_owner, state FROM nodes WHERE id = $1`+q.d.ForUpdate, p.NodeID).
			Scan(&held, &owner, &state)
		if err != nil {
			return q.wrap("admit disruption of node "+p.NodeID, err)
		}
		out = &store.DisruptionAdmission{}
		refuse := func(why string) error {
			out.Refusal, out.Budget = why, *b
			if why == store.RefusalHeld {
				out.Holder = owner
			}
			return nil
		}
		if held == p.Reason && owner == p.Owner {
			out.Admitted, out.Budget = true, *b
			return nil
		}
		if why, _ := store.Admission(b, held, owner, state, p.Reason, p.Owner); why != "" {
			return refuse(why)
		}
		if err := q.exec1(ctx, "admit disruption of node "+p.NodeID, `UPDATE nodes SET disruption = $2, disruption_owner = $3,
			disruption_since = CASE WHEN disruption = '' THEN coalesce($4, now()) ELSE disruption_since END, updated_at = now()
			WHERE id = $1`, p.NodeID, p.Reason, p.Owner, q.clock(p.Now)); err != nil {
			return err
		}
		after, err := q.poolBudget(ctx, poolID, false)
		if err != nil {
			return err
		}
		out.Admitted, out.Budget = true, *after
		return q.emit(ctx, p.Now, disruptionEvent(p.NodeID, held, p.Reason, p.Owner, after))
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// DisruptionRelease puts node back in service when owner holds it.
func (s *Store) DisruptionRelease(ctx context.Context, nodeID, owner string) error {
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		var poolID, held, holder string
		err := q.db.QueryRow(ctx, `SELECT pool_id, disruption, disruption_owner FROM nodes WHERE id = $1`+q.d.ForUpdate, nodeID).
			Scan(&poolID, &held, &holder)
		if err != nil {
			return q.wrap("release disruption of node "+nodeID, err)
		}
		if held == "" || holder != owner {
			return nil
		}
		if err := q.exec1(ctx, "release disruption of node "+nodeID, `UPDATE nodes SET disruption = '', disruption_owner = '',
			disruption_since = NULL, updated_at = now() WHERE id = $1`, nodeID); err != nil {
			return err
		}
		after, err := q.poolBudget(ctx, poolID, false)
		if err != nil {
			return err
		}
		return q.emit(ctx, nil, disruptionEvent(nodeID, held, "", owner, after))
	})
}

func disruptionEvent(nodeID, previous, now, owner string, b *store.PoolBudget) event {
	return event{events.NodeDisruptionChanged, nodeID, events.DisruptionData{NodeID: nodeID, PoolID: b.PoolID,
		Disruption: now, PreviousDisruption: previous, Owner: owner, OutOfService: b.OutOfService, Budget: b.Budget}}
}
