package store

import (
	"context"
	"crypto/rand"
	"errors"
	"slices"
	"strings"
	"time"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Dialect names a backend's SQL dialect.
type Dialect string

// The dialects a Store may speak.
const (
	DialectSQLite   Dialect = "sqlite"
	DialectPostgres Dialect = "postgres"
)

// Errors every backend returns, matched with errors.Is.
var (
	// ErrNotFound is returned when the addressed row does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict is returned when a write would violate a uniqueness rule.
	ErrConflict = errors.New("conflict")
	// ErrDiskFull is returned by a write the database could not make for
	// want of disk space (SQLite's SQLITE_FULL, PostgreSQL's disk_full):
	// the API answers UNAVAILABLE "database disk full" (issue 29).
	ErrDiskFull = errors.New("database disk full")
	// ErrUnavailable is returned (wrapped, beside the driver's error) when
	// the database cannot be reached or will not take the statement now: a
	// connection refused, reset or timed out, a server shutting down or
	// starting up, or a standby that refuses writes (PostgreSQL's classes 08
	// and 57P0x, read_only_sql_transaction) — a failover or restart under
	// way. Nothing the caller did is wrong: the API answers UNAVAILABLE and
	// the caller may retry (issue 39; docs/scaling.md).
	ErrUnavailable = errors.New("database unavailable")
	// ErrFenced is returned by a fenced write whose lease is no longer held
	// by the writer at the writer's epoch.
	ErrFenced = errors.New("lease lost: write fenced")
	// ErrTokenInvalid is returned by JoinTokenConsume for an unknown token or
	// a wrong secret; the two are not told apart to the caller.
	ErrTokenInvalid = errors.New("join token unknown")
	// ErrTokenExpired is returned by JoinTokenConsume for a token past its TTL.
	ErrTokenExpired = errors.New("join token expired")
	// ErrTokenRevoked is returned by JoinTokenConsume for a revoked token.
	ErrTokenRevoked = errors.New("join token revoked")
	// ErrTokenExhausted is returned by JoinTokenConsume for a token whose uses
	// reached max-uses.
	ErrTokenExhausted = errors.New("join token exhausted")
)

// MigrationError is returned by Migrate and Check when the database holds
// applied migrations this build does not know: it was migrated by a newer
// build, and running this one against it could corrupt it.
type MigrationError struct {
	// Unknown lists the names of the applied migrations this build lacks.
	Unknown []string
}

func (e *MigrationError) Error() string {
	return "database was migrated by a newer build: unknown applied migrations " + strings.Join(e.Unknown, ", ") + "; run the build that applied them"
}

// Shards is the number of shards work is split into (DESIGN.md, "Workers").
const Shards = 256

// ShardOf returns the shard of a key, such as a node id: FNV-1a (32 bit) of
// the key modulo Shards.
func ShardOf(key string) int {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return int(h % Shards)
}

// NewID returns a new random identifier with the given prefix, such as
// "node_k2xq7w4r9d3m5c8v1b6n0zj4p" (prefix, underscore, 26 base32 characters,
// 130 bits of randomness).
func NewID(prefix string) string {
	return prefix + "_" + strings.ToLower(rand.Text())
}

// Store is everything the control plane reads and writes. It is the one wide
// interface of the project (the storage seam, as river's riverdriver.Executor);
// consumers declare the narrow interfaces they need.
//
// A Store returned by Tx or FencedTx runs every call in that transaction.
type Store interface {
	// Dialect names the backend.
	Dialect() Dialect
	// Ping checks that the database answers.
	Ping(ctx context.Context) error
	// Now returns the database's clock: now() on PostgreSQL, the process's
	// clock on SQLite (the function the backend registers). doctor compares
	// it with the local clock, since expiry is decided by the database.
	Now(ctx context.Context) (time.Time, error)
	// Close releases the connections.
	Close() error

	// Tx runs fn in one transaction, committed when fn returns nil.
	// Inside a transaction it runs fn in the same one.
	Tx(ctx context.Context, fn func(Store) error) error
	// FencedTx runs fn in one transaction that first checks the writer still
	// holds fence's lease at fence's epoch (and that it has not expired by the
	// database's clock), and keeps it from changing hands until the
	// transaction ends. Otherwise it returns ErrFenced and runs nothing.
	FencedTx(ctx context.Context, fence Fence, fn func(Store) error) error

	Migrator
	LeaseStore
	SiteStore
	PoolStore
	NodeStore
	JoinTokenStore
	GatewayStore
	TunnelStore
	SessionStore
	WorkerStore
	ProcessStore
	CommandStore
	OutboxStore
	DeadLetterStore
	EventStore
	AuditStore
	PKIStore
	PKIRotationStore
	APITokenStore
	SecretStore
	DisruptionStore
	ReservationStore
	RemediationStore
	RolloutStore
	GPUStore
}

// Migrator applies and reports schema migrations.
type Migrator interface {
	// Migrate applies every pending migration under a lock (an advisory
	// lock on PostgreSQL, the write lock on SQLite), so concurrent callers all
	// succeed with one schema. It returns the names it applied, and a
	// *MigrationError naming applied migrations this build does not know,
	// or the names applied before a refused contract migration with a
	// *ContractRefusedError (issue 40).
	Migrate(ctx context.Context) ([]string, error)
	// MigrateTo is Migrate stopping after the migration named last (one
	// this build embeds; else an error), for staged upgrades and tests.
	// A refused contract migration is a *ContractRefusedError after the
	// names applied before it (issue 40).
	MigrateTo(ctx context.Context, last string) ([]string, error)
	// MigrationStatus reports applied and pending migration names, and a
	// *MigrationError when the database holds unknown ones.
	MigrationStatus(ctx context.Context) (*MigrationStatus, error)
}

// MigrationStatus is the schema's state against this build.
type MigrationStatus struct {
	Applied []string
	// Pending lists every migration this build embeds and the database
	// lacks, in order.
	Pending []string
	// PendingContract is the part of Pending marked `-- contract` (issue
	// 40, docs/upgrade-control-plane.md): a build runs on the schema before
	// its contract migrations, so they do not make it unready.
	PendingContract []string
}

// PendingExpand returns the pending migrations that are not contract ones:
// those a build needs before it serves.
func (s *MigrationStatus) PendingExpand() []string {
	var out []string
	for _, n := range s.Pending {
		if !slices.Contains(s.PendingContract, n) {
			out = append(out, n)
		}
	}
	return out
}

// ContractLiveWithin is how fresh a workers or gateways row's heartbeat
// must be for a contract migration to count its process as live.
const ContractLiveWithin = time.Minute

// ContractRefusedError is Migrate's error when a pending contract
// migration (first line `-- contract`) would drop a shape that a live
// process still needs: a processes row whose schema (the newest migration
// its build embeds) is older than Migration or empty, a live workers row
// with no processes row, or a live gateways row with no processes row of
// role gateway and the same version (a build from before the processes
// table). Migrate applies the migrations before Migration and stops there.
type ContractRefusedError struct {
	// Migration is the contract migration not applied.
	Migration string
	// Processes describe the processes that need the old shape, e.g.
	// "process p1 (version 1.2.0, schema 0018_rollout_watch)".
	Processes []string
}

func (e *ContractRefusedError) Error() string {
	return "contract migration " + e.Migration + " refused: live processes still run builds that need the old schema: " +
		strings.Join(e.Processes, "; ") + "; upgrade or stop them (docs/upgrade-control-plane.md), then migrate again"
}

// LeaseStore keeps named leases: the single-writer guarantee of every job.
// Names follow DESIGN.md: shard:<n>, singleton:<name>, gateway:<id>.
type LeaseStore interface {
	// LeaseAcquire takes the lease when it is free, expired or already held
	// by the same holder (then it is renewed at the same epoch). A takeover
	// raises the epoch by one. ok is false, with a nil error, when another
	// holder has it: that is a normal result.
	LeaseAcquire(ctx context.Context, p *LeaseAcquireParams) (lease *Lease, ok bool, err error)
	// LeaseRenew extends a lease the holder still holds at its epoch and that
	// has not expired. ok is false when it was lost.
	LeaseRenew(ctx context.Context, p *LeaseRenewParams) (lease *Lease, ok bool, err error)
	// LeaseRelease gives a lease up at once, so the next acquirer need not
	// wait for expiry. Releasing a lease not held is a no-op.
	LeaseRelease(ctx context.Context, name, holder string, epoch int64) error
	// LeaseGet returns a lease, expired or not; ErrNotFound if never taken.
	LeaseGet(ctx context.Context, name string) (*Lease, error)
	// LeaseList returns leases whose name starts with prefix, by name.
	LeaseList(ctx context.Context, prefix string) ([]*Lease, error)
}

// Lease is a named, expiring claim of single-writer ownership.
type Lease struct {
	Name       string
	Holder     string
	Epoch      int64
	AcquiredAt time.Time
	RenewedAt  time.Time
	ExpiresAt  time.Time
}

// Fence names the lease a write is made under.
type Fence struct {
	Lease  string
	Holder string
	Epoch  int64
	// Now overrides the database clock for the expiry check (tests only).
	Now *time.Time
}

// LeaseAcquireParams are LeaseAcquire's inputs.
type LeaseAcquireParams struct {
	Name   string
	Holder string
	TTL    time.Duration
	Now    *time.Time
}

// LeaseRenewParams are LeaseRenew's inputs.
type LeaseRenewParams struct {
	Name   string
	Holder string
	Epoch  int64
	TTL    time.Duration
	Now    *time.Time
}

// ListParams pages a list: rows after Cursor (an id), at most Limit
// (1 to 1,000; 0 means 100).
type ListParams struct {
	Cursor string
	Limit  int
}

// MaxListLimit is the most rows one list call returns.
const MaxListLimit = 1000

// Site is a physical location in a region.
type Site struct {
	ID        string
	Name      string
	Region    string
	CreatedAt time.Time
}

// SiteStore keeps sites.
type SiteStore interface {
	// SiteCreate inserts a site; ErrConflict when the name is taken.
	SiteCreate(ctx context.Context, p *SiteCreateParams) (*Site, error)
	SiteGet(ctx context.Context, idOrName string) (*Site, error)
	SiteList(ctx context.Context, p *ListParams) ([]*Site, error)
}

// SiteCreateParams are SiteCreate's inputs. ID defaults to a new site_ id.
type SiteCreateParams struct {
	ID     string
	Name   string
	Region string
}

// Pool is a group of nodes at one site; join tokens are bound to a pool.
type Pool struct {
	ID     string
	Name   string
	SiteID string
	// DisruptionBudget is "N" or "N%" (DisruptionStore); default
	// DefaultDisruptionBudget.
	DisruptionBudget string
	// RemediationConcurrency is how many remediation actions may run at
	// once on the pool's quarantined nodes.
	RemediationConcurrency int
	CreatedAt              time.Time
}

// PoolStore keeps pools.
type PoolStore interface {
	// PoolCreate inserts a pool; ErrConflict when the name is taken,
	// ErrNotFound when the site does not exist.
	PoolCreate(ctx context.Context, p *PoolCreateParams) (*Pool, error)
	PoolGet(ctx context.Context, idOrName string) (*Pool, error)
	PoolList(ctx context.Context, p *ListParams) ([]*Pool, error)
}

// PoolCreateParams are PoolCreate's inputs. ID defaults to a new pool_ id.
type PoolCreateParams struct {
	ID     string
	Name   string
	SiteID string
}

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

// Process is one registered control-plane process, whatever its roles
// (migration 0019): what `processes list` shows and doctor checks.
type Process struct {
	ID       string
	Roles    []string
	Hostname string
	PID      int
	Version  string
	// Schema is the newest migration the process's build knows (a
	// migration name such as 0019_processes_gateway_drain).
	Schema      string
	StartedAt   time.Time
	HeartbeatAt time.Time
}

// ProcessStore keeps the processes table.
type ProcessStore interface {
	// ProcessHeartbeat registers a process or refreshes its row
	// (heartbeat_at is Now, or the database clock). Schema is filled
	// by the store with the newest migration it embeds.
	ProcessHeartbeat(ctx context.Context, p *ProcessHeartbeatParams) (*Process, error)
	// ProcessList returns every registered process, by id.
	ProcessList(ctx context.Context) ([]*Process, error)
	// ProcessDelete removes a process's row (a clean stop).
	ProcessDelete(ctx context.Context, id string) error
	// ProcessPrune deletes the rows not heard from for longer than
	// olderThan at now (nil: the database clock) and returns their ids.
	ProcessPrune(ctx context.Context, olderThan time.Duration, now *time.Time) ([]string, error)
}

// ProcessHeartbeatParams are ProcessHeartbeat's inputs.
type ProcessHeartbeatParams struct {
	ID       string
	Roles    []string
	Hostname string
	PID      int
	Version  string
	Now      *time.Time
}

// Worker is a process running worker roles.
type Worker struct {
	ID          string
	Roles       []string
	Hostname    string
	PID         int
	Version     string
	StartedAt   time.Time
	HeartbeatAt time.Time
}

// WorkerStore keeps worker membership.
type WorkerStore interface {
	// WorkerHeartbeat registers a worker or refreshes its heartbeat.
	WorkerHeartbeat(ctx context.Context, p *WorkerHeartbeatParams) (*Worker, error)
	// WorkerList returns workers whose heartbeat is newer than liveWithin
	// by the database clock (all workers when liveWithin is 0), by id.
	WorkerList(ctx context.Context, liveWithin time.Duration, now *time.Time) ([]*Worker, error)
	WorkerDelete(ctx context.Context, id string) error
}

// WorkerHeartbeatParams are WorkerHeartbeat's inputs.
type WorkerHeartbeatParams struct {
	ID       string
	Roles    []string
	Hostname string
	PID      int
	Version  string
	Now      *time.Time
}

// Command states. Terminal ones end a command; exactly one is reached.
const (
	CommandQueued     = "queued"
	CommandDispatched = "dispatched"
	CommandAccepted   = "accepted"
	CommandRunning    = "running"
	CommandSucceeded  = "succeeded"
	CommandFailed     = "failed"
	CommandCancelled  = "cancelled"
	CommandExpired    = "expired"
	CommandLost       = "lost"
)

// IsTerminal reports whether state ends a command.
func IsTerminal(state string) bool {
	switch state {
	case CommandSucceeded, CommandFailed, CommandCancelled, CommandExpired, CommandLost:
		return true
	}
	return false
}

// Command is one unit of work for one node. Its spec is kept in the
// session-protocol form the gateway sends (SessionSpec, migration
// 0008_command_session_spec); rows an older build wrote in the API's form
// are converted on read.
type Command struct {
	ID              string
	NodeID          string
	Kind            string
	SessionSpec     []byte // session-protocol form: protojson of a session.v1 Command with only its spec set (sessionv1.MarshalSpec)
	State           string
	IdempotencyKey  string
	BatchID         string
	CreatedBy       string
	Attempt         int
	GatewayID       string
	ExitCode        *int
	Error           string
	OutputTruncated bool
	OutputBytes     int64
	Result          []byte // JSON, kind-specific
	CancelRequested bool
	CreatedAt       time.Time
	DeadlineAt      time.Time
	DispatchedAt    *time.Time
	StartedAt       *time.Time
	FinishedAt      *time.Time
}

// CommandStore keeps commands and their output.
type CommandStore interface {
	// CommandEnqueue writes one command per node and one outbox row for the
	// batch in one transaction. With an idempotency key already used for a
	// node, that node's existing command is returned instead of a new one.
	CommandEnqueue(ctx context.Context, p *CommandEnqueueParams) ([]*Command, error)
	CommandGet(ctx context.Context, id string) (*Command, error)
	CommandList(ctx context.Context, p *CommandListParams) ([]*Command, error)
	// CommandSetState moves a non-terminal command to a non-terminal state
	// (dispatched, accepted, running); a terminal command is left alone and
	// ok is false.
	CommandSetState(ctx context.Context, p *CommandSetStateParams) (ok bool, err error)
	// CommandFinish records a terminal result. The first terminal result
	// wins: later ones leave the command as it is and return ok false.
	CommandFinish(ctx context.Context, p *CommandFinishParams) (ok bool, err error)
	// CommandAppendOutput stores a chunk of output at its sequence number
	// and returns how many of its bytes were kept. A chunk already stored
	// (a redelivery) is ignored. Nothing is kept for a command that is
	// terminal (its result is in: issue 28) or that is not NodeID's; data
	// past the command's output limit (its exec spec's outputLimitBytes,
	// else sessionv1.DefaultOutputLimitBytes) or past MaxOutputChunk in one
	// chunk is cut, and the command is marked output_truncated. A missing
	// command keeps nothing and is no error.
	CommandAppendOutput(ctx context.Context, p *CommandOutputChunk) (kept int, err error)
	// CommandOutputPage returns a command's output chunks after AfterSeq,
	// in order, at most MaxBytes of data together (always at least one
	// chunk when any follows): no more than a page is read into memory.
	CommandOutputPage(ctx context.Context, p *CommandOutputPageParams) (*CommandOutputPage, error)
	// CommandPrune deletes terminal commands finished before before.
	CommandPrune(ctx context.Context, before time.Time) (int64, error)
	// CommandRequestCancel cancels a command: a queued one ends cancelled
	// at once; a dispatched or running one is marked cancel_requested for
	// its gateway to send Cancel. A terminal command is returned unchanged.
	CommandRequestCancel(ctx context.Context, id string) (*Command, error)
	// CommandSweep drives overdue and orphaned commands to a terminal state:
	// every non-terminal command past its deadline ends expired; a
	// dispatched, accepted or running command whose node has had no session
	// for LostAfter ends lost, or goes back to queued when it was created
	// with an idempotency key. Run it under the command-sweeper lease.
	CommandSweep(ctx context.Context, p *CommandSweepParams) (*CommandSweepResult, error)
	// CommandClaim moves up to Limit queued commands, oldest first, whose
	// node's current session is on GatewayID and whose deadline has not
	// passed, to dispatched on that gateway, and returns them. Concurrent
	// claimers never get the same command (FOR UPDATE SKIP LOCKED on
	// PostgreSQL; the write lock on SQLite).
	CommandClaim(ctx context.Context, p *CommandClaimParams) ([]*Command, error)
	// CommandInFlight returns nodeID's commands that a node may hold:
	// dispatched, accepted or running.
	CommandInFlight(ctx context.Context, nodeID string) ([]*Command, error)
	// CommandCancelsPending returns the live commands of gatewayID whose
	// cancellation was requested.
	CommandCancelsPending(ctx context.Context, gatewayID string) ([]*Command, error)
	// CommandCountOpen counts the commands not yet terminal (queued,
	// dispatched, accepted, running) by state, in one grouped query; states
	// with none are absent.
	CommandCountOpen(ctx context.Context) (map[string]int, error)
}

// CommandClaimParams are CommandClaim's inputs.
type CommandClaimParams struct {
	GatewayID string
	Limit     int
	Now       *time.Time
}

// CommandSweepParams are CommandSweep's inputs.
type CommandSweepParams struct {
	// LostAfter is how long a node may be without a session before its
	// in-flight commands are lost.
	LostAfter time.Duration
	Now       *time.Time
}

// CommandSweepResult counts what a sweep changed.
type CommandSweepResult struct {
	Expired  []*Command
	Lost     []*Command
	Requeued []*Command
}

// CommandEnqueueParams are CommandEnqueue's inputs.
type CommandEnqueueParams struct {
	NodeIDs        []string
	Kind           string
	SessionSpec    []byte // as Command.SessionSpec; nil stores {}
	IdempotencyKey string
	BatchID        string
	CreatedBy      string
	Timeout        time.Duration
	Now            *time.Time
}

// CommandListParams filter and page CommandList.
type CommandListParams struct {
	ListParams
	NodeID  string
	BatchID string
	State   string
}

// CommandSetStateParams are CommandSetState's inputs.
type CommandSetStateParams struct {
	ID        string
	State     string
	GatewayID string
	// NodeID, when set, changes the command only if it is that node's.
	NodeID string
	Now    *time.Time
}

// CommandFinishParams are CommandFinish's inputs.
type CommandFinishParams struct {
	ID string
	// NodeID, when set, finishes the command only if it is that node's.
	NodeID          string
	State           string
	ExitCode        *int
	Error           string
	OutputTruncated bool
	Result          []byte
	Now             *time.Time
}

// Output streams.
const (
	StreamStdout = 1
	StreamStderr = 2
)

// MaxOutputChunk is the most data one stored output chunk keeps (bytes):
// bcd sends chunks of at most 32 KiB, so a larger one is a hostile node's,
// and cutting it keeps every chunk within one page (MaxOutputPage).
const MaxOutputChunk = 1 << 20

// MaxOutputPage is the most output data CommandOutputPage reads at once
// (bytes; issue 28: reading output back never loads more than a page).
const MaxOutputPage = 1 << 20

// CommandOutputPageParams are CommandOutputPage's inputs.
type CommandOutputPageParams struct {
	CommandID string
	// AfterSeq is the sequence number of the last chunk already read; 0
	// starts at the first.
	AfterSeq int64
	// MaxBytes bounds the page's data. Defaults to, and is at most,
	// MaxOutputPage.
	MaxBytes int64
}

// CommandOutputPage is one page of a command's output.
type CommandOutputPage struct {
	Chunks []*CommandOutputChunk
	// More reports chunks after the page's last: read on with AfterSeq
	// set to its Seq.
	More bool
}

// CommandOutputChunk is a piece of a command's output.
type CommandOutputChunk struct {
	CommandID string
	Seq       int64
	Stream    int
	Data      []byte
	// NodeID, when set on a write, stores the chunk only if the command is
	// that node's. It is not read back.
	NodeID string
}

// OutboxEntry is an event waiting for delivery to the sinks.
type OutboxEntry struct {
	ID        int64
	Topic     string
	Key       string
	Payload   []byte // JSON
	CreatedAt time.Time
}

// OutboxStore keeps the transactional outbox and each sink's cursor.
type OutboxStore interface {
	OutboxInsert(ctx context.Context, topic, key string, payload []byte) (int64, error)
	// OutboxList returns entries with id above afterID, oldest first.
	OutboxList(ctx context.Context, afterID int64, limit int) ([]*OutboxEntry, error)
	// OutboxCursor returns the id of the last entry delivered to sink (0 at
	// first).
	OutboxCursor(ctx context.Context, sink string) (int64, error)
	OutboxCursorSet(ctx context.Context, sink string, lastID int64) error
	// OutboxMaxID returns the id of the newest entry (0 when the outbox is
	// empty): a sink's backlog is OutboxMaxID less its cursor.
	OutboxMaxID(ctx context.Context) (int64, error)
	// OutboxQuery returns the entries p selects: newest first by id, or
	// oldest first with p.Ascending. It reads without the outbox read lock,
	// so it may miss an entry whose transaction has not committed yet; a
	// reader that must see every entry in order (a sink, the event stream)
	// uses OutboxList.
	OutboxQuery(ctx context.Context, p *OutboxQueryParams) ([]*OutboxEntry, error)
	// OutboxPrune deletes the entries created before before, as a prefix of
	// ids (every id up to the newest such entry), and records the highest id
	// deleted for OutboxPrunedThrough. It returns how many it deleted.
	OutboxPrune(ctx context.Context, before time.Time) (int64, error)
	// OutboxPrunedThrough returns the highest id OutboxPrune has deleted (0
	// when nothing was pruned): a reader resuming after a lower id has lost
	// entries to retention.
	OutboxPrunedThrough(ctx context.Context) (int64, error)
	// OutboxWritten returns a channel that receives a value after each
	// commit, through this store, of a transaction that wrote to the
	// outbox (several coalesce into one pending value), and the function
	// that ends the subscription: the process's outbox readers read then
	// rather than at their next poll. On PostgreSQL such a commit also
	// sends NOTIFY on postgres.OutboxChannel, for the readers of other
	// processes (wake.ListenChannels).
	OutboxWritten() (<-chan struct{}, func())
}

// OutboxQueryParams filter OutboxQuery. Every filter is optional (zero
// means any) and all apply together.
type OutboxQueryParams struct {
	// BeforeID and AfterID bound the id: AfterID < id < BeforeID.
	BeforeID, AfterID int64
	// Since and Until bound the entry's creation time: Since <= time < Until.
	Since, Until time.Time
	// TopicPrefix matches topics (event types) that start with it, byte for
	// byte; no wildcards.
	TopicPrefix string
	// Key matches the key (the event's subject) exactly.
	Key string
	// Ascending lists oldest first; the default is newest first.
	Ascending bool
	// Limit is 1 to MaxListLimit; 0 means 100.
	Limit int
}

// Event is something that happened on a node or in the control plane, such
// as a GPU XID error.
type Event struct {
	ID       int64
	NodeID   string
	Kind     string
	Severity string
	Message  string
	Time     time.Time
	Payload  []byte // JSON
	// GPUFinding is the typed finding of a node's GPU event (kinds
	// "gpu.*"), as the node sent it. When set, EventInsert stores its
	// protojson as Payload (gpufinding.Marshal; Payload is ignored), writes
	// the gpu.health-changed event and, when it names a resolution, a
	// RemediationFinding, all in one transaction. EventList leaves it nil:
	// gpufinding.Decode reads it from Payload, in either stored shape.
	GPUFinding *sessionv1.GPUFinding
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

// EventStore keeps events.
type EventStore interface {
	EventInsert(ctx context.Context, e *Event) (int64, error)
	EventList(ctx context.Context, p *EventListParams) ([]*Event, error)
	EventPrune(ctx context.Context, before time.Time) (int64, error)
}

// EventListParams filter EventList. AfterID pages by id.
type EventListParams struct {
	NodeID  string
	AfterID int64
	Limit   int
}

// AuditEntry records a call or an attempt: who did what, from where, and
// how it ended.
type AuditEntry struct {
	ID       int64
	Time     time.Time
	Actor    string
	Action   string
	Resource string
	Outcome  string
	SourceIP string
	Details  []byte // JSON
}

// AuditQueryParams filter AuditQuery. Every filter is optional (zero
// means any) and all apply together.
type AuditQueryParams struct {
	// BeforeID pages: only rows with a lower id (0 starts at the newest).
	BeforeID int64
	// Since and Until bound the row's time: Since <= time < Until.
	Since, Until time.Time
	// Actor, Resource and Outcome match exactly.
	Actor, Resource, Outcome string
	// ActionPrefix matches actions that start with it, byte for byte
	// ("joinTokens." matches joinTokens.create; no wildcards).
	ActionPrefix string
	// Limit is 1 to MaxListLimit; 0 means 100.
	Limit int
}

// AuditStore keeps the audit log.
type AuditStore interface {
	AuditInsert(ctx context.Context, e *AuditEntry) (int64, error)
	// AuditList returns entries after afterID, oldest first.
	AuditList(ctx context.Context, afterID int64, limit int) ([]*AuditEntry, error)
	// AuditQuery returns the entries p selects, newest first (by id).
	AuditQuery(ctx context.Context, p *AuditQueryParams) ([]*AuditEntry, error)
	AuditPrune(ctx context.Context, before time.Time) (int64, error)
}

// PKIBundle is the sealed PKI bundle (DESIGN.md, "PKI").
type PKIBundle struct {
	TrustDomain string
	Sealed      []byte
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// Revocation revokes one certificate serial, optionally naming its node.
type Revocation struct {
	Serial    string
	NodeID    string
	Reason    string
	RevokedAt time.Time
}

// PKIStore keeps the sealed bundle and revocations.
type PKIStore interface {
	// PKIBundleGet returns the bundle; ErrNotFound before pki init.
	PKIBundleGet(ctx context.Context) (*PKIBundle, error)
	// PKIBundleCreate stores the first bundle; ErrConflict if one exists.
	PKIBundleCreate(ctx context.Context, b *PKIBundle) error
	// PKIBundleUpdate replaces the bundle (CA rotation).
	PKIBundleUpdate(ctx context.Context, b *PKIBundle) error
	// RevocationInsert revokes a serial; revoking twice is not an error.
	RevocationInsert(ctx context.Context, r *Revocation) error
	// RevocationList returns revocations made at or after since, oldest
	// first: the revocation feed.
	RevocationList(ctx context.Context, since time.Time) ([]*Revocation, error)
	// RevocationCheck reports whether serial is revoked.
	RevocationCheck(ctx context.Context, serial string) (bool, error)
}

// CAs a PKIRotation rotates.
const (
	// RotationCANode is the node CA.
	RotationCANode = "node"
)

// Phases of a PKIRotation (DESIGN.md, "CA rotation"; docs/pki.md). A
// rotation starts propagating, moves to activated and then retired, or to
// rolled-back from either of the first two.
const (
	RotationPropagating = "propagating" // the new CA is trusted, not issuing; nodes ack its bundle
	RotationActivated   = "activated"   // the new CA issues at each node's next renewal; the old one is trusted
	RotationRetired     = "retired"     // the old CA is out of the serving bundle (re-attestation only)
	RotationRolledBack  = "rolled-back" // the old CA issues again; the new one's certificates verify until renewed
)

// PKIRotation is one rotation of a CA in phases.
type PKIRotation struct {
	ID string
	// CA is the CA rotated: RotationCANode.
	CA string
	// Phase is one of the Rotation* phases.
	Phase string
	// OldCAID and NewCAID are the serials of the old and the new CA
	// certificate (pki.NodeCAID).
	OldCAID, NewCAID string
	// Threshold is the share of live nodes, above 0 and at most 1, whose
	// acknowledgement of the new bundle activates the rotation.
	Threshold float64
	// StartedBy is the actor that started it: "token:<id>" or
	// "reconciler".
	StartedBy    string
	StartedAt    time.Time
	ActivatedAt  *time.Time
	RetiredAt    *time.Time
	RolledBackAt *time.Time
	UpdatedAt    time.Time
}

// PKIRotationCreateParams starts a rotation in the propagating phase.
type PKIRotationCreateParams struct {
	// ID defaults to a new "rot_" id.
	ID               string
	CA               string
	OldCAID, NewCAID string
	Threshold        float64
	StartedBy        string
	Now              *time.Time
}

// PKIRotationSetPhaseParams moves a rotation from one phase to another.
type PKIRotationSetPhaseParams struct {
	ID string
	// From is the phase the rotation must be in; otherwise the move is
	// ErrConflict and nothing changes.
	From, To string
	// Actor and Forced go into the phase's event.
	Actor  string
	Forced bool
	Reason string
	Now    *time.Time
}

// PKIRotationAckCounts is how many live nodes (nodes with an open session)
// acknowledged a rotation's bundle.
type PKIRotationAckCounts struct {
	Live, Acked int
	// Missing lists live nodes that have not acked, by id, at most the
	// limit asked for.
	Missing []string
}

// PKIRotationStore keeps CA rotations and their acknowledgements.
type PKIRotationStore interface {
	// PKIRotationCreate starts a rotation, propagating, and writes its
	// event; ErrConflict while another rotation of the CA is open.
	PKIRotationCreate(ctx context.Context, p *PKIRotationCreateParams) (*PKIRotation, error)
	// PKIRotationLatest returns the CA's latest rotation; ErrNotFound when
	// it was never rotated.
	PKIRotationLatest(ctx context.Context, ca string) (*PKIRotation, error)
	// PKIRotationSetPhase moves a rotation from p.From to p.To, stamps the
	// phase's time and writes its event; ErrConflict when it is not in
	// p.From, ErrNotFound when it does not exist.
	PKIRotationSetPhase(ctx context.Context, p *PKIRotationSetPhaseParams) (*PKIRotation, error)
	// PKIRotationAck records that nodes acknowledged the rotation's bundle;
	// acking twice, or for a node deleted since, is not an error.
	PKIRotationAck(ctx context.Context, rotationID string, nodeIDs []string, now *time.Time) error
	// PKIRotationAckCounts counts the live nodes and those of them that
	// acked, listing at most missingLimit that did not.
	PKIRotationAckCounts(ctx context.Context, rotationID string, missingLimit int) (*PKIRotationAckCounts, error)
	// NodeCertsOffCA counts the nodes whose certificate is valid at now
	// (zero: the database's clock) and was not issued by the node CA caID
	// (NodeUpsertParams.CertCAID, NodeSetCertificateParams.CAID), listing
	// at most limit of them by id.
	NodeCertsOffCA(ctx context.Context, caID string, now *time.Time, limit int) (int, []string, error)
}

// API token roles.
const (
	RoleAdmin    = "admin"
	RoleOperator = "operator"
	RoleViewer   = "viewer"
)

// APIToken is a bearer credential for the API. Only the secret's hash is
// stored.
type APIToken struct {
	ID          string
	Role        string
	Description string
	AllowCIDRs  []string
	ExpiresAt   *time.Time
	RevokedAt   *time.Time
	CreatedAt   time.Time
}

// APITokenStore keeps API tokens.
type APITokenStore interface {
	APITokenCreate(ctx context.Context, t *APIToken, secretHash []byte) error
	// APITokenBySecret returns the token with this secret hash, revoked or
	// expired ones included (the caller decides).
	APITokenBySecret(ctx context.Context, secretHash []byte) (*APIToken, error)
	APITokenList(ctx context.Context, p *ListParams) ([]*APIToken, error)
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

// Secret is a value sealed under the deployment secret for a node or a
// site agent (BMC credentials); the store never sees it in plain text.
type Secret struct {
	Name      string
	NodeID    string
	Sealed    []byte
	CreatedAt time.Time
}

// SecretStore keeps sealed secrets.
type SecretStore interface {
	SecretPut(ctx context.Context, s *Secret) error
	SecretGet(ctx context.Context, name string) (*Secret, error)
	SecretDelete(ctx context.Context, name string) error
}
