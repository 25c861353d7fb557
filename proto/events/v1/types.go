package eventsv1

// TypePrefix begins every event type: "com.better-compute.<object>.<what>".
const TypePrefix = "com.better-compute."

// Event types: TypePrefix + "<object>.<what>", the "type" of the control
// plane's CloudEvents (docs/events.md). These constants are the one
// definition of the wire names; package controlplane/pkg/events writes them
// and names each one's data struct.
const (
	NodeJoined       = TypePrefix + "node.joined"       // NodeData: a new node joined with a join token
	NodeRejoined     = TypePrefix + "node.rejoined"     // NodeData: an existing node joined again (by proof or a reinstall token)
	NodeReady        = TypePrefix + "node.ready"        // NodeData: the node heartbeats (first connect, or back from unreachable or powered-off)
	NodeUnreachable  = TypePrefix + "node.unreachable"  // NodeData: no heartbeat for 3 intervals and no session
	NodeUnresponsive = TypePrefix + "node.unresponsive" // NodeData: no heartbeat for 3 intervals while its session is still open
	NodePoweredOff   = TypePrefix + "node.powered-off"  // NodeData: its BMC (a power command) says it is off
	NodeClockSkewed  = TypePrefix + "node.clock-skewed" // NodeData: its clock is off the gateways' by more than host.gateway.clockSkewLimit: no new commands
	NodeCordoned     = TypePrefix + "node.cordoned"     // NodeData: no new commands are placed on it
	NodeUncordoned   = TypePrefix + "node.uncordoned"   // NodeData: schedulable again
	NodeDrained      = TypePrefix + "node.drained"      // NodeData: an operator drained it (state draining, cordoned)
	NodeDeleted      = TypePrefix + "node.deleted"      // NodeData: removed with its session and commands
	NodeRevoked      = TypePrefix + "node.revoked"      // NodeRevokedData: a certificate of the node was revoked
	NodeReattested   = TypePrefix + "node.reattested"   // NodeCertificateData: a node whose certificate expired proved its key and got a new one
	// NodeDisruptionChanged is DisruptionData: the node left service, came
	// back, or changed why it is out (the disruption budget).
	NodeDisruptionChanged = TypePrefix + "node.disruption-changed"
	// NodeRolledBackLocally is NodeRolledBackLocallyData: bcd restored its
	// previous release by itself after the one an upgrade installed
	// crash-looped (reported in the next Hello).
	NodeRolledBackLocally = TypePrefix + "node.rolled-back-locally"

	GPUHealthChanged = TypePrefix + "gpu.health-changed" // GPUHealthData: a node reported a GPU event (an XID, uncorrected ECC, a health change)
	// GPUUUIDConflict is GPUUUIDConflictData: a GPU UUID that another live
	// node's inventory lists too (a copied image or a simulator bug),
	// written for each of the two nodes; never remediated.
	GPUUUIDConflict = TypePrefix + "gpu.uuid-conflict"

	CommandCreated   = TypePrefix + "command.created"   // CommandData: enqueued (one event per command, batch id in the data)
	CommandSucceeded = TypePrefix + "command.succeeded" // CommandData: exited 0 (or the kind's success)
	CommandFailed    = TypePrefix + "command.failed"    // CommandData: exited non-zero or could not run
	CommandCancelled = TypePrefix + "command.cancelled" // CommandData: cancelled by an operator
	CommandExpired   = TypePrefix + "command.expired"   // CommandData: its deadline passed before it ended
	CommandLost      = TypePrefix + "command.lost"      // CommandData: its node was without a session too long while it ran

	GatewayUp   = TypePrefix + "gateway.up"   // GatewayData: a gateway registered
	GatewayDown = TypePrefix + "gateway.down" // GatewayData: a gateway deregistered, or the reaper found it dead

	JoinTokenCreated   = TypePrefix + "join-token.created"   // JoinTokenData
	JoinTokenRevoked   = TypePrefix + "join-token.revoked"   // JoinTokenData
	JoinTokenUsed      = TypePrefix + "join-token.used"      // JoinTokenData: a join consumed one use
	JoinTokenExhausted = TypePrefix + "join-token.exhausted" // JoinTokenData: that use was its last (uses = maxUses)
	JoinTokenExpired   = TypePrefix + "join-token.expired"   // JoinTokenData: its TTL passed unrevoked (reported within a minute by the iam role)

	TokenCreated = TypePrefix + "token.created" // TokenData: an API token was created
	TokenRevoked = TypePrefix + "token.revoked" // TokenData: an API token was revoked
	// TokenExpiring is TokenData: a live API token expires within 7 days
	// (written once per token by the iam role, checked every minute).
	TokenExpiring = TypePrefix + "token.expiring"

	PKIRotationStarted    = TypePrefix + "pki.rotation-started"     // PKIRotationData: a CA rotation began: the new CA is trusted, nodes are sent its bundle
	PKIRotationActivated  = TypePrefix + "pki.rotation-activated"   // PKIRotationData: the new CA issues at each node's next renewal (threshold reached, or forced)
	PKIRotationRetired    = TypePrefix + "pki.rotation-retired"     // PKIRotationData: the old CA left the serving bundle
	PKIRotationRolledBack = TypePrefix + "pki.rotation-rolled-back" // PKIRotationData: the old CA issues again

	RemediationDetected    = TypePrefix + "remediation.detected"    // RemediationData: a finding opened a case (the policy acts on it next)
	RemediationHeld        = TypePrefix + "remediation.held"        // RemediationData: recorded but not acted on: the pool's breaker is tripped
	RemediationQuarantined = TypePrefix + "remediation.quarantined" // RemediationData: cordoned and out of service (never blocked by the budget)
	RemediationDraining    = TypePrefix + "remediation.draining"    // RemediationData: waiting for running commands, then for a remediation slot
	RemediationRemediating = TypePrefix + "remediation.remediating" // RemediationData: the action's command (gpu.reset, reboot, power.cycle) was enqueued
	RemediationVerifying   = TypePrefix + "remediation.verifying"   // RemediationData: the action ended; the node's health is read again
	RemediationReturned    = TypePrefix + "remediation.returned"    // RemediationData: back in service (uncordoned), the case closed
	RemediationEscalated   = TypePrefix + "remediation.escalated"   // RemediationData: left to a person; the node stays cordoned
	RemediationPaused      = TypePrefix + "remediation.paused"      // RemediationData: an operator paused the case
	RemediationResumed     = TypePrefix + "remediation.resumed"     // RemediationData: an operator resumed the case

	RemediationBreakerTripped = TypePrefix + "remediation.breaker-tripped" // RemediationBreakerData: too many quarantines in the window; nothing new starts
	RemediationBreakerReset   = TypePrefix + "remediation.breaker-reset"   // RemediationBreakerData: an operator reset the pool's breaker

	RolloutCreated     = TypePrefix + "rollout.created"      // RolloutData: rollouts.create; the release verified, no node touched yet
	RolloutStarted     = TypePrefix + "rollout.started"      // RolloutData: the reconciler took it up (before the canary wave)
	RolloutPaused      = TypePrefix + "rollout.paused"       // RolloutData: an operator paused it; nodes already out finish
	RolloutResumed     = TypePrefix + "rollout.resumed"      // RolloutData: an operator resumed it
	RolloutRollingBack = TypePrefix + "rollout.rolling-back" // RolloutData: a node failed (failedNodeId, reason); the wave's upgraded nodes roll back
	RolloutHalted      = TypePrefix + "rollout.halted"       // RolloutData: the wave is rolled back; no new wave starts
	RolloutCompleted   = TypePrefix + "rollout.completed"    // RolloutData: every node on the version, or skipped
	RolloutAborted     = TypePrefix + "rollout.aborted"      // RolloutData: an operator aborted it; its holds released
	RolloutFailed      = TypePrefix + "rollout.failed"       // RolloutData: a rollback failed too; a person must look

	RolloutWaveStarted   = TypePrefix + "rollout.wave-started"   // RolloutWaveData: a wave's nodes were chosen (wave 1 is the canary)
	RolloutWaveCompleted = TypePrefix + "rollout.wave-completed" // RolloutWaveData: every node of the wave upgraded or skipped

	RolloutNodeDraining    = TypePrefix + "rollout.node-draining"     // RolloutNodeData: admitted; waiting for its running commands
	RolloutNodeUpgrading   = TypePrefix + "rollout.node-upgrading"    // RolloutNodeData: the upgrade command was enqueued (commandId)
	RolloutNodeSoaking     = TypePrefix + "rollout.node-soaking"      // RolloutNodeData: back on the new version; the soak runs
	RolloutNodeUpgraded    = TypePrefix + "rollout.node-upgraded"     // RolloutNodeData: stayed ready for the soak; back in service
	RolloutNodeSkipped     = TypePrefix + "rollout.node-skipped"      // RolloutNodeData: offline, held by another owner, or busy past the timeout (reason)
	RolloutNodeFailed      = TypePrefix + "rollout.node-failed"       // RolloutNodeData: failed its trial, did not come back, or turned unhealthy (reason)
	RolloutNodeRollingBack = TypePrefix + "rollout.node-rolling-back" // RolloutNodeData: the rollback command was enqueued (commandId)
	RolloutNodeRolledBack  = TypePrefix + "rollout.node-rolled-back"  // RolloutNodeData: back on its previous version

	ReservationCreated    = TypePrefix + "reservation.created"     // ReservationData: reservations.create; pending until the placer places it
	ReservationPlaced     = TypePrefix + "reservation.placed"      // ReservationData: it holds slots (again, on other nodes, when previousNodeIds is set)
	ReservationActive     = TypePrefix + "reservation.active"      // ReservationData: its window began; its nodes carry its labels
	ReservationEnded      = TypePrefix + "reservation.ended"       // ReservationData: its window passed; its slots and labels are released
	ReservationCancelled  = TypePrefix + "reservation.cancelled"   // ReservationData: an operator cancelled it
	ReservationFailed     = TypePrefix + "reservation.failed"      // ReservationData: it could not be placed or re-placed (reason)
	ReservationExtended   = TypePrefix + "reservation.extended"    // ReservationData: its end moved later
	ReservationNodeFailed = TypePrefix + "reservation.node-failed" // ReservationData: a node of the active reservation failed (nodeId, reason); the owner is told, remediation goes ahead

	TunnelOpened = TypePrefix + "tunnel.opened" // TunnelData: a shell or port forward to a node opened (its ticket used)
	TunnelClosed = TypePrefix + "tunnel.closed" // TunnelData: it ended: bytes each way, exit status, reason

	AccessRequested = TypePrefix + "access.requested" // AccessData: access.request: a pending request for a requestable policy
	AccessApproved  = TypePrefix + "access.approved"  // AccessData: an approver approved it; the policy is granted from start to end
	AccessDenied    = TypePrefix + "access.denied"    // AccessData: an approver denied it (note)
	AccessRevoked   = TypePrefix + "access.revoked"   // AccessData: the requester or an approver revoked it (note); a granted access ends at once
	AccessEnded     = TypePrefix + "access.ended"     // AccessData: an approved request's end passed, or a pending one expired undecided (state expired)
)

