package queries

import (
	"context"
	"slices"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

const releasePinColumns = `id, action, pin, statement, signature, signed_at, added_by, added_at`

func scanReleasePin(r Row) (*store.ReleasePinStatement, error) {
	st := &store.ReleasePinStatement{}
	err := r.Scan(&st.ID, &st.Action, &st.Pin, &st.Statement, &st.Signature, &st.SignedAt, &st.AddedBy, &st.AddedAt)
	return st, err
}

// ReleasePinStatementAdd stores a signed pin statement.
func (s *Store) ReleasePinStatementAdd(ctx context.Context, p *store.ReleasePinStatement) (*store.ReleasePinStatement, error) {
	id := p.ID
	if id == "" {
		id = store.NewID("rps")
	}
	var at *time.Time
	if !p.AddedAt.IsZero() {
		at = &p.AddedAt
	}
	st, err := scanReleasePin(s.db.QueryRow(ctx, `INSERT INTO release_pin_statements (id, action, pin, statement, signature,
		signed_at, added_by, added_at) VALUES ($1, $2, $3, $4, $5, $6, $7, coalesce($8, now())) RETURNING `+releasePinColumns,
		id, p.Action, p.Pin, p.Statement, p.Signature, p.SignedAt, p.AddedBy, s.clock(at)))
	if err != nil {
		return nil, s.wrap("store release pin statement ("+p.Action+" "+p.Pin+")", err)
	}
	return st, nil
}

// ReleasePinStatements lists every statement, oldest first.
func (s *Store) ReleasePinStatements(ctx context.Context) ([]*store.ReleasePinStatement, error) {
	op := "list release pin statements"
	rows, err := s.db.Query(ctx, `SELECT `+releasePinColumns+` FROM release_pin_statements ORDER BY added_at, id`)
	if err != nil {
		return nil, s.wrap(op, err)
	}
	defer rows.Close()
	var out []*store.ReleasePinStatement
	for rows.Next() {
		st, err := scanReleasePin(rows)
		if err != nil {
			return nil, s.wrap(op, err)
		}
		out = append(out, st)
	}
	return out, s.wrap(op, rows.Err())
}

// NodeReleasePinsSet replaces a node's reported pins in one transaction.
func (s *Store) NodeReleasePinsSet(ctx context.Context, nodeID string, pins []string, now *time.Time) error {
	now = s.clock(now)
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		op := "record release pins of node " + nodeID
		if _, err := q.db.Exec(ctx, `DELETE FROM node_release_pins WHERE node_id = $1`, nodeID); err != nil {
			return q.wrap(op, err)
		}
		if len(pins) == 0 {
			return nil
		}
		for _, pin := range slices.Compact(slices.Sorted(slices.Values(pins))) {
			if _, err := q.db.Exec(ctx, `INSERT INTO node_release_pins (node_id, pin, reported_at)
				SELECT id, $2, coalesce($3, now()) FROM nodes WHERE id = $1`, nodeID, pin, now); err != nil {
				return q.wrap(op, err)
			}
		}
		return nil
	})
}

// ReleasePinCounts counts live nodes (with a session) holding any of pins.
func (s *Store) ReleasePinCounts(ctx context.Context, pins []string, missingLimit int) (*store.ReleasePinCounts, error) {
	out := &store.ReleasePinCounts{}
	op := "count nodes holding release pins"
	in, set := s.textSet("$1", pins)
	held := `EXISTS (SELECT 1 FROM node_release_pins p WHERE p.node_id = s.node_id AND p.pin IN (` + in + `))`
	if err := s.db.QueryRow(ctx, `SELECT count(*), coalesce(sum(CASE WHEN `+held+` THEN 1 ELSE 0 END), 0) FROM sessions s`,
		set).Scan(&out.Live, &out.Holding); err != nil {
		return nil, s.wrap(op, err)
	}
	if missingLimit <= 0 || out.Live == out.Holding {
		return out, nil
	}
	rows, err := s.db.Query(ctx, `SELECT s.node_id FROM sessions s WHERE NOT `+held+` ORDER BY s.node_id LIMIT $2`, set, missingLimit)
	if err != nil {
		return nil, s.wrap(op, err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, s.wrap(op, err)
		}
		out.Missing = append(out.Missing, id)
	}
	return out, s.wrap(op, rows.Err())
}
