package store

import (
	"context"
	"time"
)

// Session is a node's live connection to one gateway. A node has at most
// one; a newer one supersedes the older (its epoch is higher).
type Session struct {
	NodeID          string
	SessionID       string
	GatewayID       string
	Epoch           int64
	RemoteAddr      string
	ConnectedAt     time.Time
	LastHeartbeatAt time.Time
}

// SessionStore keeps sessions and their liveness.
type SessionStore interface {
	// SessionOpen records a node's new session on a gateway, superseding any
	// older one (epoch + 1), and the boot id the node reported as its
	// BootID. It records the start in session_starts (counted by
	// RolloutHealthCounts): SessionStartBCD for a Fresh session (a new bcd
	// process), SessionStartDrain for one that opens by the node's
	// reconnect_by plus DrainReconnectSlack (a gateway's drain asked for
	// it), SessionStartDrop otherwise. It returns the new session and the
	// one it replaced, if any.
	SessionOpen(ctx context.Context, p *SessionOpenParams) (session, previous *Session, err error)
	// SessionClose removes a session if it is still the node's current one,
	// and keeps its last heartbeat as the node's LastSeenAt.
	SessionClose(ctx context.Context, nodeID, sessionID string) error
	SessionGet(ctx context.Context, nodeID string) (*Session, error)
	SessionList(ctx context.Context, gatewayID string) ([]*Session, error)
	// SessionIDs returns the ids of gatewayID's sessions, in no order: what
	// a gateway reads back to find its sessions superseded elsewhere,
	// without the rest of each row.
	SessionIDs(ctx context.Context, gatewayID string) ([]string, error)
	// SessionHeartbeatBatch records liveness of many sessions in one
	// statement per call: the gateway's batched heartbeat write. Sessions no
	// longer current (superseded) are skipped. It writes no nodes row: a
	// node's LastSeenAt reads its current session's last heartbeat, and
	// SessionClose keeps that in the node when the session ends.
	SessionHeartbeatBatch(ctx context.Context, gatewayID string, sessionIDs []string, now *time.Time) (int, error)
	// SessionDrain records that every session of p.GatewayID was sent
	// Drain with a delay of at most p.Within: each of their nodes is due
	// back by p.Now + p.Within, and liveness counts it heard from until
	// then (issue 29: a node waiting out its reconnect delay after a
	// gateway restart is not silent). It returns how many nodes it marked.
	SessionDrain(ctx context.Context, p *SessionDrainParams) (int, error)
}

// SessionDrainParams are SessionDrain's inputs.
type SessionDrainParams struct {
	// GatewayID is the draining gateway.
	GatewayID string
	// Within is the most a node may take to come back: the gateway passes
	// host.gateway.drainDelay plus one heartbeat interval.
	Within time.Duration
	// Now is when the Drains are sent; nil: the database's clock.
	Now *time.Time
}

// DrainReconnectSlack is how long after a gateway's drain expected a node
// back (nodes.reconnect_by) its new session still counts as the drain's
// reconnect, not as a drop (issue 30).
const DrainReconnectSlack = 30 * time.Second

// SessionOpenParams are SessionOpen's inputs.
type SessionOpenParams struct {
	NodeID     string
	SessionID  string
	GatewayID  string
	RemoteAddr string
	// BootID is the boot id the node reported in Hello, recorded as the
	// node's BootID ("" when it reports none: an older bcd).
	BootID string
	// Fresh says Hello carried no resume cursor: a new bcd process, counted
	// in the node's bcd_starts (migration 0018_rollout_watch).
	Fresh bool
	Now   *time.Time
}

// Kinds of the session starts SessionOpen records (table session_starts,
// migration 0021_rollout_health_gate): what rollouts' health gates count
// as bcd restarts and session drops (RolloutHealthCounts; issue 30).
const (
	// SessionStartBCD: a session opened without a resume cursor (a new
	// bcd process).
	SessionStartBCD = "bcd-start"
	// SessionStartDrop: a session of the same bcd opened again, not after
	// a gateway's drain.
	SessionStartDrop = "drop"
	// SessionStartDrain: the same, by the node's reconnect_by plus
	// DrainReconnectSlack: the reconnect a gateway's drain asked for.
	SessionStartDrain = "drain-reconnect"
)
