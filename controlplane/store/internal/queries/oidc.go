package queries

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/store"
)

// OIDCLoginPut stores a login in progress.
func (s *Store) OIDCLoginPut(ctx context.Context, idHash []byte, l *store.OIDCLogin) error {
	_, err := s.db.Exec(ctx, `INSERT INTO oidc_logins (id_hash, kind, tenant, device_code, verifier, nonce, interval_s, created_at, expires_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		idHash, l.Kind, l.Tenant, l.DeviceCode, l.Verifier, l.Nonce, l.Interval, l.CreatedAt, l.ExpiresAt)
	return s.wrap("put sign-in", err)
}

// OIDCLoginGet returns a login in progress.
func (s *Store) OIDCLoginGet(ctx context.Context, idHash []byte) (*store.OIDCLogin, error) {
	l := &store.OIDCLogin{}
	err := s.db.QueryRow(ctx, `SELECT kind, tenant, device_code, verifier, nonce, interval_s, created_at, expires_at
		FROM oidc_logins WHERE id_hash = $1`, idHash).
		Scan(&l.Kind, &l.Tenant, &l.DeviceCode, &l.Verifier, &l.Nonce, &l.Interval, &l.CreatedAt, &l.ExpiresAt)
	if err != nil {
		return nil, s.wrap("get sign-in", err)
	}
	return l, nil
}

// OIDCLoginDelete removes a login.
func (s *Store) OIDCLoginDelete(ctx context.Context, idHash []byte) error {
	return s.exec1(ctx, "finish sign-in", `DELETE FROM oidc_logins WHERE id_hash = $1`, idHash)
}

// OIDCLoginsPrune deletes expired logins and sessions that ended before before.
func (s *Store) OIDCLoginsPrune(ctx context.Context, before time.Time) (int64, error) {
	var total int64
	err := s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		for _, sql := range []string{
			`DELETE FROM oidc_logins WHERE expires_at < $1`,
			`DELETE FROM oidc_sessions WHERE ended_at < $1 OR expires_at < $1`,
		} {
			n, err := q.db.Exec(ctx, sql, before)
			if err != nil {
				return q.wrap("prune sign-ins", err)
			}
			total += n
		}
		return nil
	})
	return total, err
}

const oidcSessionColumns = `id, subject, display_name, tenant_id, role, groups, client, provider_refresh,
	created_at, refreshed_at, expires_at, ended_at, end_reason`

func scanOIDCSession(r Row) (*store.OIDCSession, error) {
	x := &store.OIDCSession{}
	var groups string
	if err := r.Scan(&x.ID, &x.Subject, &x.DisplayName, &x.TenantID, &x.Role, &groups, &x.Client, &x.ProviderRefresh,
		&x.CreatedAt, &x.RefreshedAt, &x.ExpiresAt, &x.EndedAt, &x.EndReason); err != nil {
		return nil, err
	}
	x.Groups = splitLines(groups)
	return x, nil
}

// insertSessionToken adds a bearer token of a session (no token.created
// event: sessions have their own).
func (s *Store) insertSessionToken(ctx context.Context, x *store.OIDCSession, t *store.APIToken, secretHash []byte) error {
	t.SessionID, t.Subject, t.DisplayName, t.Groups = x.ID, x.Subject, x.DisplayName, x.Groups
	_, err := s.db.Exec(ctx, `INSERT INTO api_tokens (id, secret_hash, role, tenant_id, description, allow_cidrs, expires_at, created_at,
			session_id, subject, display_name, groups)
		VALUES ($1, $2, $3, $4, $5, $6, $7, now(), $8, $9, $10, $11)`,
		t.ID, secretHash, t.Role, t.TenantID, t.Description, JSON([]byte("[]")), t.ExpiresAt,
		x.ID, x.Subject, x.DisplayName, strings.Join(x.Groups, "\n"))
	return s.wrap("add a token to session "+x.ID, err)
}

// OIDCSessionStart stores a session and its first token.
func (s *Store) OIDCSessionStart(ctx context.Context, x *store.OIDCSession, refreshHash []byte, t *store.APIToken, secretHash []byte) error {
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		_, err := q.db.Exec(ctx, `INSERT INTO oidc_sessions (id, subject, display_name, tenant_id, role, groups, client, refresh_hash,
				provider_refresh, created_at, refreshed_at, expires_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10, $11)`,
			x.ID, x.Subject, x.DisplayName, x.TenantID, x.Role, strings.Join(x.Groups, "\n"), x.Client, refreshHash,
			x.ProviderRefresh, x.CreatedAt, x.ExpiresAt)
		if err != nil {
			return q.wrap("start session", err)
		}
		return q.insertSessionToken(ctx, x, t, secretHash)
	})
}

// OIDCSessionGet returns a session by id.
func (s *Store) OIDCSessionGet(ctx context.Context, id string) (*store.OIDCSession, error) {
	x, err := scanOIDCSession(s.db.QueryRow(ctx, `SELECT `+oidcSessionColumns+` FROM oidc_sessions WHERE id = $1`, id))
	if err != nil {
		return nil, s.wrap("get session "+id, err)
	}
	return x, nil
}

// OIDCSessionByRefresh returns the session of a refresh secret.
func (s *Store) OIDCSessionByRefresh(ctx context.Context, refreshHash []byte) (*store.OIDCSession, error) {
	x, err := scanOIDCSession(s.db.QueryRow(ctx, `SELECT `+oidcSessionColumns+` FROM oidc_sessions WHERE refresh_hash = $1`, refreshHash))
	if err != nil {
		return nil, s.wrap("get session by refresh secret", err)
	}
	return x, nil
}

// OIDCSessionRefresh moves a session to its next refresh secret and token.
func (s *Store) OIDCSessionRefresh(ctx context.Context, x *store.OIDCSession, oldRefreshHash, newRefreshHash []byte,
	t *store.APIToken, secretHash []byte, revokeOld bool) error {
	op := "refresh session " + x.ID
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		n, err := q.db.Exec(ctx, `UPDATE oidc_sessions SET refresh_hash = $2, provider_refresh = $3, tenant_id = $4, role = $5,
				groups = $6, refreshed_at = $7
			WHERE id = $1 AND refresh_hash = $8 AND ended_at IS NULL`,
			x.ID, newRefreshHash, x.ProviderRefresh, x.TenantID, x.Role, strings.Join(x.Groups, "\n"), x.RefreshedAt, oldRefreshHash)
		if err != nil {
			return q.wrap(op, err)
		}
		if n != 1 {
			return fmt.Errorf("%s: %w: its refresh secret was used already, or it ended", op, store.ErrConflict)
		}
		if revokeOld {
			if _, err := q.db.Exec(ctx, `UPDATE api_tokens SET revoked_at = now() WHERE session_id = $1 AND revoked_at IS NULL`, x.ID); err != nil {
				return q.wrap(op, err)
			}
		}
		return q.insertSessionToken(ctx, x, t, secretHash)
	})
}

// OIDCSessionRevalidated records the control plane's own refresh.
func (s *Store) OIDCSessionRevalidated(ctx context.Context, x *store.OIDCSession, oldProviderRefresh string, revokeTokens bool) error {
	op := "revalidate session " + x.ID
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		n, err := q.db.Exec(ctx, `UPDATE oidc_sessions SET provider_refresh = $2, groups = $3, refreshed_at = $4, role = $5
			WHERE id = $1 AND provider_refresh = $6 AND ended_at IS NULL`,
			x.ID, x.ProviderRefresh, strings.Join(x.Groups, "\n"), x.RefreshedAt, x.Role, oldProviderRefresh)
		if err != nil {
			return q.wrap(op, err)
		}
		if n != 1 {
			return fmt.Errorf("%s: %w: refreshed by another, or ended", op, store.ErrConflict)
		}
		if revokeTokens {
			_, err = q.db.Exec(ctx, `UPDATE api_tokens SET revoked_at = now() WHERE session_id = $1 AND revoked_at IS NULL`, x.ID)
		}
		return q.wrap(op, err)
	})
}

// OIDCSessionEnd ends a session and revokes its tokens.
func (s *Store) OIDCSessionEnd(ctx context.Context, id, reason string) error {
	op := "end session " + id
	return s.Tx(ctx, func(tx store.Store) error {
		q := tx.(*Store)
		n, err := q.db.Exec(ctx, `UPDATE oidc_sessions SET ended_at = now(), end_reason = $2
			WHERE id = $1 AND ended_at IS NULL`, id, reason)
		if err != nil || n == 0 {
			if err == nil {
				_, err = q.OIDCSessionGet(ctx, id) // ErrNotFound for a session that never was
			}
			return err
		}
		_, err = q.db.Exec(ctx, `UPDATE api_tokens SET revoked_at = now() WHERE session_id = $1 AND revoked_at IS NULL`, id)
		return q.wrap(op, err)
	})
}
