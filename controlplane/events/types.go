package events

import "time"

// Event types: TypePrefix + "<object>.<what>". Each names its data struct.
const (
	NodeJoined       = TypePrefix + "node.joined"       // NodeData: a new node joined with a join token
	NodeRejoined     = TypePrefix + "node.rejoined"     // NodeData: an existing node joined again (by proof or a reinstall token)
	NodeReady        = TypePrefix + "node.ready"        // NodeData: the node heartbeats (first connect, or back from unreachable or powered-off)
	NodeUnreachable  = TypePrefix + "node.unreachable"  // NodeData: no heartbeat for 3 intervals and no session
	NodeUnresponsive = TypePrefix + "node.unresponsive" // NodeData: no heartbeat for 3 intervals while its session is still open
	NodePoweredOff   = TypePrefix + "node.powered-off"  // NodeData: its BMC (a power command) says it is off
	NodeCordoned     = TypePrefix + "node.cordoned"     // NodeData: no new commands are placed on it
	NodeUncordoned   = TypePrefix + "node.uncordoned"   // NodeData: schedulable again
	NodeDrained      = TypePrefix + "node.drained"      // NodeData: an operator drained it (state draining, cordoned)
	NodeDeleted      = TypePrefix + "node.deleted"      // NodeData: removed with its session and commands
	NodeRevoked      = TypePrefix + "node.revoked"      // NodeRevokedData: a certificate of the node was revoked
	NodeReattested   = TypePrefix + "node.reattested"   // NodeCertificateData: a node whose certificate expired proved its key and got a new one
	// NodeDisruptionChanged is DisruptionData: the node left service, came
	// back, or changed why it is out (the disruption budget).
	NodeDisruptionChanged = TypePrefix + "node.disruption-changed"

	GPUHealthChanged = TypePrefix + "gpu.health-changed" // GPUHealthData: a node reported a GPU event (an XID, uncorrected ECC, a health change)

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
)

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
	{NodeUnreachable, NodeData{}}, {NodeUnresponsive, NodeData{}}, {NodePoweredOff, NodeData{}},
	{NodeCordoned, NodeData{}}, {NodeUncordoned, NodeData{}}, {NodeDrained, NodeData{}}, {NodeDeleted, NodeData{}},
	{NodeRevoked, NodeRevokedData{}}, {NodeReattested, NodeCertificateData{}},
	{NodeDisruptionChanged, DisruptionData{}},
	{GPUHealthChanged, GPUHealthData{}},
	{CommandCreated, CommandData{}}, {CommandSucceeded, CommandData{}}, {CommandFailed, CommandData{}},
	{CommandCancelled, CommandData{}}, {CommandExpired, CommandData{}}, {CommandLost, CommandData{}},
	{GatewayUp, GatewayData{}}, {GatewayDown, GatewayData{}},
	{JoinTokenCreated, JoinTokenData{}}, {JoinTokenRevoked, JoinTokenData{}}, {JoinTokenUsed, JoinTokenData{}},
	{JoinTokenExhausted, JoinTokenData{}}, {JoinTokenExpired, JoinTokenData{}},
	{TokenCreated, TokenData{}}, {TokenRevoked, TokenData{}},
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
