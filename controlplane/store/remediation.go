package store

import (
	"context"
	"time"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Remediation states (DESIGN.md, "GPU health and closed-loop remediation").
// A case opens detected, is held while its pool's breaker is tripped, and
// moves quarantined → draining → remediating → verifying → returned, or to
// escalated (a person's turn; the node stays cordoned). Returned and
// resolved cases are closed; every other state is open.
const (
	RemediationDetected    = "detected"    // recorded, not acted on yet
	RemediationHeld        = "held"        // the pool's breaker is tripped: recorded and evented, not acted on
	RemediationQuarantined = "quarantined" // cordoned, out of service (disruption quarantined)
	RemediationDraining    = "draining"    // running commands finishing; waits here for a remediation slot
	RemediationRemediating = "remediating" // the action's command runs (disruption remediating)
	RemediationVerifying   = "verifying"   // the node's health is read again (disruption verifying)
	RemediationReturned    = "returned"    // back in service (closed)
	RemediationEscalated   = "escalated"   // left to a person, still cordoned (open until returned)
)

// RemediationOpenStates are the states of an open case.
var RemediationOpenStates = []string{RemediationDetected, RemediationHeld, RemediationQuarantined,
	RemediationDraining, RemediationRemediating, RemediationVerifying, RemediationEscalated}

// RemediationFinding is a node event that carries a resolution (NVIDIA's
// for an XID, else the node's health judgement): the remediation
// reconciler's input. EventInsert writes one in the event's transaction
// when the event's GPUFinding names a resolution.
type RemediationFinding struct {
	ID          int64
	NodeID      string
	Shard       int
	Kind        string // the node event's kind: "gpu.xid", "gpu.ecc.uncorrected", ...
	Severity    string
	Resolution  string // "IGNORE", "RESTART_APP", "RESET_GPU", "RESTART_BM", "ESCALATE", ...
	XID         int
	XIDMnemonic string
	GPUUUID     string
	Message     string
	EventID     int64
	CreatedAt   time.Time
	// GPUFinding is the typed finding as the node sent it, read from the
	// event's payload (gpufinding.Decode, which also reads the payload
	// shape gateways wrote before it); made of the fields above when the
	// event is gone. Never nil from RemediationFindingsTake.
	GPUFinding *sessionv1.GPUFinding
}

// Remediation is one node's case.
type Remediation struct {
	ID     string // "rem_..."
	NodeID string
	PoolID string
	Shard  int
	State  string // a Remediation* state
	// Finding names what was found: "xid", "ecc-uncorrected",
	// "row-remap-failure", "gpu-lost", "unresponsive", ... (remediation
	// package).
	Finding     string
	Kind        string
	Resolution  string
	XID         int
	XIDMnemonic string
	GPUUUID     string
	Message     string
	// Action is the policy's action now being taken: "cordon",
	// "gpu.reset", "reboot", "power-cycle" or "escalate".
	Action   string
	Attempts int
	// CommandID is the command of the current attempt ("" before one);
	// CommandIDs every command the case enqueued, oldest first.
	CommandID  string
	CommandIDs []string
	// BootID is the node's boot id when the current action started.
	BootID string
	Paused bool
	// Reason says why the last move was made (an escalation's cause, a
	// refusal, an operator's note).
	Reason        string
	NextAt        time.Time // not advanced before
	StateSince    time.Time
	QuarantinedAt *time.Time
	CreatedAt     time.Time
	UpdatedAt     time.Time
	ClosedAt      *time.Time
}

// RemediationBreaker is a pool's circuit breaker.
type RemediationBreaker struct {
	PoolID    string
	TrippedAt *time.Time // set while tripped
	ResetAt   *time.Time
	ResetBy   string
}

// RemediationStore keeps remediation cases, their findings inbox and the
// pools' breakers. Every change of a case writes its event
// (com.better-compute.remediation.<state>) and an audit row in its
// transaction.
type RemediationStore interface {
	// RemediationFindingsTake returns up to limit findings of shard, oldest
	// first, and deletes them: call it in the transaction (under the
	// shard's fence) that acts on them.
	RemediationFindingsTake(ctx context.Context, shard, limit int) ([]*RemediationFinding, error)
	// RemediationDue returns, with one read, those of shards (ascending)
	// that have a finding waiting or an open, unpaused case whose NextAt
	// has come (by now; nil: the database's clock).
	RemediationDue(ctx context.Context, shards []int, now *time.Time) ([]int, error)
	// RemediationCreate opens a case (ID, State, NextAt... as given; ID
	// made when empty). ErrConflict when the node has an open case.
	RemediationCreate(ctx context.Context, r *Remediation, actor string) (*Remediation, error)
	// RemediationGet returns a case; ErrNotFound when none.
	RemediationGet(ctx context.Context, id string) (*Remediation, error)
	// RemediationOpenFor returns the node's open case; ErrNotFound when
	// none.
	RemediationOpenFor(ctx context.Context, nodeID string) (*Remediation, error)
	// RemediationRecent returns node nodeID's cases (open and closed)
	// created at or after since, newest first, at most limit (0: the
	// default page): the memory the repeat rules read (remediation
	// package), kept in the database so it survives every restart.
	RemediationRecent(ctx context.Context, nodeID string, since time.Time, limit int) ([]*Remediation, error)
	// RemediationOpenInShard returns the open cases of shard whose NextAt
	// has come (paused ones too when withPaused), oldest first.
	RemediationOpenInShard(ctx context.Context, shard int, now *time.Time, withPaused bool) ([]*Remediation, error)
	// RemediationList returns cases by id, paged by the last id (Cursor).
	RemediationList(ctx context.Context, p *RemediationListParams) ([]*Remediation, error)
	// RemediationMove changes a case that is in p.From (any open state
	// when empty) to p.To with the given fields, and writes the move's
	// event and audit row. ErrNotFound when the case is not there or not
	// in From (another worker moved it).
	RemediationMove(ctx context.Context, p *RemediationMoveParams) (*Remediation, error)
	// RemediationSetPaused pauses or resumes an open case (audited,
	// evented). ErrNotFound when no open case has id.
	RemediationSetPaused(ctx context.Context, id string, paused bool, actor string) (*Remediation, error)
	// RemediationBreakerAdmit decides, locking the pool's row so shards
	// never overrun it together, whether one more quarantine may start in
	// poolID: refused while the breaker is tripped; the quarantine that
	// would make more than limit quarantines within window (counted since
	// the later of now-window and the last reset) trips it (and writes
	// remediation.breaker-tripped). An admitted quarantine is counted when
	// the case is moved to quarantined.
	RemediationBreakerAdmit(ctx context.Context, p *RemediationBreakerAdmitParams) (admitted, tripped bool, err error)
	// RemediationBreakerReset resets a pool's breaker (audited, evented
	// remediation.breaker-reset); quarantines before it no longer count.
	// ErrNotFound for an unknown pool.
	RemediationBreakerReset(ctx context.Context, poolID, actor string, now *time.Time) (*RemediationBreaker, error)
	// RemediationBreakers returns the breakers of pools that have one
	// (tripped or reset at least once), by pool id.
	RemediationBreakers(ctx context.Context) ([]*RemediationBreaker, error)
	// RemediationSilentDue returns those of shards (ascending) that hold a
	// node silent past the liveness window (state unreachable) with sealed
	// BMC credentials (secret bmc/<id>) and no open case: its BMC is to be
	// asked through its site's agent.
	RemediationSilentDue(ctx context.Context, shards []int) ([]int, error)
	// RemediationSilentNodes returns shard's nodes RemediationSilentDue
	// counts, by id.
	RemediationSilentNodes(ctx context.Context, shard int) ([]string, error)
	// SecretGrant lets node NodeID open secret Name once, for CommandID,
	// until ExpiresAt (a BMC agent driving another node's BMC).
	SecretGrant(ctx context.Context, p *SecretGrantParams) error
	// SecretGrantTake uses up one unexpired grant of name to nodeID; false
	// when there is none.
	SecretGrantTake(ctx context.Context, name, nodeID string, now *time.Time) (bool, error)
	// RemediationPrune deletes the closed (returned) cases closed before
	// before, and returns how many: retention.history.
	RemediationPrune(ctx context.Context, before time.Time) (int64, error)
}

// SecretGrantParams are SecretGrant's inputs.
type SecretGrantParams struct {
	Name      string
	NodeID    string
	CommandID string
	ExpiresAt time.Time
}

// RemediationListParams filter RemediationList.
type RemediationListParams struct {
	ListParams
	NodeID string
	PoolID string
	State  string
	// OpenOnly lists only open cases.
	OpenOnly bool
}

// RemediationMoveParams are RemediationMove's inputs. Zero fields keep the
// case's value but for those marked.
type RemediationMoveParams struct {
	ID   string
	From []string // the states it may be in; none: any open state
	To   string
	// Action and Finding, when set, replace the case's.
	Action  string
	Finding string
	// Attempts, when not nil, replaces the count.
	Attempts *int
	// CommandID, when set, becomes the current command and is appended to
	// CommandIDs.
	CommandID string
	// BootID, when set, replaces the recorded boot id.
	BootID string
	// ClearCommand empties the current command (CommandIDs kept).
	ClearCommand bool
	Reason       string
	// NextAt is when the case may next be advanced; nil: now.
	NextAt *time.Time
	// Paused, when not nil, sets the pause flag.
	Paused *bool
	// History, the prior cases a repeat rule counted, goes into the move's
	// event (RemediationData.History) and audit row; it is not stored on
	// the case.
	History []*Remediation
	// Actor is the audit row's actor ("remediation:<worker>" or
	// "token:<id>").
	Actor string
	Now   *time.Time
}

// RemediationBreakerAdmitParams are RemediationBreakerAdmit's inputs.
type RemediationBreakerAdmitParams struct {
	PoolID string
	// Limit is the most quarantines within Window (at least 1).
	Limit  int
	Window time.Duration
	Now    *time.Time
}
