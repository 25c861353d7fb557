package store

import (
	"context"
	"time"
)

// Node states.
const (
	NodeJoined      = "joined"      // joined, never connected
	NodeReady       = "ready"       // heartbeating
	NodeUnreachable = "unreachable" // no heartbeat for 3 intervals
	NodePoweredOff  = "powered-off" // its BMC says it is off
	NodeDraining    = "draining"    // drained by an operator
	// NodeClockSkewed is a node whose clock is off the gateways' by more
	// than host.gateway.clockSkewLimit: it takes no new commands and
	// counts against its pool's disruption budget (issue 36).
	NodeClockSkewed = "clock-skewed"
)

// Node is a machine running bcd.
type Node struct {
	ID              string
	PoolID          string
	Hostname        string
	MachineID       string
	State           string
	Cordoned        bool
	Labels          map[string]string
	Shard           int
	Inventory       []byte // JSON, as reported by the node
	InventoryDigest string
	BCDVersion      string
	OS              string
	Arch            string
	// BootID is the boot id the node reported when its latest session
	// opened (/proc/sys/kernel/random/boot_id), "" when it reported none.
	BootID       string
	CertSerial   string
	CertNotAfter *time.Time
	// KeySHA256 is the lower-case hex SHA-256 of the SubjectPublicKeyInfo
	// of the key of the node's latest certificate (pki.KeySHA256): the only
	// key re-attestation and a re-join by proof accept.
	KeySHA256 string
	// JoinTokenID is the id of the join token the node joined with last.
	JoinTokenID string
	// ClockSkew is the node's clock minus the gateway's, from its
	// heartbeats (positive: the node runs ahead); nil until measured.
	ClockSkew *time.Duration
	// ClockSkewAt is when ClockSkew was measured, by the gateway's clock.
	ClockSkewAt *time.Time
	// Disruption is why the node is out of service (a Disruption*
	// reason), "" when in service; DisruptionOwner holds it since
	// DisruptionSince (DisruptionStore).
	Disruption      string
	DisruptionOwner string
	DisruptionSince *time.Time
	CreatedAt       time.Time
	UpdatedAt       time.Time
	LastSeenAt      *time.Time
}

// NodeStore keeps nodes.
type NodeStore interface {
	// NodeUpsert inserts a node or, for an existing id, replaces its identity
	// fields (hostname, machine id, certificate, versions), keeping its
	// history, state and labels.
	NodeUpsert(ctx context.Context, p *NodeUpsertParams) (*Node, error)
	NodeGet(ctx context.Context, id string) (*Node, error)
	// NodeFindByHostname returns the oldest node of pool with hostname;
	// ErrNotFound when there is none. A join uses it only to warn: a name
	// never makes a machine an existing node (DESIGN.md, "Re-join needs
	// proof, never a name").
	NodeFindByHostname(ctx context.Context, poolID, hostname string) (*Node, error)
	// NodeFindByJoinKey returns the node that joined with join token
	// tokenID and whose latest key is keySHA256; ErrNotFound when there is
	// none. A Join repeated after a lost reply finds its node with it.
	NodeFindByJoinKey(ctx context.Context, tokenID, keySHA256 string) (*Node, error)
	// NodeSetCertificate records a node's new certificate (renewal,
	// re-attestation): serial, expiry and key hash. ErrNotFound for an
	// unknown id.
	NodeSetCertificate(ctx context.Context, p *NodeSetCertificateParams) error
	// NodeSetClockSkew records a node's clock skew as measured at now.
	// ErrNotFound for an unknown id.
	NodeSetClockSkew(ctx context.Context, id string, skew time.Duration, now *time.Time) error
	// NodeHostnameDuplicates lists the hostnames more than one node has,
	// with their node ids, sorted by hostname; at most limit hostnames.
	NodeHostnameDuplicates(ctx context.Context, limit int) ([]*HostnameDuplicate, error)
	NodeList(ctx context.Context, p *NodeListParams) ([]*Node, error)
	// NodeSummaries pages every node by id (p.Cursor, p.Limit) with its
	// id, pool, hostname, state, cordon, disruption, labels, bcd version
	// and InventoryDigest, but not its inventory: the fleet page's scan of
	// every node, which decodes an inventory (NodeInventories) only when
	// its digest changed.
	NodeSummaries(ctx context.Context, p *ListParams) ([]*Node, error)
	// NodeSetState moves a node to state; ErrNotFound for an unknown id.
	NodeSetState(ctx context.Context, id, state string) error
	// NodeSetCordoned marks a node (un)schedulable for new commands.
	NodeSetCordoned(ctx context.Context, id string, cordoned bool) error
	// NodeSetLabel sets the node's label key to value; an empty value
	// removes it. ErrNotFound for an unknown node.
	NodeSetLabel(ctx context.Context, id, key, value string) error
	// NodeRolledBackLocally records that bcd restored its previous release
	// by itself after a crash loop (issue 30): it writes the event
	// node.rolled-back-locally and changes no row. ErrNotFound for an
	// unknown node.
	NodeRolledBackLocally(ctx context.Context, p *NodeRolledBackLocallyParams) error
	// NodeSetInventory stores a node's inventory JSON and its digest.
	NodeSetInventory(ctx context.Context, id string, inventory []byte, digest string) error
	// NodeDelete removes a node, its session and commands.
	NodeDelete(ctx context.Context, id string) error
	// NodesMissing returns those of ids that name no node, in one query.
	NodesMissing(ctx context.Context, ids []string) ([]string, error)
	// NodeLivenessReconcile marks the nodes of shard whose last heartbeat is
	// older than StaleAfter unreachable, and unreachable ones seen since
	// ready again, as it does powered-off ones heard from more than
	// PoweredOffGrace after they were marked off. Run it under the shard's
	// lease.
	NodeLivenessReconcile(ctx context.Context, p *NodeLivenessParams) (unreachable, ready []string, err error)
	// NodeLivenessDue returns, with one read, those of p.Shards (ascending)
	// in which NodeLivenessReconcile with p's StaleAfter and Now would move
	// a node. The reconciler reads it once a round for the shards it holds
	// and opens a write transaction only for those named: none in a healthy
	// fleet.
	NodeLivenessDue(ctx context.Context, p *NodeLivenessDueParams) ([]int, error)
	// NodeCounts counts nodes by the site of their pool and by state, with
	// how many of each are cordoned, in one grouped query: a few rows
	// however many nodes (the fleet page's state × site grouping). Rows
	// are ordered by site id, then state.
	NodeCounts(ctx context.Context) ([]*NodeCount, error)
	// NodeCertEarliest returns the earliest certificate end
	// (cert_not_after) among the nodes in one of states (every node when
	// states is empty), in one aggregate query; nil when none has one.
	NodeCertEarliest(ctx context.Context, states []string) (*time.Time, error)
}

