package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/healthgate"
)

// Rollout states (DESIGN.md, "Rollouts of bcd"; docs/rollouts.md). A
// rollout is active while pending, running, paused or rolling-back; the
// others end it, but halted, which waits for an operator's abort.
const (
	// RolloutPending: created; no node touched yet.
	RolloutPending = "pending"
	// RolloutRunning: waves in progress.
	RolloutRunning = "running"
	// RolloutPaused: no new node or wave starts; nodes already out finish.
	RolloutPaused = "paused"
	// RolloutRollingBack: a node failed; the wave's upgraded nodes are
	// being rolled back.
	RolloutRollingBack = "rolling-back"
	// RolloutHalted: a node failed and its wave was rolled back; no new
	// wave ever starts. Abort ends it.
	RolloutHalted = "halted"
	// RolloutCompleted: every node is on the new version, or skipped.
	RolloutCompleted = "completed"
	// RolloutAborted: an operator stopped it.
	RolloutAborted = "aborted"
	// RolloutFailed: a rollback failed too; the nodes need a person.
	RolloutFailed = "failed"
)

// RolloutActive reports whether a rollout in state still drives nodes
// (pending, running, paused, rolling-back). A pool has at most one rollout
// that is active or halted.
func RolloutActive(state string) bool {
	switch state {
	case RolloutPending, RolloutRunning, RolloutPaused, RolloutRollingBack:
		return true
	}
	return false
}

// States of a node in a rollout (RolloutNode.State).
const (
	// RolloutNodePending: not upgraded yet (not in a wave, or its wave has
	// not admitted it).
	RolloutNodePending = "pending"
	// RolloutNodeDraining: admitted; its running commands are finishing.
	RolloutNodeDraining = "draining"
	// RolloutNodeUpgrading: the upgrade command is sent; waiting for the
	// node to come back on the new version.
	RolloutNodeUpgrading = "upgrading"
	// RolloutNodeSoaking: back on the new version; must stay healthy for
	// the soak.
	RolloutNodeSoaking = "soaking"
	// RolloutNodeUpgraded: on the new version, soaked: done.
	RolloutNodeUpgraded = "upgraded"
	// RolloutNodeSkipped: offline, held out of service by another owner
	// or still busy at its turn; left on its version and reported.
	RolloutNodeSkipped = "skipped"
	// RolloutNodeFailed: failed its trial, did not come back within the
	// timeout, turned unhealthy during the soak, or its rollback failed.
	RolloutNodeFailed = "failed"
	// RolloutNodeRollingBack: the rollback command is sent.
	RolloutNodeRollingBack = "rolling-back"
	// RolloutNodeRolledBack: back on its previous version.
	RolloutNodeRolledBack = "rolled-back"
)

// RolloutOwnerPrefix prefixes the disruption owner a rollout's nodes are
// held under: "rollout:<id>".
const RolloutOwnerPrefix = "rollout:"

// RolloutOwner is the disruption owner of rollout id's holds.
func RolloutOwner(id string) string { return RolloutOwnerPrefix + id }

// ParseCount checks a rollout size, "N" nodes (at least 1) or "N%" of the
// pool (1 to 100), and returns its canonical form. field names it in the
// error ("wave", "max-unavailable").
func ParseCount(field, spec string) (string, error) {
	s := strings.TrimSpace(spec)
	pct := strings.HasSuffix(s, "%")
	n, err := strconv.Atoi(strings.TrimSuffix(s, "%"))
	switch {
	case err != nil || n < 1:
		return "", fmt.Errorf("%s %q: want a count of nodes (5) or a share of the pool (10%%)", field, spec)
	case pct && n > 100:
		return "", fmt.Errorf("%s %q: a share must be 1%% to 100%%", field, spec)
	}
	if pct {
		return strconv.Itoa(n) + "%", nil
	}
	return strconv.Itoa(n), nil
}

// ResolveCount returns spec (ParseCount's form) against a pool of nodes: N,
// or N% of nodes rounded down, at least one.
func ResolveCount(spec string, nodes int) int {
	if pct, ok := strings.CutSuffix(spec, "%"); ok {
		n, _ := strconv.Atoi(pct)
		return max(1, nodes*n/100)
	}
	n, err := strconv.Atoi(spec)
	if err != nil || n < 1 {
		return 1
	}
	return n
}

