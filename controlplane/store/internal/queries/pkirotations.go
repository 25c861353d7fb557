package queries

import (
	"context"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
)

const pkiRotationColumns = `id, ca, phase, old_ca_id, new_ca_id, threshold, started_by, started_at, activated_at,
	retired_at, rolled_back_at, updated_at`

func scanPKIRotation(r Row) (*store.PKIRotation, error) {
	ro := &store.PKIRotation{}
	err := r.Scan(&ro.ID, &ro.CA, &ro.Phase, &ro.OldCAID, &ro.NewCAID, &ro.Threshold, &ro.StartedBy, &ro.StartedAt,
		&ro.ActivatedAt, &ro.RetiredAt, &ro.RolledBackAt, &ro.UpdatedAt)
	return ro, err
}

// pkiRotationPhaseEvents maps a phase to the event a move into it writes.
var pkiRotationPhaseEvents = map[string]string{
	store.RotationPropagating: events.PKIRotationStarted,
	store.RotationActivated:   events.PKIRotationActivated,
	store.RotationRetired:     events.PKIRotationRetired,
	store.RotationRolledBack:  events.PKIRotationRolledBack,
}

// pkiRotationPhaseColumns names the column each phase stamps.
var pkiRotationPhaseColumns = map[string]string{
	store.RotationActivated:  "activated_at",
	store.RotationRetired:    "retired_at",
	store.RotationRolledBack: "rolled_back_at",
}

func pkiRotationEvent(ro *store.PKIRotation, previous, actor, reason string, forced bool) event {
	return event{pkiRotationPhaseEvents[ro.Phase], ro.ID, events.PKIRotationData{RotationID: ro.ID, CA: ro.CA, Phase: ro.Phase,
		PreviousPhase: previous, OldCAID: ro.OldCAID, NewCAID: ro.NewCAID, Actor: actor, Forced: forced, Reason: reason}}
}

// PKIRotationCreate starts a rotation, propagating.
func (s *Store) PKIRotationCreate(ctx context.Context, p *store.PKIRotationCreateParams) (*store.PKIRotation, error) {
	id := p.ID
	if id == "" {
		id = store.NewID("rot")
	}
	now := s.clock(p.Now)
	var out *store.PKIRotation
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		ro, err := scanPKIRotation(q.db.QueryRow(ctx, `INSERT INTO pki_rotations (id, ca, phase, old_ca_id, new_ca_id, threshold,
			started_by, started_at, updated_at) VALUES ($1, $2, 'propagating', $3, $4, $5, $6, coalesce($7, now()), coalesce($7, now()))
			RETURNING `+pkiRotationColumns, id, p.CA, p.OldCAID, p.NewCAID, p.Threshold, p.StartedBy, now))
		if err != nil {
			return q.wrap("start "+p.CA+" CA rotation", err)
		}
		out = ro
		return q.emit(ctx, now, pkiRotationEvent(ro, "", p.StartedBy, "", false))
	})
	return out, err
}

// PKIRotationLatest returns the CA's latest rotation.
func (s *Store) PKIRotationLatest(ctx context.Context, ca string) (*store.PKIRotation, error) {
	ro, err := scanPKIRotation(s.db.QueryRow(ctx, `SELECT `+pkiRotationColumns+` FROM pki_rotations
		WHERE ca = $1 ORDER BY started_at DESC, id DESC LIMIT 1`, ca))
	if err != nil {
		return nil, s.wrap("get latest "+ca+" CA rotation", err)
	}
	return ro, nil
}

