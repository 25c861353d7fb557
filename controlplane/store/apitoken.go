package store

import (
	"context"
	"time"
)

// API token roles.
const (
	RoleAdmin    = "admin"
	RoleOperator = "operator"
	RoleViewer   = "viewer"
)

// APIToken is a bearer credential for the API. Only the secret's hash is
// stored.
type APIToken struct {
	ID   string
	Role string
	// TenantID is the tenant whose subtree the role holds in
	// (docs/tenants.md); RootTenant for tokens made before tenants.
	TenantID    string
	Description string
	AllowCIDRs  []string
	ExpiresAt   *time.Time
	RevokedAt   *time.Time
	CreatedAt   time.Time
	// SessionID is the single sign-on session (OIDCSession) the token is a
	// bearer token of; empty for a token made by tokens create.
	SessionID string
	// Subject, DisplayName and Groups are the session's person as of the
	// refresh that made the token (empty for other tokens).
	Subject     string
	DisplayName string
	Groups      []string
}

// APITokenStore keeps API tokens.
type APITokenStore interface {
	APITokenCreate(ctx context.Context, t *APIToken, secretHash []byte) error
	// APITokenBySecret returns the token with this secret hash, revoked or
	// expired ones included (the caller decides).
	APITokenBySecret(ctx context.Context, secretHash []byte) (*APIToken, error)
	APITokenList(ctx context.Context, p *ListParams) ([]*APIToken, error)
	// APITokenGet returns a token by id, revoked or expired ones included;
	// ErrNotFound when there is none.
	APITokenGet(ctx context.Context, id string) (*APIToken, error)
	APITokenRevoke(ctx context.Context, id string) error
	// TokensPrune deletes join tokens and API tokens that expired or were
	// revoked before before; it returns how many.
	TokensPrune(ctx context.Context, before time.Time) (int64, error)
	// APITokenExpiry summarises the expiry of the live API tokens (neither
	// revoked nor expired at p.Now) that have one, in one aggregate query.
	APITokenExpiry(ctx context.Context, p *APITokenExpiryParams) (*APITokenExpiry, error)
	// APITokensWarnExpiring marks every live API token that expires within
	// p.Within of p.Now and was not marked yet, writes token.expiring for
	// each in the same transaction (so each token is warned about once),
	// and returns their ids.
	APITokensWarnExpiring(ctx context.Context, p *APITokenExpiryParams) ([]string, error)
}

// APITokenExpiryParams are the inputs of APITokenExpiry and
// APITokensWarnExpiring.
type APITokenExpiryParams struct {
	// Within is the horizon: tokens expiring within it of Now are counted
	// (APITokenExpiry) or warned about (APITokensWarnExpiring).
	Within time.Duration
	// Now defaults to the database's clock.
	Now *time.Time
}

// APITokenExpiry is the summary APITokenExpiry returns.
type APITokenExpiry struct {
	// Earliest is the soonest expiry among live tokens; nil when no live
	// token has one.
	Earliest *time.Time
	// Within counts the live tokens that expire within the params' Within.
	Within int
}