// Rollout is a rollout of bcd version Version to the nodes of a pool, in
// waves (migration 0014_rollouts).
type Rollout struct {
	ID     string
	PoolID string
	// Version is the release rolled out; BaseURL the downloads route the
	// nodes fetch it from.
	Version string
	BaseURL string
	// Canary is the first wave's size (nodes).
	Canary int
	// Wave and MaxUnavailable are "N" or "N%" (ParseCount): the size of
	// each later wave, and how many of the rollout's nodes may be out at
	// once (besides the pool's disruption budget).
	Wave           string
	MaxUnavailable string
	// Soak is how long an upgraded node must stay ready; Timeout how long
	// a node has to come back on the new version (and to drain).
	Soak    time.Duration
	Timeout time.Duration
	// Drain waits for the node's running commands before its upgrade.
	Drain bool
	// Bake is how long the rollout keeps watching the nodes it upgraded
	// after its last wave (issue 30; migration 0018_rollout_watch).
	// BakeStartedAt is when that phase began (nil before it); BakeElapsed
	// the bake time counted up to BakeResumedAt, when its clock last
	// started (nil while paused: the clock stops).
	Bake          time.Duration
	BakeStartedAt *time.Time
	BakeElapsed   time.Duration
	BakeResumedAt *time.Time
	// RequireEvidence halts a wave whose health gate is still
	// inconclusive after its extension (migration
	// 0021_rollout_health_gate); Gates are the waves' health gates, by
	// wave (the last one may be extended: no verdict yet).
	RequireEvidence bool
	Gates           []healthgate.Report
	State           string
	// CurrentWave is the wave in progress: 0 before the first (the
	// canary is wave 1).
	CurrentWave int
	// Reason says why the rollout halted, failed or was aborted;
	// FailedNodeID names the node that halted it.
	Reason       string
	FailedNodeID string
	CreatedBy    string
	CreatedAt    time.Time
	UpdatedAt    time.Time
	FinishedAt   *time.Time
}

// Baking reports whether the rollout is in its bake phase.
func (ro *Rollout) Baking() bool { return ro.BakeStartedAt != nil }

// BakeDone is the bake time counted at now: BakeElapsed, plus the time
// since BakeResumedAt while the clock runs.
func (ro *Rollout) BakeDone(now time.Time) time.Duration {
	d := ro.BakeElapsed
	if ro.BakeResumedAt != nil && now.After(*ro.BakeResumedAt) {
		d += now.Sub(*ro.BakeResumedAt)
	}
	return d
}

// RolloutNode is one node of a rollout, with what the reconciler reads of
// the node itself.
type RolloutNode struct {
	RolloutID string
	NodeID    string
	// PreviousVersion is the node's version when its wave began.
	PreviousVersion string
	State           string
	// Wave is the node's wave, 0 until it is in one.
	Wave int
	// UpgradeCommandID and RollbackCommandID are the commands sent (the
	// idempotency keys make a second send return the same one).
	UpgradeCommandID  string
	RollbackCommandID string
	// Reason says why the node was skipped, failed or rolled back, or,
	// while it is pending, what it waits for (a reservation holding it).
	Reason string
	// StateSince is when the node entered State.
	StateSince time.Time
	// The watch of a node the rollout upgraded (migration
	// 0018_rollout_watch): the node's BCDStarts when it came back on the
	// version, the start of the last session the reconciler saw, and the
	// session drops counted since (those after a gateway's drain not).
	WatchStarts      int64
	SeenSessionSince *time.Time
	Drops            int
	// SoakStartedAt is when the node last entered soaking (set by
	// RolloutNodeUpdate): its part of the wave's health-gate window
	// starts there (migration 0021_rollout_health_gate).
	SoakStartedAt *time.Time

	// Read from the node, its session and commands (not stored here):
	Hostname   string
	NodeState  string
	BCDVersion string
	Connected  bool // the node has a session now
	// SessionSince is when its session opened (nil without one);
	// BCDStarts counts its sessions opened without a resume cursor (new
	// bcd processes); ReconnectBy is when a gateway's drain expects it
	// back (nil when never drained).
	SessionSince    *time.Time
	BCDStarts       int64
	ReconnectBy     *time.Time
	Disruption      string
	DisruptionOwner string
	// UpgradeState/UpgradeError and RollbackState/RollbackError are the
	// commands' state and error ("" without one).
	UpgradeState, UpgradeError   string
	RollbackState, RollbackError string
}

