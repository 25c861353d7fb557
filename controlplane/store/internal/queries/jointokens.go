package queries

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/events"
	"github.com/better-compute/better-compute/controlplane/store"
)

const joinTokenColumns = `id, pool_id, description, max_uses, uses, expires_at, revoked_at, coalesce(node_id, ''), created_at`

func scanJoinToken(r Row) (*store.JoinToken, error) {
	t := &store.JoinToken{}
	return t, r.Scan(&t.ID, &t.PoolID, &t.Description, &t.MaxUses, &t.Uses, &t.ExpiresAt, &t.RevokedAt, &t.NodeID, &t.CreatedAt)
}

// JoinTokenCreate stores a token's hash and limits.
// It writes join-token.created in the same transaction.
func (s *Store) JoinTokenCreate(ctx context.Context, p *store.JoinTokenCreateParams) (*store.JoinToken, error) {
	var t *store.JoinToken
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		var err error
		t, err = scanJoinToken(q.db.QueryRow(ctx, `INSERT INTO join_tokens
			(id, secret_hash, pool_id, description, max_uses, expires_at, node_id, created_at)
			VALUES ($1, $2, $3, $4, $5, $6, nullif($7, ''), now()) RETURNING `+joinTokenColumns,
			p.ID, p.SecretHash, p.PoolID, p.Description, p.MaxUses, p.ExpiresAt, p.NodeID))
		if err != nil {
			return q.wrap("create join token", err)
		}
		return q.emit(ctx, nil, joinTokenEvent(events.JoinTokenCreated, t))
	})
	if err != nil {
		return nil, err
	}
	return t, nil
}

// JoinTokenGet returns a token (never its secret).
func (s *Store) JoinTokenGet(ctx context.Context, id string) (*store.JoinToken, error) {
	t, err := scanJoinToken(s.db.QueryRow(ctx, `SELECT `+joinTokenColumns+` FROM join_tokens WHERE id = $1`, id))
	if err != nil {
		return nil, s.wrap("get join token "+id, err)
	}
	return t, nil
}

// JoinTokenList pages tokens by id.
func (s *Store) JoinTokenList(ctx context.Context, p *store.ListParams) ([]*store.JoinToken, error) {
	rows, err := s.db.Query(ctx, `SELECT `+joinTokenColumns+` FROM join_tokens WHERE id > $1
			AND (CAST($3 AS text) = '' OR pool_id IN (SELECT id FROM pools WHERE `+withinTenant("tenant_id", 3)+`))
		ORDER BY id LIMIT $2`, p.Cursor, limit(p.Limit), p.Within)
	if err != nil {
		return nil, s.wrap("list join tokens", err)
	}
	out, err := collect(rows, scanJoinToken)
	return out, s.wrap("list join tokens", err)
}

// JoinTokenRevoke revokes a token.
// A first revocation writes join-token.revoked in the same transaction.
func (s *Store) JoinTokenRevoke(ctx context.Context, id string) error {
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		t, err := scanJoinToken(q.db.QueryRow(ctx, `UPDATE join_tokens SET revoked_at = now()
			WHERE id = $1 AND revoked_at IS NULL RETURNING `+joinTokenColumns, id))
		switch err := q.wrap("revoke join token "+id, err); {
		case isNotFound(err): // unknown, or revoked already
			var one int
			return q.wrap("revoke join token "+id, q.db.QueryRow(ctx, `SELECT 1 FROM join_tokens WHERE id = $1`, id).Scan(&one))
		case err != nil:
			return err
		}
		return q.emit(ctx, nil, joinTokenEvent(events.JoinTokenRevoked, t))
	})
}