// Types lists every event type, in docs/events.md's order: the registry
// the events package, the outbox and docs/events.md are checked against.
var Types = []string{
	NodeJoined, NodeRejoined, NodeReady, NodeUnreachable, NodeUnresponsive, NodePoweredOff, NodeClockSkewed, NodeCordoned,
	NodeUncordoned, NodeDrained, NodeDeleted, NodeRevoked, NodeReattested, NodeDisruptionChanged,
	NodeRolledBackLocally, GPUHealthChanged, GPUUUIDConflict, CommandCreated, CommandSucceeded, CommandFailed, CommandCancelled, CommandExpired,
	CommandLost, GatewayUp, GatewayDown, JoinTokenCreated, JoinTokenRevoked, JoinTokenUsed, JoinTokenExhausted,
	JoinTokenExpired, TokenCreated, TokenRevoked, TokenExpiring, PKIRotationStarted, PKIRotationActivated,
	PKIRotationRetired, PKIRotationRolledBack, RemediationDetected, RemediationHeld, RemediationQuarantined,
	RemediationDraining, RemediationRemediating, RemediationVerifying, RemediationReturned,
	RemediationEscalated, RemediationPaused, RemediationResumed, RemediationBreakerTripped,
	RemediationBreakerReset, RolloutCreated, RolloutStarted, RolloutPaused, RolloutResumed, RolloutRollingBack,
	RolloutHalted, RolloutCompleted, RolloutAborted, RolloutFailed, RolloutWaveStarted, RolloutWaveCompleted,
	RolloutNodeDraining, RolloutNodeUpgrading, RolloutNodeSoaking, RolloutNodeUpgraded, RolloutNodeSkipped,
	RolloutNodeFailed, RolloutNodeRollingBack, RolloutNodeRolledBack, ReservationCreated, ReservationPlaced,
	ReservationActive, ReservationEnded, ReservationCancelled, ReservationFailed, ReservationExtended,
	ReservationNodeFailed, TunnelOpened, TunnelClosed, AccessRequested, AccessApproved, AccessDenied, AccessRevoked,
	AccessEnded,
}
