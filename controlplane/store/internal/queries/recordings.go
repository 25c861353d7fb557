package queries

import (
	"context"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

const recordingColumns = `id, tunnel_id, node_id, created_by, as_root, started_at, ended_at, bytes, chunks, state, reason`

func scanRecording(r Row) (*store.Recording, error) {
	rec := &store.Recording{}
	return rec, r.Scan(&rec.ID, &rec.TunnelID, &rec.NodeID, &rec.CreatedBy, &rec.AsRoot, &rec.StartedAt, &rec.EndedAt,
		&rec.Bytes, &rec.Chunks, &rec.State, &rec.Reason)
}

// RecordingCreate inserts a recording in state recording.
func (s *Store) RecordingCreate(ctx context.Context, p *store.RecordingCreateParams) (*store.Recording, error) {
	now := time.Now()
	if p.Now != nil {
		now = *p.Now
	}
	rec, err := scanRecording(s.db.QueryRow(ctx, `INSERT INTO recordings (id, tunnel_id, node_id, created_by, as_root, started_at, state)
		VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING `+recordingColumns,
		p.ID, p.TunnelID, p.NodeID, p.CreatedBy, p.AsRoot, now, store.RecordingRecording))
	if err != nil {
		return nil, s.wrap("create recording", err)
	}
	return rec, nil
}

// RecordingChunkAdd stores a chunk and counts it, in one transaction.
func (s *Store) RecordingChunkAdd(ctx context.Context, p *store.RecordingChunkAddParams) error {
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		n, err := q.db.Exec(ctx, `UPDATE recordings SET bytes = bytes + $2, chunks = chunks + 1 WHERE id = $1`, p.RecordingID, p.Bytes)
		if err != nil {
			return q.wrap("count recording chunk", err)
		}
		if n == 0 {
			return fmt.Errorf("add chunk to recording %s: %w", p.RecordingID, store.ErrNotFound)
		}
		_, err = q.db.Exec(ctx, `INSERT INTO recording_chunks (recording_id, seq, sealed) VALUES ($1, $2, $3)`, p.RecordingID, p.Seq, p.Sealed)
		return q.wrap(fmt.Sprintf("add chunk %d to recording %s", p.Seq, p.RecordingID), err)
	})
}

// RecordingEnd records the end once; a failure overrides only a
// recording still in progress.
func (s *Store) RecordingEnd(ctx context.Context, p *store.RecordingEndParams) error {
	_, err := s.db.Exec(ctx, `UPDATE recordings SET ended_at = coalesce($2, now()), state = $3, reason = $4
		WHERE id = $1 AND state = $5`, p.ID, s.clock(p.Now), p.State, p.Reason, store.RecordingRecording)
	return s.wrap("end recording "+p.ID, err)
}

// RecordingGet returns a recording.
func (s *Store) RecordingGet(ctx context.Context, id string) (*store.Recording, error) {
	rec, err := scanRecording(s.db.QueryRow(ctx, `SELECT `+recordingColumns+` FROM recordings WHERE id = $1`, id))
	if err != nil {
		return nil, s.wrap("get recording "+id, err)
	}
	return rec, nil
}

// RecordingList returns recordings newest first, after the cursor's row.
func (s *Store) RecordingList(ctx context.Context, p *store.RecordingListParams) ([]*store.Recording, error) {
	rows, err := s.db.Query(ctx, `SELECT `+recordingColumns+` FROM recordings r
		WHERE ($1 = '' OR node_id = $1)
		  AND ($2 = '' OR (r.started_at, r.id) < (SELECT c.started_at, c.id FROM recordings c WHERE c.id = $2))
		ORDER BY started_at DESC, id DESC LIMIT $3`, p.NodeID, p.Cursor, limit(p.Limit))
	if err != nil {
		return nil, s.wrap("list recordings", err)
	}
	out, err := collect(rows, scanRecording)
	return out, s.wrap("list recordings", err)
}

// RecordingChunks returns chunks after p.After, in order, bounded by count
// and (past the first) by bytes.
func (s *Store) RecordingChunks(ctx context.Context, p *store.RecordingChunksParams) ([]*store.RecordingChunk, error) {
	rows, err := s.db.Query(ctx, `SELECT recording_id, seq, sealed FROM recording_chunks
		WHERE recording_id = $1 AND seq > $2 ORDER BY seq LIMIT $3`, p.RecordingID, p.After, limit(p.Limit))
	if err != nil {
		return nil, s.wrap("read recording chunks", err)
	}
	chunks, err := collect(rows, func(r Row) (*store.RecordingChunk, error) {
		c := &store.RecordingChunk{}
		return c, r.Scan(&c.RecordingID, &c.Seq, &c.Sealed)
	})
	if err != nil {
		return nil, s.wrap("read recording chunks", err)
	}
	total := 0
	for i, c := range chunks {
		total += len(c.Sealed)
		if i > 0 && p.MaxBytes > 0 && total > p.MaxBytes {
			return chunks[:i], nil
		}
	}
	return chunks, nil
}

// RecordingPrune deletes recordings started before before that have ended,
// and their chunks. One never ended (its shell is still open, or its
// process was killed mid-shell) goes a day later than that
// (store.RecordingUnendedGrace), so a live shell keeps its recording.
func (s *Store) RecordingPrune(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		if _, err := q.db.Exec(ctx, `DELETE FROM recording_chunks WHERE recording_id IN
			(SELECT id FROM recordings WHERE started_at < $1 AND (ended_at IS NOT NULL OR started_at < $2))`, before, before.Add(-store.RecordingUnendedGrace)); err != nil {
			return q.wrap("prune recording chunks", err)
		}
		var err error
		n, err = q.db.Exec(ctx, `DELETE FROM recordings WHERE started_at < $1 AND (ended_at IS NOT NULL OR started_at < $2)`, before, before.Add(-store.RecordingUnendedGrace))
		return q.wrap("prune recordings", err)
	})
	return n, err
}