// RolloutStore keeps rollouts (package controlplane/reconcilers/rollouts drives them).
type RolloutStore interface {
	// RolloutCreate inserts a rollout of every node of p.PoolID (pending),
	// writing rollout.created. ErrNotFound for an unknown pool;
	// ErrConflict when the pool has a rollout that is active or halted.
	RolloutCreate(ctx context.Context, p *RolloutCreateParams) (*Rollout, error)
	// RolloutGet returns a rollout; ErrNotFound when there is none.
	RolloutGet(ctx context.Context, id string) (*Rollout, error)
	// RolloutList pages rollouts by id; PoolID and Active filter.
	RolloutList(ctx context.Context, p *RolloutListParams) ([]*Rollout, error)
	// RolloutNodes returns a rollout's nodes, by wave then node id, with
	// their live state (one read).
	RolloutNodes(ctx context.Context, rolloutID string) ([]*RolloutNode, error)
	// RolloutUpdate changes a rollout as p says, only while its state is
	// one of p.From (any when empty; ErrConflict otherwise), writing
	// rollout.<state> when the state changes, rollout.wave-completed and
	// rollout.wave-started when the wave moves (and wave-completed when it
	// completes). An operator's pause, resume and abort and the
	// reconciler's moves all go through it.
	RolloutUpdate(ctx context.Context, p *RolloutUpdateParams) (*Rollout, error)
	// RolloutNodeUpdate changes one node of a rollout, writing
	// rollout.node-<state> when its state changes. ErrNotFound when the
	// node is not in the rollout.
	RolloutNodeUpdate(ctx context.Context, p *RolloutNodeUpdateParams) error
	// RolloutsActive returns the rollouts that are active (RolloutActive),
	// by id: what the reconciler reads once a round.
	RolloutsActive(ctx context.Context) ([]*Rollout, error)
	// RolloutHealthCounts counts what a health gate measures over each
	// span: bcd starts and session drops (session_starts, as SessionOpen
	// records them), GPU findings (node events
	// "gpu.*" above severity info), and commands finished and failed
	// (failed, expired or lost), those created by excludeCreatedBy (the
	// rollout's own) not counted. Spans with the same window are counted
	// in one query.
	RolloutHealthCounts(ctx context.Context, spans []HealthSpan, excludeCreatedBy string) (*HealthCounts, error)
	// RolloutPrune deletes the completed, aborted and failed rollouts
	// (with their nodes) finished before before, and returns how many:
	// retention.history.
	RolloutPrune(ctx context.Context, before time.Time) (int64, error)
}

// RolloutCreateParams are RolloutCreate's inputs. ID defaults to a new
// roll_ id.
type RolloutCreateParams struct {
	ID             string
	PoolID         string
	Version        string
	BaseURL        string
	Canary         int
	Wave           string
	MaxUnavailable string
	Soak           time.Duration
	Timeout        time.Duration
	Drain          bool
	// Bake is how long the rollout watches its nodes after the last wave.
	Bake time.Duration
	// RequireEvidence: an inconclusive health gate halts the wave.
	RequireEvidence bool
	CreatedBy       string
	Now             *time.Time
}

// RolloutListParams filter and page RolloutList.
type RolloutListParams struct {
	ListParams
	PoolID string
	// Active keeps the rollouts that are active or halted.
	Active bool
}

// RolloutUpdateParams are RolloutUpdate's inputs; zero fields keep the
// rollout's value.
type RolloutUpdateParams struct {
	ID string
	// From lists the states the rollout may be in; empty: any.
	From []string
	// State is the new state.
	State string
	// Wave, when not nil, moves the rollout to that wave and puts
	// WaveNodes in it (recording each one's version as PreviousVersion).
	Wave      *int
	WaveNodes []string
	// Reason and FailedNodeID are recorded when set.
	Reason       string
	FailedNodeID string
	// StartBake begins the bake phase (its clock runs from Now). A move
	// to paused stops a running bake's clock and a move from paused to
	// running starts it again, whoever makes them.
	StartBake bool
	// Halted names the nodes a halt rolled back or failed, and why, in the
	// rollout.halted (or rollout.failed) event.
	Halted []RolloutHaltedNode
	// Gate, when set, records a wave's health gate, replacing the one of
	// the same wave; the rollout.wave-completed event of that wave carries
	// it.
	Gate *healthgate.Report
	// Actor is recorded in the events (the operator, or "" for the
	// reconciler).
	Actor string
	Now   *time.Time
}

// RolloutNodeUpdateParams are RolloutNodeUpdate's inputs; zero fields
// keep the node's value.
type RolloutNodeUpdateParams struct {
	RolloutID string
	NodeID    string
	State     string
	// Wave, when not nil, is the node's wave.
	Wave              *int
	UpgradeCommandID  string
	RollbackCommandID string
	Reason            string
	// ClearReason empties the node's reason (Reason, when set, is then
	// recorded): a pending node's note of what it waits for ends when it
	// moves on.
	ClearReason bool
	// Watch, when set, records the node's watch (RolloutNode's WatchStarts,
	// SeenSessionSince and Drops).
	Watch *RolloutNodeWatch
	Now   *time.Time
}

// HealthSpan is one node's window of a health gate: [From, To).
type HealthSpan struct {
	NodeID   string
	From, To time.Time
}

// HealthCounts are RolloutHealthCounts' counts, summed over the spans.
type HealthCounts struct {
	Restarts, Drops, Findings int64
	Commands, FailedCommands  int64
}

// RolloutNodeWatch is the watch of a node a rollout upgraded.
type RolloutNodeWatch struct {
	Starts       int64
	SessionSince *time.Time
	Drops        int
}

// RolloutHaltedNode is a node a halted rollout names: what became of it
// and why.
type RolloutHaltedNode struct {
	NodeID   string `json:"nodeId"`
	Hostname string `json:"hostname"`
	Wave     int    `json:"wave"`
	State    string `json:"state"`
	Reason   string `json:"reason,omitempty"`
}
