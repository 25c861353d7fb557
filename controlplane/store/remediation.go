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

// FindingOrdered is the finding of a case an operator ordered
// (nodes.gpuReset, nodes.reboot): a repair, not an incident, so the
// remediation figures and the GPU incident counts leave it out.
const FindingOrdered = "operator"

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
	// never overrun it together, whether one more node may be acted on in
	// poolID: refused while the breaker is tripped (a breaker tripped
	// Window ago or more closes first, evented remediation.breaker-reset
	// by "window"); the node that would make more than the limit of
	// distinct nodes acted on within window (counted since the later of
	// now-window and the last reset) trips it (and writes
	// remediation.breaker-tripped). An admitted node is counted when its
	// case is moved to quarantined.
	RemediationBreakerAdmit(ctx context.Context, p *RemediationBreakerAdmitParams) (admitted, tripped bool, err error)
	// RemediationBreakerReset resets a pool's breaker (audited, evented
	// remediation.breaker-reset); quarantines before it no longer count.
	// ErrNotFound for an unknown pool.
	RemediationBreakerReset(ctx context.Context, poolID, actor string, now *time.Time) (*RemediationBreaker, error)
	// RemediationBreakers returns the breakers of pools that have one
	// (tripped or reset at least once), by pool id.
	RemediationBreakers(ctx context.Context) ([]*RemediationBreaker, error)
	// PoolGPUNodes counts the pool's nodes whose inventory lists a GPU
	// (what the breaker's share is of).
	PoolGPUNodes(ctx context.Context, poolID string) (int, error)
	// RemediationBreakerStates returns every pool's breaker by pool id,
	// with the nodes acted on within window before now (nil: the
	// process's clock), its GPU nodes and held cases.
	RemediationBreakerStates(ctx context.Context, window time.Duration, now *time.Time) ([]*RemediationBreakerState, error)
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
	// before and the kept findings (GPUFindingRecord) taken before it, and
	// returns how many: retention.history.
	RemediationPrune(ctx context.Context, before time.Time) (int64, error)
	// RemediationFindingKeep keeps a finding the reconciler took, with
	// what it made of it (migration 0020, table gpu_findings): call it in
	// the transaction that takes the finding. ID is set.
	RemediationFindingKeep(ctx context.Context, r *GPUFindingRecord) error
	// RemediationFindingCount counts the kept findings of GPU gpuUUID on
	// node nodeID of kind kind and XID code xid (0: not an XID) taken
	// after since (strictly): the memory of codes that do not act.
	RemediationFindingCount(ctx context.Context, nodeID, gpuUUID, kind string, xid int, since time.Time) (int, error)
	// RemediationHistory returns a node's or a GPU's memory: its kept
	// findings, its cases and their actions, newest first, and its
	// findings counted per GPU and code (issue 32; `remediation
	// history`). An error when p names neither a node nor a GPU.
	RemediationHistory(ctx context.Context, p *RemediationHistoryParams) (*RemediationHistory, error)
}

// Outcomes of a kept finding (GPUFindingRecord.Outcome): what the
// remediation reconciler made of it.
const (
	FindingOutcomeNone     = "none"      // the policy's action is none: the event was the whole answer
	FindingOutcomeOpened   = "opened"    // it opened case RemediationID
	FindingOutcomeHeld     = "held"      // it opened case RemediationID held for a person (a repeat rule)
	FindingOutcomeJoined   = "joined"    // the node's open case RemediationID was under way: it added nothing
	FindingOutcomeFailed   = "failed"    // it failed the verification of case RemediationID (the case's GPU)
	FindingOutcomeOtherGPU = "other-gpu" // on another GPU than verifying case RemediationID: read again when that ends
)

