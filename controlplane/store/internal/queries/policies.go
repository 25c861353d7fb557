package queries

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/better-compute/better-compute/controlplane/store"
)

const policyColumns = `tenant_id, document, names, version, updated_by, updated_at`

func scanPolicyDocument(r Row) (*store.PolicyDocument, error) {
	d := &store.PolicyDocument{}
	var names string
	if err := r.Scan(&d.TenantID, &d.Document, &names, &d.Version, &d.UpdatedBy, &d.UpdatedAt); err != nil {
		return nil, err
	}
	if names != "" {
		d.Names = strings.Split(names, "\n")
	}
	return d, nil
}

// PolicyDocumentGet returns a tenant's policy document.
func (s *Store) PolicyDocumentGet(ctx context.Context, tenantID string) (*store.PolicyDocument, error) {
	d, err := scanPolicyDocument(s.db.QueryRow(ctx, `SELECT `+policyColumns+` FROM policy_documents WHERE tenant_id = $1`, tenantID))
	if err != nil {
		return nil, s.wrap("get policy document of tenant "+tenantID, err)
	}
	return d, nil
}

// PolicyDocumentPut replaces a tenant's document in one transaction: the
// stored version is read (and its row locked on PostgreSQL) first, so two
// applies that expected one version cannot both land; two first applies
// race on the primary key, and the loser is ErrConflict.
func (s *Store) PolicyDocumentPut(ctx context.Context, d *store.PolicyDocument, expectedVersion int64) (*store.PolicyDocument, error) {
	op := "put policy document of tenant " + d.TenantID
	var out *store.PolicyDocument
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		var cur int64
		err := q.db.QueryRow(ctx, `SELECT version FROM policy_documents WHERE tenant_id = $1`+q.d.ForUpdate, d.TenantID).Scan(&cur)
		if err := q.wrap(op, err); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if expectedVersion != store.AnyPolicyVersion && cur != expectedVersion {
			return fmt.Errorf("%s: %w: it is at version %d, not %d", op, store.ErrConflict, cur, expectedVersion)
		}
		out, err = scanPolicyDocument(q.db.QueryRow(ctx, `INSERT INTO policy_documents (`+policyColumns+`)
			VALUES ($1, $2, $3, $4, $5, now())
			ON CONFLICT (tenant_id) DO UPDATE SET document = excluded.document, names = excluded.names,
				version = excluded.version, updated_by = excluded.updated_by, updated_at = excluded.updated_at
			RETURNING `+policyColumns,
			d.TenantID, d.Document, strings.Join(d.Names, "\n"), cur+1, d.UpdatedBy))
		return q.wrap(op, err)
	})
	return out, err
}

// PolicyDocumentList pages the documents of live tenants within p.Within.
func (s *Store) PolicyDocumentList(ctx context.Context, p *store.ListParams) ([]*store.PolicyDocument, error) {
	rows, err := s.db.Query(ctx, `SELECT `+policyColumns+` FROM policy_documents
		WHERE tenant_id > $1 AND tenant_id IN (SELECT id FROM tenants WHERE deleted_at IS NULL)
		AND `+withinTenant("tenant_id", 3)+` ORDER BY tenant_id LIMIT $2`, p.Cursor, limit(p.Limit), p.Within)
	if err != nil {
		return nil, s.wrap("list policy documents", err)
	}
	out, err := collect(rows, scanPolicyDocument)
	return out, s.wrap("list policy documents", err)
}

// PolicyStamp is the sum of every document's version.
func (s *Store) PolicyStamp(ctx context.Context) (int64, error) {
	var n int64
	err := s.db.QueryRow(ctx, `SELECT CAST(coalesce(sum(version), 0) AS bigint) FROM policy_documents`).Scan(&n)
	return n, s.wrap("read policy stamp", err)
}
