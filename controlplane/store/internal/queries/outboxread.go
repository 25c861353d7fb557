package queries

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// OutboxQuery returns the entries p selects, newest first (oldest first
// with p.Ascending).
func (s *Store) OutboxQuery(ctx context.Context, p *store.OutboxQueryParams) ([]*store.OutboxEntry, error) {
	var where []string
	var args []any
	cond := func(sql string, v any) {
		args = append(args, v)
		where = append(where, fmt.Sprintf(sql, len(args)))
	}
	if p.BeforeID > 0 {
		cond("id < $%d", p.BeforeID)
	}
	if p.AfterID > 0 {
		cond("id > $%d", p.AfterID)
	}
	if !p.Since.IsZero() {
		cond("created_at >= $%d", p.Since.UTC())
	}
	if !p.Until.IsZero() {
		cond("created_at < $%d", p.Until.UTC())
	}
	if p.Key != "" {
		cond("key = $%d", p.Key)
	}
	if p.TopicPrefix != "" {
		args = append(args, p.TopicPrefix)
		n := len(args)
		where = append(where, fmt.Sprintf("substr(topic, 1, length(CAST($%d AS TEXT))) = CAST($%d AS TEXT)", n, n))
	}
	q := `SELECT id, topic, key, payload, created_at FROM outbox`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	order := "DESC"
	if p.Ascending {
		order = "ASC"
	}
	args = append(args, limit(p.Limit))
	q += fmt.Sprintf(" ORDER BY id %s LIMIT $%d", order, len(args))
	rows, err := s.db.Query(ctx, q, args...)
	if err != nil {
		return nil, s.wrap("query outbox", err)
	}
	out, err := collect(rows, func(r Row) (*store.OutboxEntry, error) {
		e := &store.OutboxEntry{}
		return e, r.Scan(&e.ID, &e.Topic, &e.Key, &e.Payload, &e.CreatedAt)
	})
	return out, s.wrap("query outbox", err)
}

// OutboxPrune deletes the prefix of the outbox up to the newest entry
// created before before, and raises the recorded pruned-through id to it,
// in one transaction.
func (s *Store) OutboxPrune(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		var through int64
		err := q.db.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM outbox WHERE created_at < $1`, before.UTC()).Scan(&through)
		if err != nil {
			return q.wrap("find outbox entries to prune", err)
		}
		if through == 0 {
			return nil
		}
		if n, err = q.db.Exec(ctx, `DELETE FROM outbox WHERE id <= $1`, through); err != nil {
			return q.wrap("prune outbox", err)
		}
		_, err = q.db.Exec(ctx, `INSERT INTO outbox_pruned (id, through_id) VALUES (1, $1)
			ON CONFLICT (id) DO UPDATE SET through_id = CASE WHEN excluded.through_id > outbox_pruned.through_id
				THEN excluded.through_id ELSE outbox_pruned.through_id END`, through)
		return q.wrap("record outbox prune", err)
	})
	return n, err
}

// OutboxPrunedThrough returns the highest id retention deleted, 0 when
// none.
func (s *Store) OutboxPrunedThrough(ctx context.Context) (int64, error) {
	var id int64
	err := s.db.QueryRow(ctx, `SELECT through_id FROM outbox_pruned WHERE id = 1`).Scan(&id)
	if err != nil && isNotFound(s.d.Translate(err)) {
		return 0, nil
	}
	return id, s.wrap("read outbox pruned-through id", err)
}