// NodeCount is the number of nodes of one site in one state.
type NodeCount struct {
	SiteID   string
	State    string
	Nodes    int
	Cordoned int
}

// NodeLivenessParams are NodeLivenessReconcile's inputs.
type NodeLivenessParams struct {
	// Shard is the shard whose nodes move, 0 to Shards-1.
	Shard int
	// StaleAfter is the heartbeat age that makes a ready node unreachable
	// (3 heartbeat intervals).
	StaleAfter time.Duration
	// PoweredOffGrace is how much later than its move to powered-off (the
	// node's updated_at) a node's last heartbeat must be, and younger than
	// StaleAfter, for the node to be ready again: the message that reported
	// it off is itself recorded as a heartbeat at the gateway's next flush,
	// and must not count. The reconciler passes one heartbeat interval;
	// zero counts any heartbeat after the move.
	PoweredOffGrace time.Duration
	// Now is the time to judge ages by; nil: the database's clock.
	Now *time.Time
}

// NodeLivenessDueParams are NodeLivenessDue's inputs.
type NodeLivenessDueParams struct {
	// Shards are the shards to look at; none: the answer is none.
	Shards []int
	// StaleAfter, PoweredOffGrace and Now are as in NodeLivenessParams.
	StaleAfter      time.Duration
	PoweredOffGrace time.Duration
	Now             *time.Time
}

// NodeUpsertParams are NodeUpsert's inputs.
type NodeUpsertParams struct {
	ID           string
	PoolID       string
	Hostname     string
	MachineID    string
	Labels       map[string]string
	BCDVersion   string
	OS           string
	Arch         string
	CertSerial   string
	CertNotAfter *time.Time
	// CertCAID is the issuing node CA's id (pki.NodeCAID); it replaces the
	// node's when not empty.
	CertCAID string
	// KeySHA256 and JoinTokenID replace the node's when not empty. A
	// JoinTokenID marks a join: the upsert writes node.joined (a new id)
	// or node.rejoined (an existing one) in its transaction; without it
	// (a session refreshing versions) it writes no event.
	KeySHA256   string
	JoinTokenID string
	Now         *time.Time
}

// NodeSetCertificateParams are NodeSetCertificate's inputs.
type NodeSetCertificateParams struct {
	ID        string
	Serial    string
	NotAfter  time.Time
	KeySHA256 string
	// CAID is the issuing node CA's id (pki.NodeCAID); it replaces the
	// node's when not empty.
	CAID string
	// Reattested marks a re-attestation (admission.Reattest): the change
	// writes a node.reattested event. A renewal or a repeated join writes
	// none.
	Reattested bool
	Now        *time.Time
}

// HostnameDuplicate is a hostname that several nodes have.
type HostnameDuplicate struct {
	Hostname string
	NodeIDs  []string // oldest first
}

// NodeRolledBackLocallyParams is what bcd reported of a rollback it made
// on its own (sessionv1.LocalRollback), checked by the gateway.
type NodeRolledBackLocallyParams struct {
	NodeID string
	// FromVersion is the release that crash-looped; ToVersion the one
	// restored ("" when unknown).
	FromVersion, ToVersion string
	// Reason is bcd's one line.
	Reason string
	// Starts is how many starts of FromVersion ended in an exit.
	Starts int
	// RolledBackAt is when bcd restored ToVersion, by the node's clock.
	RolledBackAt time.Time
	// Now is the event's time; nil means the process's clock.
	Now *time.Time
}

// NodeListParams filter and page NodeList.
type NodeListParams struct {
	ListParams
	PoolID string
	State  string
}