// JoinTokenConsume uses a token once, atomically.
// A use writes join-token.used, and the last one join-token.exhausted, in
// the same transaction.
func (s *Store) JoinTokenConsume(ctx context.Context, id string, secretHash []byte, now *time.Time) (*store.JoinToken, error) {
	var t *store.JoinToken
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		var err error
		t, err = scanJoinToken(q.db.QueryRow(ctx, `UPDATE join_tokens SET uses = uses + 1
			WHERE id = $1 AND secret_hash = $2 AND revoked_at IS NULL AND expires_at > coalesce($3, now()) AND uses < max_uses
			RETURNING `+joinTokenColumns, id, secretHash, now))
		if err != nil {
			return err // translated below
		}
		evs := []event{joinTokenEvent(events.JoinTokenUsed, t)}
		if t.Uses >= t.MaxUses {
			evs = append(evs, joinTokenEvent(events.JoinTokenExhausted, t))
		}
		return q.emit(ctx, now, evs...)
	})
	if err == nil {
		return t, nil
	}
	if !errors.Is(s.d.Translate(err), store.ErrNotFound) {
		return nil, s.wrap("consume join token", err)
	}
	// Refused: say why, reading the row as it is now.
	return nil, s.joinTokenRefusal(ctx, id, secretHash, now, true)
}

// JoinTokensExpire reports the tokens that expired since the last call.
func (s *Store) JoinTokensExpire(ctx context.Context, now *time.Time) ([]string, error) {
	var ids []string
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		rows, err := q.db.Query(ctx, `UPDATE join_tokens SET expiry_reported = true
			WHERE NOT expiry_reported AND revoked_at IS NULL AND expires_at <= coalesce($1, now())
			RETURNING `+joinTokenColumns, q.clock(now))
		if err != nil {
			return q.wrap("expire join tokens", err)
		}
		toks, err := collect(rows, scanJoinToken)
		if err != nil {
			return q.wrap("expire join tokens", err)
		}
		evs := make([]event, 0, len(toks))
		for _, t := range toks {
			ids = append(ids, t.ID)
			evs = append(evs, joinTokenEvent(events.JoinTokenExpired, t))
		}
		return q.emit(ctx, now, evs...)
	})
	return ids, err
}

// JoinTokenCheck checks a token without using it.
func (s *Store) JoinTokenCheck(ctx context.Context, id string, secretHash []byte, now *time.Time) (*store.JoinToken, error) {
	t, err := scanJoinToken(s.db.QueryRow(ctx, `SELECT `+joinTokenColumns+` FROM join_tokens
		WHERE id = $1 AND secret_hash = $2 AND revoked_at IS NULL AND expires_at > coalesce($3, now())`, id, secretHash, now))
	if err == nil {
		return t, nil
	}
	if !errors.Is(s.d.Translate(err), store.ErrNotFound) {
		return nil, s.wrap("check join token", err)
	}
	return nil, s.joinTokenRefusal(ctx, id, secretHash, now, false)
}

// joinTokenRefusal says why a token was refused, reading its row as it is
// now; exhausted counts only when counted is set.
func (s *Store) joinTokenRefusal(ctx context.Context, id string, secretHash []byte, now *time.Time, counted bool) error {
	var hash []byte
	var expired bool
	row := s.db.QueryRow(ctx, `SELECT `+joinTokenColumns+`, secret_hash, expires_at <= coalesce($2, now())
		FROM join_tokens WHERE id = $1`, id, now)
	t := &store.JoinToken{}
	err := row.Scan(&t.ID, &t.PoolID, &t.Description, &t.MaxUses, &t.Uses, &t.ExpiresAt, &t.RevokedAt, &t.NodeID, &t.CreatedAt,
		&hash, &expired)
	switch {
	case errors.Is(s.d.Translate(err), store.ErrNotFound):
		return fmt.Errorf("consume join token: %w", store.ErrTokenInvalid)
	case err != nil:
		return s.wrap("consume join token", err)
	case subtle.ConstantTimeCompare(hash, secretHash) != 1:
		return fmt.Errorf("consume join token: %w", store.ErrTokenInvalid)
	case t.RevokedAt != nil:
		return fmt.Errorf("consume join token: %w", store.ErrTokenRevoked)
	case expired:
		return fmt.Errorf("consume join token: %w", store.ErrTokenExpired)
	case counted:
		return fmt.Errorf("consume join token: %w", store.ErrTokenExhausted)
	default:
		// Changed between the two reads; say what the caller can act on.
		return fmt.Errorf("check join token: %w", store.ErrTokenInvalid)
	}
}
