package queries

import (
	"context"
	"errors"

	"github.com/better-compute/better-compute/controlplane/store"
)

const leaseColumns = `name, holder, epoch, acquired_at, renewed_at, expires_at`

func scanLease(r Row) (*store.Lease, error) {
	l := &store.Lease{}
	err := r.Scan(&l.Name, &l.Holder, &l.Epoch, &l.AcquiredAt, &l.RenewedAt, &l.ExpiresAt)
	return l, err
}

// LeaseAcquire takes or renews a lease; a takeover raises the epoch. The
// holder keeps its epoch when it re-acquires a lease it still holds.
func (s *Store) LeaseAcquire(ctx context.Context, p *store.LeaseAcquireParams) (*store.Lease, bool, error) {
	l, err := scanLease(s.db.QueryRow(ctx, `
		INSERT INTO leases AS l (name, holder, epoch, acquired_at, renewed_at, expires_at)
		VALUES ($1, $2, 1, coalesce($4, now()), coalesce($4, now()), coalesce($4, now()) + bc_micros($3))
		ON CONFLICT (name) DO UPDATE SET
			epoch = CASE WHEN l.holder = excluded.holder AND l.expires_at > excluded.renewed_at
				THEN l.epoch ELSE l.epoch + 1 END,
			acquired_at = CASE WHEN l.holder = excluded.holder AND l.expires_at > excluded.renewed_at
				THEN l.acquired_at ELSE excluded.acquired_at END,
			holder = excluded.holder,
			renewed_at = excluded.renewed_at,
			expires_at = excluded.expires_at
		WHERE l.holder = excluded.holder OR l.holder = '' OR l.expires_at <= excluded.renewed_at
		RETURNING `+leaseColumns,
		p.Name, p.Holder, p.TTL.Microseconds(), s.clock(p.Now)))
	if err != nil {
		if errors.Is(s.d.Translate(err), store.ErrNotFound) {
			return nil, false, nil
		}
		return nil, false, s.wrap("acquire lease "+p.Name, err)
	}
	return l, true, nil
}

// LeaseRenew extends a lease still held at its epoch.
func (s *Store) LeaseRenew(ctx context.Context, p *store.LeaseRenewParams) (*store.Lease, bool, error) {
	l, err := scanLease(s.db.QueryRow(ctx, `
		UPDATE leases SET renewed_at = coalesce($5, now()), expires_at = coalesce($5, now()) + bc_micros($4)
		WHERE name = $1 AND holder = $2 AND epoch = $3 AND expires_at > coalesce($5, now())
		RETURNING `+leaseColumns,
		p.Name, p.Holder, p.Epoch, p.TTL.Microseconds(), s.clock(p.Now)))
	if err != nil {
		if errors.Is(s.d.Translate(err), store.ErrNotFound) {
			return nil, false, nil
		}
		return nil, false, s.wrap("renew lease "+p.Name, err)
	}
	return l, true, nil
}

// LeaseRelease frees a lease at once. The row stays so the next holder's
// epoch still rises.
func (s *Store) LeaseRelease(ctx context.Context, name, holder string, epoch int64) error {
	_, err := s.db.Exec(ctx, `UPDATE leases SET holder = '' WHERE name = $1 AND holder = $2 AND epoch = $3`,
		name, holder, epoch)
	return s.wrap("release lease "+name, err)
}

// LeaseGet returns a lease row.
func (s *Store) LeaseGet(ctx context.Context, name string) (*store.Lease, error) {
	l, err := scanLease(s.db.QueryRow(ctx, `SELECT `+leaseColumns+` FROM leases WHERE name = $1`, name))
	if err != nil {
		return nil, s.wrap("get lease "+name, err)
	}
	return l, nil
}

// LeaseList returns leases by name prefix.
func (s *Store) LeaseList(ctx context.Context, prefix string) ([]*store.Lease, error) {
	rows, err := s.db.Query(ctx, `SELECT `+leaseColumns+` FROM leases
		WHERE substr(name, 1, $2) = $1 ORDER BY name`, prefix, len(prefix))
	if err != nil {
		return nil, s.wrap("list leases", err)
	}
	out, err := collect(rows, scanLease)
	return out, s.wrap("list leases", err)
}
