package store

import (
	"context"
	"time"
)

// JoinToken authorises daemons to join a pool. Only the secret's hash is
// stored.
type JoinToken struct {
	ID          string
	PoolID      string
	Description string
	MaxUses     int
	Uses        int
	ExpiresAt   time.Time
	RevokedAt   *time.Time
	// NodeID is set on a token made by nodes reinstall: a machine that
	// joins with it becomes that node, keeping its id, labels and history.
	NodeID    string
	CreatedAt time.Time
}

// JoinTokenStore keeps join tokens.
type JoinTokenStore interface {
	JoinTokenCreate(ctx context.Context, p *JoinTokenCreateParams) (*JoinToken, error)
	JoinTokenGet(ctx context.Context, id string) (*JoinToken, error)
	JoinTokenList(ctx context.Context, p *ListParams) ([]*JoinToken, error)
	// JoinTokenRevoke revokes a token; ErrNotFound for an unknown id.
	JoinTokenRevoke(ctx context.Context, id string) error
	// JoinTokenConsume uses a token once, in one statement: it succeeds
	// only for a known token with this secret hash, not expired, not
	// revoked and with uses below max-uses, so N concurrent callers on a
	// token with max-uses M < N get exactly M successes. Refusals are
	// ErrTokenInvalid, ErrTokenExpired, ErrTokenRevoked or ErrTokenExhausted.
	JoinTokenConsume(ctx context.Context, id string, secretHash []byte, now *time.Time) (*JoinToken, error)
	// JoinTokensExpire writes join-token.expired for every token whose TTL
	// passed by now (nil: the database's clock), unrevoked, that has not
	// had one, and marks it reported (migration 0009); it returns their ids.
	// The iam role runs it every minute.
	JoinTokensExpire(ctx context.Context, now *time.Time) ([]string, error)
	// JoinTokenCheck checks a token as JoinTokenConsume does, but uses
	// nothing and accepts a token whose uses are all spent: a repeated
	// Join of a node the token already admitted. Refusals are
	// ErrTokenInvalid, ErrTokenExpired or ErrTokenRevoked.
	JoinTokenCheck(ctx context.Context, id string, secretHash []byte, now *time.Time) (*JoinToken, error)
}

// JoinTokenCreateParams are JoinTokenCreate's inputs.
type JoinTokenCreateParams struct {
	ID          string
	SecretHash  []byte
	PoolID      string
	Description string
	MaxUses     int
	ExpiresAt   time.Time
	// NodeID binds the token to an existing node (nodes reinstall).
	NodeID string
}
