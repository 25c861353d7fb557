package queries

import (
	"context"
	"strings"

	"github.com/better-compute/better-compute/controlplane/store"
)

const deadLetterColumns = `id, sink, outbox_id, topic, key, payload, created_at, attempts, last_error, replay, failed_at, tenant_id`

func scanDeadLetter(r Row) (*store.DeadLetter, error) {
	d := &store.DeadLetter{}
	return d, r.Scan(&d.ID, &d.Sink, &d.Entry.ID, &d.Entry.Topic, &d.Entry.Key, &d.Entry.Payload, &d.Entry.CreatedAt,
		&d.Attempts, &d.LastError, &d.Replay, &d.FailedAt, &d.TenantID)
}

// DeadLetterInsert moves a sink's entry to the dead-letter table.
func (s *Store) DeadLetterInsert(ctx context.Context, d *store.DeadLetter) error {
	_, err := s.db.Exec(ctx, `INSERT INTO sink_dead_letters
		(sink, outbox_id, topic, key, payload, created_at, attempts, last_error, replay, failed_at, tenant_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, false, now(), $9)
		ON CONFLICT (sink, outbox_id) DO NOTHING`,
		d.Sink, d.Entry.ID, d.Entry.Topic, d.Entry.Key, JSON(d.Entry.Payload), d.Entry.CreatedAt.UTC(), d.Attempts, d.LastError, d.TenantID)
	return s.wrap("dead-letter outbox entry", err)
}

// DeadLetterList pages dead letters by id.
func (s *Store) DeadLetterList(ctx context.Context, p *store.DeadLetterListParams) ([]*store.DeadLetter, error) {
	rows, err := s.db.Query(ctx, `SELECT `+deadLetterColumns+` FROM sink_dead_letters
		WHERE id > $1 AND ($2 = '' OR sink = $2) AND (NOT $3 OR replay) ORDER BY id LIMIT $4`,
		p.AfterID, p.Sink, p.Replay, limit(p.Limit))
	if err != nil {
		return nil, s.wrap("list dead letters", err)
	}
	out, err := collect(rows, scanDeadLetter)
	return out, s.wrap("list dead letters", err)
}

// DeadLetterReplay marks dead letters for redelivery.
func (s *Store) DeadLetterReplay(ctx context.Context, sink string, ids []int64) (int64, error) {
	if len(ids) == 0 {
		n, err := s.db.Exec(ctx, `UPDATE sink_dead_letters SET replay = true, attempts = 0 WHERE $1 = '' OR sink = $1`, sink)
		return n, s.wrap("replay dead letters", err)
	}
	in, set := s.int64Set("$2", ids)
	n, err := s.db.Exec(ctx, `UPDATE sink_dead_letters SET replay = true, attempts = 0
		WHERE ($1 = '' OR sink = $1) AND id IN (`+in+`)`, sink, set)
	return n, s.wrap("replay dead letters", err)
}

// DeadLetterDelete removes delivered dead letters.
func (s *Store) DeadLetterDelete(ctx context.Context, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	in, set := s.int64Set("$1", ids)
	_, err := s.db.Exec(ctx, `DELETE FROM sink_dead_letters WHERE id IN (`+in+`)`, set)
	return s.wrap("delete dead letters", err)
}

// DeadLetterFailed counts a failed replay.
func (s *Store) DeadLetterFailed(ctx context.Context, id int64, lastError string, maxAttempts int) error {
	return s.exec1(ctx, "record failed replay", `UPDATE sink_dead_letters SET attempts = attempts + 1, last_error = $2,
		replay = (attempts + 1 < $3), failed_at = now() WHERE id = $1`, id, lastError, maxAttempts)
}

// DeadLetterCounts counts dead letters per sink.
func (s *Store) DeadLetterCounts(ctx context.Context) (map[string]int64, error) {
	rows, err := s.db.Query(ctx, `SELECT sink, count(*) FROM sink_dead_letters GROUP BY sink`)
	if err != nil {
		return nil, s.wrap("count dead letters", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var sink string
		var n int64
		if err := rows.Scan(&sink, &n); err != nil {
			return nil, s.wrap("count dead letters", err)
		}
		out[sink] = n
	}
	return out, s.wrap("count dead letters", rows.Err())
}

// int64Set is textSet for 64-bit integers.
func (s *Store) int64Set(placeholder string, values []int64) (string, any) {
	ints := make([]int, len(values))
	for i, v := range values {
		ints[i] = int(v)
	}
	in, set := s.intSet(placeholder, ints)
	return strings.Replace(in, "::int", "::bigint", 1), set
}
