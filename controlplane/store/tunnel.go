package store

import (
	"context"
	"errors"
	"time"
)

// Errors of TunnelUse: why a ticket opens nothing.
var (
	// ErrTunnelTicketInvalid: no tunnel with the id, or the secret does not
	// match.
	ErrTunnelTicketInvalid = errors.New("tunnel ticket unknown")
	// ErrTunnelTicketExpired: the ticket's 30 s passed.
	ErrTunnelTicketExpired = errors.New("tunnel ticket expired")
	// ErrTunnelTicketUsed: the ticket opened a tunnel already.
	ErrTunnelTicketUsed = errors.New("tunnel ticket already used")
)

// Tunnel is a shell or port forward to a node (migration 0016,
// docs/tunnels.md): its one-use ticket and, once opened, its life.
type Tunnel struct {
	ID        string
	NodeID    string
	Kind      string // "shell" or "port"
	Port      int
	AsRoot    bool
	CreatedBy string // "token:<id>"
	CreatedAt time.Time
	ExpiresAt time.Time
	OpenedAt  *time.Time
	ClosedAt  *time.Time
	GatewayID string
	BytesIn   int64 // client to node
	BytesOut  int64 // node to client
	ExitCode  *int32
	Reason    string
}

// TunnelStore keeps tunnels.
type TunnelStore interface {
	// TunnelCreate stores a tunnel's ticket (its secret's hash only).
	TunnelCreate(ctx context.Context, p *TunnelCreateParams) (*Tunnel, error)
	// TunnelUse consumes the ticket in one statement, so that it opens at
	// most one tunnel: ErrTunnelTicketInvalid for an unknown id or a wrong
	// secret, ErrTunnelTicketExpired past ExpiresAt (at Now),
	// ErrTunnelTicketUsed when it was used.
	TunnelUse(ctx context.Context, p *TunnelUseParams) (*Tunnel, error)
	// TunnelOpened records the gateway that opened the tunnel on its node
	// and writes tunnel.opened in the same transaction.
	TunnelOpened(ctx context.Context, id, gatewayID string, now *time.Time) error
	// TunnelClose records the tunnel's end and writes tunnel.closed in the
	// same transaction; a second close changes nothing.
	TunnelClose(ctx context.Context, p *TunnelCloseParams) error
	TunnelGet(ctx context.Context, id string) (*Tunnel, error)
}

// TunnelCreateParams are TunnelCreate's inputs.
type TunnelCreateParams struct {
	ID         string
	SecretHash []byte
	NodeID     string
	Kind       string
	Port       int
	AsRoot     bool
	CreatedBy  string
	TTL        time.Duration
	Now        *time.Time
}

// TunnelUseParams are TunnelUse's inputs.
type TunnelUseParams struct {
	ID         string
	SecretHash []byte
	Now        *time.Time
}

// TunnelCloseParams are TunnelClose's inputs.
type TunnelCloseParams struct {
	ID                string
	BytesIn, BytesOut int64
	// ExitCode is the shell's exit status, nil when none came.
	ExitCode *int32
	// Signal is the signal that ended the shell, if any.
	Signal string
	// Reason says why the tunnel ended ("exit", "client closed", "idle",
	// an error).
	Reason string
	Now    *time.Time
}