// GPUFindingRecord is a finding as the reconciler took it, kept per node
// and per GPU.
type GPUFindingRecord struct {
	ID          int64
	NodeID      string
	GPUUUID     string // "" when the finding names no GPU
	BoardSerial string // NVML's board serial, "" when it gives none
	Kind        string // the node event's kind: "gpu.xid", ...
	Severity    string
	// Resolution is the one acted on; Investigatory the catalogue's
	// investigatory resolution ("CONTACT_SUPPORT", ...; "" for none).
	Resolution    string
	Investigatory string
	XID           int
	XIDMnemonic   string
	Message       string
	EventID       int64
	// Outcome is a FindingOutcome*; RemediationID the case it opened,
	// joined or failed ("" for none).
	Outcome       string
	RemediationID string
	CreatedAt     time.Time // when the node event was stored
	TakenAt       time.Time // when the reconciler took it (its clock)
}

// RemediationHistoryParams select RemediationHistory: a node, a GPU (by
// UUID, on whichever node it was), or both (that GPU on that node).
type RemediationHistoryParams struct {
	NodeID  string
	GPUUUID string
	// Since, when not zero, leaves out what came before it.
	Since time.Time
	// Limit bounds each list: 1 to MaxListLimit; 0 means 100.
	Limit int
}

// RemediationHistory is a node's or a GPU's memory, each list newest
// first.
type RemediationHistory struct {
	Findings []*GPUFindingRecord
	// Cases are the node's cases (a GPU's: those naming it).
	Cases []*Remediation
	// Actions are the cases' commands (gpu.reset, reboot, power.cycle).
	Actions []*RemediationAction
	// Counts are the kept findings counted per GPU and code, the most
	// first: how often a code that does not act came back.
	Counts []*GPUFindingCount
}

// RemediationAction is one command a case enqueued.
type RemediationAction struct {
	RemediationID string
	CommandID     string
	NodeID        string
	GPUUUID       string
	Kind          string // "gpu.reset", "reboot", "power.cycle"; "" once the command is pruned
	State         string // the command's state; "" once it is pruned
	CreatedAt     time.Time
	FinishedAt    *time.Time
}

// GPUFindingCount counts one GPU's kept findings of one code.
type GPUFindingCount struct {
	NodeID      string
	GPUUUID     string
	Kind        string
	XID         int
	XIDMnemonic string
	Resolution  string
	Count       int
	First, Last time.Time // taken
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
	// Action, Finding and GPUUUID, when set, replace the case's.
	Action  string
	Finding string
	GPUUUID string
	// Attempts, when not nil, replaces the count.
	Attempts *int
	// CommandID, when set, becomes the current command and is appended to
	// CommandIDs, unless Check.
	CommandID string
	// Check marks CommandID as a check of the repair (a gpu.diag before
	// return), not an action: it becomes the current command without
	// joining CommandIDs, which hold the actions the repeat rules count.
	Check bool
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
	// Limit is the most distinct nodes acted on within Window (at least
	// 1), used when LimitFor is nil.
	Limit int
	// LimitFor, when set, gives the limit for the pool's count of GPU
	// nodes (nodes whose inventory lists a GPU), read under the pool's
	// lock (config.RemediationBreaker.Limit).
	LimitFor func(gpuNodes int) int
	// Window is the sliding window; a tripped breaker closes by itself
	// Window after it tripped.
	Window time.Duration
	// NodeID, when set, is the node to act on: a node already acted on
	// within the window counts once (it is admitted again).
	NodeID string
	// CaseID and CreatedAt, when set, name the case asking: the pool's
	// older held cases go first (it is refused, without tripping, while
	// they would fill what is left).
	CaseID    string
	CreatedAt time.Time
	Now       *time.Time
}

// RemediationBreakerState is a pool's breaker as it stands: every pool has
// one from its creation.
type RemediationBreakerState struct {
	RemediationBreaker
	// Acted counts the distinct nodes acted on (moved to quarantined)
	// within the window since the later of its start and the last reset.
	Acted int
	// GPUNodes counts the pool's nodes whose inventory lists a GPU.
	GPUNodes int
	// Held counts the pool's open cases in state held.
	Held int
}
