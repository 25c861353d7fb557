package store

import (
	"context"
	"time"
)

// OIDCSession is a person's single sign-on session (migration 0033,
// docs/sso.md): who signed in through the configured OpenID provider, the
// tenant and role their groups map to, and the provider's refresh token,
// which never leaves the control plane. The bearer tokens the person's CLI
// or fleet page use are APIToken rows with SessionID set, short-lived and
// replaced at each refresh.
type OIDCSession struct {
	ID string
	// Subject is the person: the provider's issuer and "sub" claim
	// ("https://idp.example#248289761001"), the same across sessions.
	Subject string
	// DisplayName is the email (else name) claim, for people to read.
	DisplayName string
	TenantID    string
	Role        string
	// Groups are the groups claim as of the last refresh.
	Groups []string
	// Client is how the session was opened: "cli" (device flow) or "page"
	// (the fleet page's authorization code flow).
	Client string
	// ProviderRefresh is the provider's refresh token ("" when it gave
	// none: the session then cannot be refreshed past its first token).
	ProviderRefresh string
	CreatedAt       time.Time
	RefreshedAt     time.Time
	// ExpiresAt is the session's absolute end (iam.oidc.sessionTTL after
	// sign-in): no refresh extends it.
	ExpiresAt time.Time
	EndedAt   *time.Time
	EndReason string
}

// Live reports whether the session may still be used or refreshed at now.
func (s *OIDCSession) Live(now time.Time) bool {
	return s.EndedAt == nil && now.Before(s.ExpiresAt)
}

// OIDCLogin is a sign-in in progress: a device flow the CLI polls, or the
// fleet page's authorization code flow between the redirect to the
// provider and its callback. Known by the SHA-256 of a secret id only its
// client holds.
type OIDCLogin struct {
	// Kind is "device" or "page".
	Kind string
	// Tenant is the tenant the person asked to sign in to ("" for the one
	// their groups map to).
	Tenant     string
	DeviceCode string
	// Verifier is the PKCE code verifier (RFC 7636) of a page login.
	Verifier string
	// Nonce is the ID token's expected nonce of a page login.
	Nonce     string
	Interval  int // seconds between polls of a device flow
	CreatedAt time.Time
	ExpiresAt time.Time
}

// OIDCSessionStore keeps single sign-on sessions and the logins that open
// them.
type OIDCSessionStore interface {
	// OIDCLoginPut stores a login in progress under the hash of its id.
	OIDCLoginPut(ctx context.Context, idHash []byte, l *OIDCLogin) error
	// OIDCLoginGet returns a login in progress; ErrNotFound when there is
	// none (never made, finished, or pruned).
	OIDCLoginGet(ctx context.Context, idHash []byte) (*OIDCLogin, error)
	// OIDCLoginDelete removes a login; ErrNotFound when it was gone, so
	// that of two finishing one login one wins.
	OIDCLoginDelete(ctx context.Context, idHash []byte) error
	// OIDCLoginsPrune deletes the logins that expired before before and
	// the sessions that ended or expired before it (their tokens are
	// pruned with the API tokens); it returns how many rows it deleted.
	OIDCLoginsPrune(ctx context.Context, before time.Time) (int64, error)
	// OIDCSessionStart stores a new session, the hash of its refresh
	// secret and its first bearer token (tok.SessionID is set to s.ID), in
	// one transaction.
	OIDCSessionStart(ctx context.Context, s *OIDCSession, refreshHash []byte, tok *APIToken, secretHash []byte) error
	// OIDCSessionGet returns a session by id; ErrNotFound when none.
	OIDCSessionGet(ctx context.Context, id string) (*OIDCSession, error)
	// OIDCSessionByRefresh returns the session whose current refresh
	// secret has this hash, ended ones included (so that the refusal names
	// why it ended); ErrNotFound when none (a secret already replaced by a
	// refresh is not found).
	OIDCSessionByRefresh(ctx context.Context, refreshHash []byte) (*OIDCSession, error)
	// OIDCSessionRefresh replaces session s.ID's refresh secret (it must
	// still be oldRefreshHash, else ErrConflict: two refreshes with one
	// secret, one wins), its provider refresh token, tenant, role, groups
	// and RefreshedAt with s's, and adds tok as its new bearer token. With
	// revokeOld the session's earlier tokens are revoked (the person's
	// rights changed), so what they opened closes.
	OIDCSessionRefresh(ctx context.Context, s *OIDCSession, oldRefreshHash, newRefreshHash []byte, tok *APIToken, secretHash []byte, revokeOld bool) error
	// OIDCSessionRevalidated records a refresh the control plane made at
	// the provider by itself (for a session whose client holds calls open
	// but does not refresh): s's provider refresh token, groups and
	// RefreshedAt and role, if its provider refresh token is still
	// oldProviderRefresh (else ErrConflict: another refresh came first).
	// With revokeTokens every token of the session is revoked (the
	// person's rights changed: what they opened closes; the client's
	// refresh secret still gets a token with the new rights).
	OIDCSessionRevalidated(ctx context.Context, s *OIDCSession, oldProviderRefresh string, revokeTokens bool) error
	// OIDCSessionEnd ends a live session with reason and revokes every
	// token of it; a session already ended is left as it is (nil).
	OIDCSessionEnd(ctx context.Context, id, reason string) error
}
