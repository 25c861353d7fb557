package events

import (
	"encoding/json"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/healthgate"
	eventsv1 "github.com/better-compute/better-compute/proto/events/v1"
	"github.com/better-compute/better-compute/proto/gpufinding"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Event types, as proto/events/v1 declares them (eventsv1, the registry
// of the wire names); each names its data struct here.
const (
	NodeJoined       = eventsv1.NodeJoined       // NodeData: a new node joined with a join token
	NodeRejoined     = eventsv1.NodeRejoined     // NodeData: an existing node joined again (by proof or a reinstall token)
	NodeReady        = eventsv1.NodeReady        // NodeData: the node heartbeats (first connect, or back from unreachable or powered-off)
	NodeUnreachable  = eventsv1.NodeUnreachable  // NodeData: no heartbeat for 3 intervals and no session
	NodeUnresponsive = eventsv1.NodeUnresponsive // NodeData: no heartbeat for 3 intervals while its session is still open
	NodePoweredOff   = eventsv1.NodePoweredOff   // NodeData: its BMC (a power command) says it is off
	NodeClockSkewed  = eventsv1.NodeClockSkewed  // NodeData: its clock is off the gateways' by more than host.gateway.clockSkewLimit: no new commands
	NodeCordoned     = eventsv1.NodeCordoned     // NodeData: no new commands are placed on it
	NodeUncordoned   = eventsv1.NodeUncordoned   // NodeData: schedulable again
	NodeDrained      = eventsv1.NodeDrained      // NodeData: an operator drained it (state draining, cordoned)
	NodeDeleted      = eventsv1.NodeDeleted      // NodeData: removed with its session and commands
	NodeRevoked      = eventsv1.NodeRevoked      // NodeRevokedData: a certificate of the node was revoked
	NodeReattested   = eventsv1.NodeReattested   // NodeCertificateData: a node whose certificate expired proved its key and got a new one
	// NodeDisruptionChanged is DisruptionData: the node left service, came
	// back, or changed why it is out (the disruption budget).
	NodeDisruptionChanged = eventsv1.NodeDisruptionChanged
	// NodeRolledBackLocally is NodeRolledBackLocallyData: bcd restored its
	// previous release by itself after a crash loop (issue 30).
	NodeRolledBackLocally = eventsv1.NodeRolledBackLocally

	GPUHealthChanged = eventsv1.GPUHealthChanged // GPUHealthData: a node reported a GPU event (an XID, uncorrected ECC, a health change)
	// GPUUUIDConflict is GPUUUIDConflictData: another live node lists the
	// same GPU UUID (issue 44); never remediated.
	GPUUUIDConflict = eventsv1.GPUUUIDConflict

	CommandCreated   = eventsv1.CommandCreated   // CommandData: enqueued (one event per command, batch id in the data)
	CommandSucceeded = eventsv1.CommandSucceeded // CommandData: exited 0 (or the kind's success)
	CommandFailed    = eventsv1.CommandFailed    // CommandData: exited non-zero or could not run
	CommandCancelled = eventsv1.CommandCancelled // CommandData: cancelled by an operator
	CommandExpired   = eventsv1.CommandExpired   // CommandData: its deadline passed before it ended
	CommandLost      = eventsv1.CommandLost      // CommandData: its node was without a session too long while it ran

	GatewayUp   = eventsv1.GatewayUp   // GatewayData: a gateway registered
	GatewayDown = eventsv1.GatewayDown // GatewayData: a gateway deregistered, or the reaper found it dead

	JoinTokenCreated   = eventsv1.JoinTokenCreated   // JoinTokenData
	JoinTokenRevoked   = eventsv1.JoinTokenRevoked   // JoinTokenData
	JoinTokenUsed      = eventsv1.JoinTokenUsed      // JoinTokenData: a join consumed one use
	JoinTokenExhausted = eventsv1.JoinTokenExhausted // JoinTokenData: that use was its last (uses = maxUses)
	JoinTokenExpired   = eventsv1.JoinTokenExpired   // JoinTokenData: its TTL passed unrevoked (reported within a minute by the iam role)

	TokenCreated = eventsv1.TokenCreated // TokenData: an API token was created
	TokenRevoked = eventsv1.TokenRevoked // TokenData: an API token was revoked
	// TokenExpiring is TokenData: a live API token expires within
	// iam.TokenExpiryWarning (7 days; written once per token by the
	// iam role).
	TokenExpiring = eventsv1.TokenExpiring

	PKIRotationStarted    = eventsv1.PKIRotationStarted    // PKIRotationData: a CA rotation began: the new CA is trusted, nodes are sent its bundle
	PKIRotationActivated  = eventsv1.PKIRotationActivated  // PKIRotationData: the new CA issues at each node's next renewal (threshold reached, or forced)
	PKIRotationRetired    = eventsv1.PKIRotationRetired    // PKIRotationData: the old CA left the serving bundle
	PKIRotationRolledBack = eventsv1.PKIRotationRolledBack // PKIRotationData: the old CA issues again

	RemediationDetected    = eventsv1.RemediationDetected    // RemediationData: a finding opened a case (the policy acts on it next)
	RemediationHeld        = eventsv1.RemediationHeld        // RemediationData: cordoned but not acted on: the pool's breaker holds it
	RemediationQuarantined = eventsv1.RemediationQuarantined // RemediationData: cordoned and out of service (never blocked by the budget)
	RemediationDraining    = eventsv1.RemediationDraining    // RemediationData: waiting for running commands, then for a remediation slot
	RemediationRemediating = eventsv1.RemediationRemediating // RemediationData: the action's command (gpu.reset, reboot, power.cycle) was enqueued
	RemediationVerifying   = eventsv1.RemediationVerifying   // RemediationData: the action ended; the node's health is read again
	RemediationReturned    = eventsv1.RemediationReturned    // RemediationData: back in service (uncordoned), the case closed
	RemediationEscalated   = eventsv1.RemediationEscalated   // RemediationData: left to a person; the node stays cordoned
	RemediationPaused      = eventsv1.RemediationPaused      // RemediationData: an operator paused the case
	RemediationResumed     = eventsv1.RemediationResumed     // RemediationData: an operator resumed the case

	RemediationBreakerTripped = eventsv1.RemediationBreakerTripped // RemediationBreakerData: more nodes acted on in the window than the breaker admits; new cases are held
	RemediationBreakerReset   = eventsv1.RemediationBreakerReset   // RemediationBreakerData: the pool's breaker closed (an operator, or its window passed)

	RolloutCreated     = eventsv1.RolloutCreated     // RolloutData: rollouts.create; the release verified, no node touched yet
	RolloutStarted     = eventsv1.RolloutStarted     // RolloutData: the reconciler took it up (before the canary wave)
	RolloutPaused      = eventsv1.RolloutPaused      // RolloutData: an operator paused it; nodes already out finish
	RolloutResumed     = eventsv1.RolloutResumed     // RolloutData: an operator resumed it
	RolloutRollingBack = eventsv1.RolloutRollingBack // RolloutData: a node failed (failedNodeId, reason); the wave's upgraded nodes roll back
	RolloutHalted      = eventsv1.RolloutHalted      // RolloutData: the wave is rolled back; no new wave starts
	RolloutCompleted   = eventsv1.RolloutCompleted   // RolloutData: every node on the version, or skipped
	RolloutAborted     = eventsv1.RolloutAborted     // RolloutData: an operator aborted it; its holds released
	RolloutFailed      = eventsv1.RolloutFailed      // RolloutData: a rollback failed too; a person must look

	RolloutWaveStarted   = eventsv1.RolloutWaveStarted   // RolloutWaveData: a wave's nodes were chosen (wave 1 is the canary)
	RolloutWaveCompleted = eventsv1.RolloutWaveCompleted // RolloutWaveData: every node of the wave upgraded or skipped

	RolloutNodeDraining    = eventsv1.RolloutNodeDraining    // RolloutNodeData: admitted; waiting for its running commands
	RolloutNodeUpgrading   = eventsv1.RolloutNodeUpgrading   // RolloutNodeData: the upgrade command was enqueued (commandId)
	RolloutNodeSoaking     = eventsv1.RolloutNodeSoaking     // RolloutNodeData: back on the new version; the soak runs
	RolloutNodeUpgraded    = eventsv1.RolloutNodeUpgraded    // RolloutNodeData: stayed ready for the soak; back in service
	RolloutNodeSkipped     = eventsv1.RolloutNodeSkipped     // RolloutNodeData: offline, held by another owner, or busy past the timeout (reason)
	RolloutNodeFailed      = eventsv1.RolloutNodeFailed      // RolloutNodeData: failed its trial, did not come back, or turned unhealthy (reason)
	RolloutNodeRollingBack = eventsv1.RolloutNodeRollingBack // RolloutNodeData: the rollback command was enqueued (commandId)
	RolloutNodeRolledBack  = eventsv1.RolloutNodeRolledBack  // RolloutNodeData: back on its previous version

	ReservationCreated    = eventsv1.ReservationCreated    // ReservationData: reservations.create; pending until the placer places it
	ReservationPlaced     = eventsv1.ReservationPlaced     // ReservationData: it holds slots (again, on other nodes, when previousNodeIds is set)
	ReservationActive     = eventsv1.ReservationActive     // ReservationData: its window began; its nodes carry its labels
	ReservationEnded      = eventsv1.ReservationEnded      // ReservationData: its window passed; its slots and labels are released
	ReservationCancelled  = eventsv1.ReservationCancelled  // ReservationData: an operator cancelled it
	ReservationFailed     = eventsv1.ReservationFailed     // ReservationData: it could not be placed or re-placed (reason)
	ReservationExtended   = eventsv1.ReservationExtended   // ReservationData: its end moved later
	ReservationNodeFailed = eventsv1.ReservationNodeFailed // ReservationData: a node of the active reservation failed (nodeId, reason); the owner is told, remediation goes ahead

	TunnelOpened = eventsv1.TunnelOpened // TunnelData: a shell or port forward to a node opened (its ticket used)
	TunnelClosed = eventsv1.TunnelClosed // TunnelData: it ended: bytes each way, exit status, reason

	AccessRequested = eventsv1.AccessRequested // AccessData: access.request: a pending request for a requestable policy
	AccessApproved  = eventsv1.AccessApproved  // AccessData: an approver approved it; the policy is granted from start to end
	AccessDenied    = eventsv1.AccessDenied    // AccessData: an approver denied it (note)
	AccessRevoked   = eventsv1.AccessRevoked   // AccessData: the requester or an approver revoked it (note); a granted access ends at once
	AccessEnded     = eventsv1.AccessEnded     // AccessData: an approved request's end passed, or a pending one expired undecided (state expired)
)

// AccessData is the data of the access.* events: an access request as
// the step left it (docs/access.md). It names its tenant (tenantId) and
// no pool or node, so its events are its tenant's (docs/tenants.md,
// "Events").
type AccessData struct {
	RequestID string `json:"requestId"`
	TenantID  string `json:"tenantId"`
	// Requester is the requester's identity ("user:<subject>" or
	// "token:<id>"), RequesterName how it is shown.
	Requester     string `json:"requester"`
	RequesterName string `json:"requesterName,omitempty"`
	Policy        string `json:"policy"`
	// Resource is the request's scope, "pool:<id>", "site:<id>",
	// "node:<id>" or "tenant:<id>"; empty for none.
	Resource string `json:"resource,omitempty"`
	// State is after the step; PreviousState before it.
	State         string `json:"state"`
	PreviousState string `json:"previousState,omitempty"`
	// DurationSeconds is how long the access lasts once approved.
	DurationSeconds int64  `json:"durationSeconds"`
	Reason          string `json:"reason"`
	// Start and End bound the granted access (approved and after).
	Start *time.Time `json:"start,omitempty"`
	End   *time.Time `json:"end,omitempty"`
	// DecidedBy is the identity that approved, denied or revoked it.
	DecidedBy string `json:"decidedBy,omitempty"`
	// Note is the denial's or revocation's reason.
	Note string `json:"note,omitempty"`
}

// TunnelData is the data of tunnel.* events (docs/tunnels.md).
type TunnelData struct {
	TunnelID  string `json:"tunnelId"`
	NodeID    string `json:"nodeId"`
	Kind      string `json:"kind"`
	Port      int    `json:"port,omitempty"`
	AsRoot    bool   `json:"asRoot,omitempty"`
	CreatedBy string `json:"createdBy"`
	GatewayID string `json:"gatewayId,omitempty"`
	// BytesIn and BytesOut (tunnel.closed) are the data bytes from the
	// client to the node and back.
	BytesIn  int64 `json:"bytesIn,omitempty"`
	BytesOut int64 `json:"bytesOut,omitempty"`
	// ExitCode (tunnel.closed, kind shell) is the shell's exit status.
	ExitCode *int32 `json:"exitCode,omitempty"`
	Signal   string `json:"signal,omitempty"`
	Reason   string `json:"reason,omitempty"`
}

// NodeData is the data of the node.* events but node.revoked and
// node.reattested: the node as the change left it.
type NodeData struct {
	NodeID   string `json:"nodeId"`
	PoolID   string `json:"poolId"`
	Hostname string `json:"hostname"`
	// State is the node's state after the change: joined, ready,
	// unreachable, powered-off or draining ("" for node.deleted).
	State string `json:"state,omitempty"`
	// PreviousState is its state before, when the change moved it.
	PreviousState string `json:"previousState,omitempty"`
	Cordoned      bool   `json:"cordoned"`
	// JoinTokenID is the token of node.joined and node.rejoined.
	JoinTokenID string `json:"joinTokenId,omitempty"`
}

// DisruptionData is node.disruption-changed's data: the node's hold on its
// pool's disruption budget as the change left it, and the pool's count.
type DisruptionData struct {
	NodeID string `json:"nodeId"`
	PoolID string `json:"poolId"`
	// Disruption is why the node is out of service now (quarantined,
	// draining, remediating, verifying, upgrading), "" when back in service.
	Disruption         string `json:"disruption"`
	PreviousDisruption string `json:"previousDisruption"`
	// Owner holds (or, when back in service, held) the slot, for example
	// "rollout:rol_..." or "remediation:rem_...".
	Owner string `json:"owner"`
	// OutOfService and Budget are the pool's count after the change and
	// its budget (nodes).
	OutOfService int `json:"outOfService"`
	Budget       int `json:"budget"`
}

// NodeRevokedData is node.revoked's data.
type NodeRevokedData struct {
	NodeID string `json:"nodeId"`
	// Serial is the revoked certificate's serial (hex).
	Serial string `json:"serial"`
	// Reason is why, such as "node deleted" or "reinstalled".
	Reason string `json:"reason"`
}

// GPUUUIDConflictData is gpu.uuid-conflict's data: node NodeID's
// inventory lists GPU GPUUUID while live node OtherNodeID's does too. One
// event is written for each of the two nodes (its subject); neither stay
// is merged into the other, and no remediation acts on it
// (docs/remediation.md, "A history that follows the board").
type GPUUUIDConflictData struct {
	NodeID        string `json:"nodeId"`
	PoolID        string `json:"poolId"`
	Hostname      string `json:"hostname"`
	GPUUUID       string `json:"gpuUuid"`
	BoardSerial   string `json:"boardSerial,omitempty"`
	OtherNodeID   string `json:"otherNodeId"`
	OtherHostname string `json:"otherHostname"`
}

// NodeRolledBackLocallyData is node.rolled-back-locally's data: what bcd
// reported in Hello (sessionv1.LocalRollback) after it restored its
// previous release on its own.
type NodeRolledBackLocallyData struct {
	NodeID   string `json:"nodeId"`
	PoolID   string `json:"poolId"`
	Hostname string `json:"hostname"`
	// FromVersion is the release that crash-looped; ToVersion the one
	// restored ("" when the node did not know it).
	FromVersion string `json:"fromVersion"`
	ToVersion   string `json:"toVersion,omitempty"`
	// Reason is bcd's one line, such as "3 starts of 0.2.0 ended in an
	// exit within 10m0s of the upgrade".
	Reason string `json:"reason"`
	// Starts is how many starts of FromVersion ended in an exit.
	Starts int `json:"starts"`
	// RolledBackAt is when bcd restored ToVersion, by the node's clock.
	RolledBackAt time.Time `json:"rolledBackAt"`
}

// NodeCertificateData is node.reattested's data.
type NodeCertificateData struct {
	NodeID   string    `json:"nodeId"`
	Serial   string    `json:"serial"`
	NotAfter time.Time `json:"notAfter"`
}

// GPUHealthData is gpu.health-changed's data; the event's subject is the
// GPU's UUID (the node's id when the node named no GPU).
type GPUHealthData struct {
	NodeID  string `json:"nodeId"`
	GPUUUID string `json:"gpuUuid,omitempty"`
	// Kind is the node's event kind: "gpu.xid", "gpu.ecc.uncorrected",
	// "gpu.health", ...
	Kind string `json:"kind"`
	// Severity is info, warning, error or critical.
	Severity string `json:"severity"`
	Message  string `json:"message,omitempty"`
	// XID is NVIDIA's XID error code when the event is one (79: fallen off
	// the bus), else absent.
	XID int `json:"xid,omitempty"`
	// XIDMnemonic is NVIDIA's name of XID from the catalogue the node
	// classifies with ("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS"); absent
	// when there is no XID or the catalogue does not list it.
	XIDMnemonic string `json:"xidMnemonic,omitempty"`
	// Resolution is what the node says the event calls for: NVIDIA's
	// immediate resolution ("IGNORE", "RESTART_APP", "RESET_GPU",
	// "RESTART_BM", ...) or "ESCALATE" (docs/gpu-health.md); absent when
	// the node named none.
	Resolution string `json:"resolution,omitempty"`
	// Finding is the node's typed finding as stored (the protojson of a
	// session.v1 GPUFinding: GPU, signal, NVIDIA's resolutions, health,
	// evidence, time observed; docs/gpu-findings.md). Read it with
	// GPUFinding. The fields above repeat parts of it for readers that
	// predate it.
	Finding json.RawMessage `json:"finding,omitempty"`
}

// GPUFinding returns d's finding (gpufinding.Decode); a finding made of the
// fields above when d has none (an event written before the typed
// finding).
func (d GPUHealthData) GPUFinding() (*sessionv1.GPUFinding, error) {
	if len(d.Finding) == 0 {
		l := gpufinding.Legacy{Kind: d.Kind, GPUUUID: d.GPUUUID, XID: uint32(max(d.XID, 0)), XIDMnemonic: d.XIDMnemonic,
			Resolution: d.Resolution, Message: d.Message}
		return l.Finding(), nil
	}
	return gpufinding.Decode(d.Kind, d.Finding)
}

// CommandData is the data of the command.* events; never the output.
type CommandData struct {
	CommandID string `json:"commandId"`
	NodeID    string `json:"nodeId"`
	Kind      string `json:"kind"`
	BatchID   string `json:"batchId"`
	// State is the command's state after the change.
	State     string `json:"state"`
	CreatedBy string `json:"createdBy,omitempty"`
	// ExitCode is the process's exit code, on terminal events that have one.
	ExitCode *int `json:"exitCode,omitempty"`
	// Error says why a failed, expired or lost command ended.
	Error string `json:"error,omitempty"`
}

// GatewayData is the data of the gateway.* events.
type GatewayData struct {
	GatewayID string `json:"gatewayId"`
	Region    string `json:"region,omitempty"`
	Address   string `json:"address,omitempty"`
	Version   string `json:"version,omitempty"`
	// Reason of gateway.down: "deregistered" (it shut down) or "lease
	// expired" (the reaper closed its sessions).
	Reason string `json:"reason,omitempty"`
}

// PKIRotationData is the data of the pki.rotation-* events; the subject
// is the rotation's id, so its phases are delivered in order.
type PKIRotationData struct {
	RotationID string `json:"rotationId"`
	// CA is the CA rotated: "node".
	CA            string `json:"ca"`
	Phase         string `json:"phase"`
	PreviousPhase string `json:"previousPhase,omitempty"`
	// OldCAID and NewCAID are the serials of the old and the new CA
	// certificate.
	OldCAID string `json:"oldCaId"`
	NewCAID string `json:"newCaId"`
	// Actor is "token:<id>" for an operator's command, "reconciler" for
	// the rotation reconciler.
	Actor string `json:"actor,omitempty"`
	// Forced is set when advance --force moved on before the phase's
	// condition held.
	Forced bool   `json:"forced,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// JoinTokenData is the data of the join-token.* events; never the secret.
type JoinTokenData struct {
	TokenID   string    `json:"tokenId"`
	PoolID    string    `json:"poolId"`
	Uses      int       `json:"uses"`
	MaxUses   int       `json:"maxUses"`
	ExpiresAt time.Time `json:"expiresAt"`
	// NodeID is set on a token made by nodes reinstall.
	NodeID string `json:"nodeId,omitempty"`
}

// TokenData is the data of the token.* events (API tokens); never the
// secret.
type TokenData struct {
	TokenID     string     `json:"tokenId"`
	Role        string     `json:"role,omitempty"`
	Description string     `json:"description,omitempty"`
	ExpiresAt   *time.Time `json:"expiresAt,omitempty"`
}

// RemediationData is the data of the remediation.* events but the
// breaker's; the event's subject is the node's id, so a node's steps are
// delivered in order.
type RemediationData struct {
	RemediationID string `json:"remediationId"`
	NodeID        string `json:"nodeId"`
	PoolID        string `json:"poolId"`
	// State is the case's state after the move; PreviousState before it.
	State         string `json:"state"`
	PreviousState string `json:"previousState,omitempty"`
	// Finding is what was found ("xid", "ecc-uncorrected", "gpu-lost",
	// "row-remap-failure", "unresponsive", ...), Resolution NVIDIA's
	// resolution or the node's judgement it came with.
	Finding     string `json:"finding"`
	Resolution  string `json:"resolution,omitempty"`
	XID         int    `json:"xid,omitempty"`
	XIDMnemonic string `json:"xidMnemonic,omitempty"`
	GPUUUID     string `json:"gpuUuid,omitempty"`
	// Action is the policy's action: cordon, gpu.reset, reboot,
	// power-cycle or escalate.
	Action   string `json:"action"`
	Attempts int    `json:"attempts"`
	// CommandID is the current action's command, when one was enqueued.
	CommandID string `json:"commandId,omitempty"`
	Reason    string `json:"reason,omitempty"`
	Paused    bool   `json:"paused"`
	// History lists, newest first, the prior cases a repeat rule counted
	// when it held the node for a person (reason "repeated: ..."); absent
	// otherwise.
	History []RemediationPrior `json:"history,omitempty"`
}

// RemediationPrior is one prior case in RemediationData.History.
type RemediationPrior struct {
	RemediationID string `json:"remediationId"`
	State         string `json:"state"`
	Finding       string `json:"finding"`
	Resolution    string `json:"resolution,omitempty"`
	XID           int    `json:"xid,omitempty"`
	GPUUUID       string `json:"gpuUuid,omitempty"`
	// Action is the case's last action; Actions how many action commands
	// it enqueued.
	Action    string     `json:"action"`
	Actions   int        `json:"actions"`
	CreatedAt time.Time  `json:"createdAt"`
	ClosedAt  *time.Time `json:"closedAt,omitempty"`
}

// RemediationBreakerData is the data of remediation.breaker-tripped and
// remediation.breaker-reset; the subject is the pool's id.
type RemediationBreakerData struct {
	PoolID string `json:"poolId"`
	// Quarantines counted in the window when it tripped; Limit and
	// WindowSeconds the configured breaker.
	Quarantines   int    `json:"quarantines,omitempty"`
	Limit         int    `json:"limit,omitempty"`
	WindowSeconds int64  `json:"windowSeconds,omitempty"`
	ResetBy       string `json:"resetBy,omitempty"`
}

// RolloutData is the data of the rollout.* events that tell the rollout's
// state; the subject of every rollout.* event is the rollout's id, so its
// steps are delivered in order.
type RolloutData struct {
	RolloutID string `json:"rolloutId"`
	PoolID    string `json:"poolId"`
	Version   string `json:"version"`
	// State is the rollout's state after the change; PreviousState before.
	State         string `json:"state"`
	PreviousState string `json:"previousState,omitempty"`
	// Wave is the wave in progress (1 is the canary; 0 before it).
	Wave int `json:"wave"`
	// Reason and FailedNodeID say why it halted, failed or was aborted.
	Reason       string `json:"reason,omitempty"`
	FailedNodeID string `json:"failedNodeId,omitempty"`
	// Actor is the operator of pause, resume and abort.
	Actor string `json:"actor,omitempty"`
	// Nodes (rollout.halted, rollout.failed) names every node the halt
	// rolled back or failed, and why (issue 30).
	Nodes []RolloutHaltedNodeData `json:"nodes,omitempty"`
}

// RolloutHaltedNodeData is a node a halted rollout names.
type RolloutHaltedNodeData struct {
	NodeID   string `json:"nodeId"`
	Hostname string `json:"hostname"`
	Wave     int    `json:"wave"`
	// State is rolled-back or failed; Reason why it failed, or why it was
	// rolled back.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
}

// RolloutWaveData is the data of rollout.wave-started and
// rollout.wave-completed.
type RolloutWaveData struct {
	RolloutID string `json:"rolloutId"`
	PoolID    string `json:"poolId"`
	Version   string `json:"version"`
	Wave      int    `json:"wave"`
	Canary    bool   `json:"canary"`
	// NodeIDs are the wave's nodes.
	NodeIDs []string `json:"nodeIds"`
	// HealthGate is the wave's health gate (rollout.wave-completed of a
	// wave that upgraded nodes): both groups' figures and the verdict
	// (docs/rollouts.md, "Health gate").
	HealthGate *healthgate.Report `json:"healthGate,omitempty"`
}

// RolloutNodeData is the data of the rollout.node-* events: one node's step.
type RolloutNodeData struct {
	RolloutID string `json:"rolloutId"`
	NodeID    string `json:"nodeId"`
	Version   string `json:"version"`
	// PreviousVersion is the node's version before its wave.
	PreviousVersion string `json:"previousVersion,omitempty"`
	State           string `json:"state"`
	Wave            int    `json:"wave"`
	// CommandID is the upgrade (or rollback) command, when one was sent.
	CommandID string `json:"commandId,omitempty"`
	Reason    string `json:"reason,omitempty"`
}

// TypeInfo describes one event type.
type TypeInfo struct {
	// Type is the full type name.
	Type string
	// Data is a zero value of the type's data struct.
	Data any
}

// Types lists every event type this build writes, in docs/events.md's
// order.
var Types = []TypeInfo{
	{NodeJoined, NodeData{}}, {NodeRejoined, NodeData{}}, {NodeReady, NodeData{}},
	{NodeUnreachable, NodeData{}}, {NodeUnresponsive, NodeData{}}, {NodePoweredOff, NodeData{}}, {NodeClockSkewed, NodeData{}},
	{NodeCordoned, NodeData{}}, {NodeUncordoned, NodeData{}}, {NodeDrained, NodeData{}}, {NodeDeleted, NodeData{}},
	{NodeRevoked, NodeRevokedData{}}, {NodeReattested, NodeCertificateData{}},
	{NodeDisruptionChanged, DisruptionData{}},
	{NodeRolledBackLocally, NodeRolledBackLocallyData{}},
	{GPUHealthChanged, GPUHealthData{}},
	{GPUUUIDConflict, GPUUUIDConflictData{}},
	{CommandCreated, CommandData{}}, {CommandSucceeded, CommandData{}}, {CommandFailed, CommandData{}},
	{CommandCancelled, CommandData{}}, {CommandExpired, CommandData{}}, {CommandLost, CommandData{}},
	{GatewayUp, GatewayData{}}, {GatewayDown, GatewayData{}},
	{JoinTokenCreated, JoinTokenData{}}, {JoinTokenRevoked, JoinTokenData{}}, {JoinTokenUsed, JoinTokenData{}},
	{JoinTokenExhausted, JoinTokenData{}}, {JoinTokenExpired, JoinTokenData{}},
	{TokenCreated, TokenData{}}, {TokenRevoked, TokenData{}}, {TokenExpiring, TokenData{}},
	{PKIRotationStarted, PKIRotationData{}}, {PKIRotationActivated, PKIRotationData{}},
	{PKIRotationRetired, PKIRotationData{}}, {PKIRotationRolledBack, PKIRotationData{}},
	{RemediationDetected, RemediationData{}}, {RemediationHeld, RemediationData{}},
	{RemediationQuarantined, RemediationData{}}, {RemediationDraining, RemediationData{}},
	{RemediationRemediating, RemediationData{}}, {RemediationVerifying, RemediationData{}},
	{RemediationReturned, RemediationData{}}, {RemediationEscalated, RemediationData{}},
	{RemediationPaused, RemediationData{}}, {RemediationResumed, RemediationData{}},
	{RemediationBreakerTripped, RemediationBreakerData{}}, {RemediationBreakerReset, RemediationBreakerData{}},
	{RolloutCreated, RolloutData{}}, {RolloutStarted, RolloutData{}}, {RolloutPaused, RolloutData{}},
	{RolloutResumed, RolloutData{}}, {RolloutRollingBack, RolloutData{}}, {RolloutHalted, RolloutData{}},
	{RolloutCompleted, RolloutData{}}, {RolloutAborted, RolloutData{}}, {RolloutFailed, RolloutData{}},
	{RolloutWaveStarted, RolloutWaveData{}}, {RolloutWaveCompleted, RolloutWaveData{}},
	{RolloutNodeDraining, RolloutNodeData{}}, {RolloutNodeUpgrading, RolloutNodeData{}},
	{RolloutNodeSoaking, RolloutNodeData{}}, {RolloutNodeUpgraded, RolloutNodeData{}},
	{RolloutNodeSkipped, RolloutNodeData{}}, {RolloutNodeFailed, RolloutNodeData{}},
	{RolloutNodeRollingBack, RolloutNodeData{}}, {RolloutNodeRolledBack, RolloutNodeData{}},
	{ReservationCreated, ReservationData{}}, {ReservationPlaced, ReservationData{}}, {ReservationActive, ReservationData{}},
	{ReservationEnded, ReservationData{}}, {ReservationCancelled, ReservationData{}}, {ReservationFailed, ReservationData{}},
	{ReservationExtended, ReservationData{}}, {ReservationNodeFailed, ReservationData{}},
	{TunnelOpened, TunnelData{}}, {TunnelClosed, TunnelData{}},
	{AccessRequested, AccessData{}}, {AccessApproved, AccessData{}}, {AccessDenied, AccessData{}},
	{AccessRevoked, AccessData{}}, {AccessEnded, AccessData{}},
}

// CommandTerminal returns the type of the event a command ending in state
// writes ("" for a state that is not terminal).
func CommandTerminal(state string) string {
	switch state {
	case "succeeded":
		return CommandSucceeded
	case "failed":
		return CommandFailed
	case "cancelled":
		return CommandCancelled
	case "expired":
		return CommandExpired
	case "lost":
		return CommandLost
	}
	return ""
}

// ReservationData is the data of the reservation.* events: the
// reservation as the change left it (docs/reservations.md).
type ReservationData struct {
	ReservationID string `json:"reservationId"`
	PoolID        string `json:"poolId"`
	// Owner is who the reservation is for: the one to tell
	// (reservation.node-failed names it).
	Owner string `json:"owner"`
	// State is after the change; PreviousState before it.
	State         string `json:"state"`
	PreviousState string `json:"previousState,omitempty"`
	// GPUs or Nodes is what it asked for.
	GPUs  int       `json:"gpus,omitempty"`
	Nodes int       `json:"nodes,omitempty"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// NodeIDs are the nodes it holds after the change; PreviousNodeIDs
	// those it held before a move (reservation.placed after a swap).
	NodeIDs         []string `json:"nodeIds,omitempty"`
	PreviousNodeIDs []string `json:"previousNodeIds,omitempty"`
	// NodeID is the failed node of reservation.node-failed.
	NodeID string `json:"nodeId,omitempty"`
	// Reason says why it failed, was cancelled, moved, or why a node
	// failed.
	Reason string `json:"reason,omitempty"`
	// TenantID is the holder and Grants the rights it gives the holder
	// on NodeIDs (docs/reservations.md, "Access from reservations"):
	// they begin with reservation.activated and end with
	// reservation.ended or reservation.cancelled.
	TenantID string   `json:"tenantId,omitempty"`
	Grants   []string `json:"grants,omitempty"`
}