// PKIRotationSetPhase moves a rotation from one phase to another.
func (s *Store) PKIRotationSetPhase(ctx context.Context, p *store.PKIRotationSetPhaseParams) (*store.PKIRotation, error) {
	col, ok := pkiRotationPhaseColumns[p.To]
	if !ok {
		return nil, fmt.Errorf("move CA rotation %s: unknown phase %q", p.ID, p.To)
	}
	now := s.clock(p.Now)
	op := fmt.Sprintf("move CA rotation %s from %s to %s", p.ID, p.From, p.To)
	var out *store.PKIRotation
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		ro, err := scanPKIRotation(q.db.QueryRow(ctx, `UPDATE pki_rotations SET phase = $1, `+col+` = coalesce($2, now()),
			updated_at = coalesce($2, now()) WHERE id = $3 AND phase = $4 RETURNING `+pkiRotationColumns, p.To, now, p.ID, p.From))
		if err == nil {
			out = ro
			return q.emit(ctx, now, pkiRotationEvent(ro, p.From, p.Actor, p.Reason, p.Forced))
		}
		if err = q.wrap(op, err); !isNotFound(err) {
			return err
		}
		cur, gerr := scanPKIRotation(q.db.QueryRow(ctx, `SELECT `+pkiRotationColumns+` FROM pki_rotations WHERE id = $1`, p.ID))
		if gerr != nil {
			return q.wrap(op, gerr)
		}
		return fmt.Errorf("%s: it is %s: %w", op, cur.Phase, store.ErrConflict)
	})
	return out, err
}

// PKIRotationAck records nodes' acknowledgements in one statement; nodes
// deleted since are skipped.
func (s *Store) PKIRotationAck(ctx context.Context, rotationID string, nodeIDs []string, now *time.Time) error {
	if len(nodeIDs) == 0 {
		return nil
	}
	in, ids := s.textSet("$3", nodeIDs)
	_, err := s.db.Exec(ctx, `INSERT INTO pki_rotation_acks (rotation_id, node_id, acked_at)
		SELECT $1, id, coalesce($2, now()) FROM nodes WHERE id IN (`+in+`)
		ON CONFLICT (rotation_id, node_id) DO NOTHING`, rotationID, s.clock(now), ids)
	return s.wrap("record acks of CA rotation "+rotationID, err)
}

// PKIRotationAckCounts counts live nodes (with a session) and their acks.
func (s *Store) PKIRotationAckCounts(ctx context.Context, rotationID string, missingLimit int) (*store.PKIRotationAckCounts, error) {
	out := &store.PKIRotationAckCounts{}
	op := "count acks of CA rotation " + rotationID
	if err := s.db.QueryRow(ctx, `SELECT count(*), count(a.node_id) FROM sessions s
		LEFT JOIN pki_rotation_acks a ON a.rotation_id = $1 AND a.node_id = s.node_id`, rotationID).Scan(&out.Live, &out.Acked); err != nil {
		return nil, s.wrap(op, err)
	}
	if missingLimit <= 0 || out.Live == out.Acked {
		return out, nil
	}
	rows, err := s.db.Query(ctx, `SELECT s.node_id FROM sessions s
		LEFT JOIN pki_rotation_acks a ON a.rotation_id = $1 AND a.node_id = s.node_id
		WHERE a.node_id IS NULL ORDER BY s.node_id LIMIT $2`, rotationID, missingLimit)
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

// NodeCertsOffCA counts nodes with a valid certificate from another CA.
func (s *Store) NodeCertsOffCA(ctx context.Context, caID string, now *time.Time, limit int) (int, []string, error) {
	op := "count node certificates off CA " + caID
	now = s.clock(now)
	var n int
	if err := s.db.QueryRow(ctx, `SELECT count(*) FROM nodes WHERE cert_ca_id <> $1 AND cert_not_after > coalesce($2, now())`,
		caID, now).Scan(&n); err != nil {
		return 0, nil, s.wrap(op, err)
	}
	if n == 0 || limit <= 0 {
		return n, nil, nil
	}
	rows, err := s.db.Query(ctx, `SELECT id FROM nodes WHERE cert_ca_id <> $1 AND cert_not_after > coalesce($2, now())
		ORDER BY id LIMIT $3`, caID, now, limit)
	if err != nil {
		return 0, nil, s.wrap(op, err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return 0, nil, s.wrap(op, err)
		}
		ids = append(ids, id)
	}
	return n, ids, s.wrap(op, rows.Err())
}
