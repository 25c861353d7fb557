package store

import (
	"context"
	"time"
)

// Gateway is a live or recently live gateway process.
type Gateway struct {
	ID          string
	Region      string
	Address     string
	Version     string
	Sessions    int
	MaxStreams  int
	Draining    bool
	StartedAt   time.Time
	HeartbeatAt time.Time
	// InternalAddress is the host:port of the gateway's internal control
	// API (host.gateway.internal, migration 0016), empty when it serves
	// none.
	InternalAddress string
	// DrainRequested is an operator's gateways.drain not yet undone by
	// gateways.undrain (migration 0019). Only GatewayDrainSet writes it;
	// the gateway reads it back from GatewayUpsert's row.
	DrainRequested bool
}

// GatewayStore keeps the gateways table.
type GatewayStore interface {
	// GatewayUpsert registers a gateway or refreshes its row (heartbeat_at
	// is set to the database clock).
	GatewayUpsert(ctx context.Context, p *GatewayUpsertParams) (*Gateway, error)
	GatewayGet(ctx context.Context, id string) (*Gateway, error)
	GatewayList(ctx context.Context) ([]*Gateway, error)
	GatewayDelete(ctx context.Context, id string) error
	// GatewayDrainSet records an operator's request that gateway id drain
	// (drain true) or take sessions again (false) and returns its row;
	// ErrNotFound when no such gateway is registered.
	GatewayDrainSet(ctx context.Context, id string, drain bool) (*Gateway, error)
	// GatewayReap closes the sessions held by every gateway whose lease
	// (LeasePrefix + id) is missing, released or expired at Now, keeping
	// each node's last heartbeat as its LastSeenAt (as SessionClose does),
	// so that the sweeper finds their commands session-less; and deletes
	// the rows and leases of gateways dead for longer than PruneAfter. Run
	// it under a singleton lease, in a fenced transaction.
	GatewayReap(ctx context.Context, p *GatewayReapParams) (*GatewayReapResult, error)
}

// GatewayLeasePrefix prefixes the name of a gateway's lease: "gateway:<id>"
// (DESIGN.md, "The control plane roles").
const GatewayLeasePrefix = "gateway:"

// GatewayReapParams are GatewayReap's inputs.
type GatewayReapParams struct {
	// LeasePrefix is the prefix of gateway lease names ("gateway:").
	LeasePrefix string
	// PruneAfter is how long a dead gateway's row and lease are kept.
	PruneAfter time.Duration
	Now        *time.Time
}

// GatewayReapResult is what GatewayReap did.
type GatewayReapResult struct {
	// Dead are the ids of the dead gateways whose sessions it closed.
	Dead []string
	// Sessions is how many sessions it closed.
	Sessions int
	// Pruned are the ids of the gateways whose rows it deleted.
	Pruned []string
}

// GatewayUpsertParams are GatewayUpsert's inputs.
type GatewayUpsertParams struct {
	ID         string
	Region     string
	Address    string
	Version    string
	Sessions   int
	MaxStreams int
	Draining   bool
	// InternalAddress is Gateway.InternalAddress.
	InternalAddress string
	Now             *time.Time
}
