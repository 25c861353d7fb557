// Package remediation is the closed-loop remediation reconciler (DESIGN.md,
// "GPU health and closed-loop remediation"; docs/remediation.md). It runs
// in the controllers role shard by shard under the shard leases, like
// controlplane/reconcilers/liveness: a round reads once which held shards have work
// (a finding waiting in the store's inbox, or an open case whose time has
// come) and opens fenced write transactions only for those.
//
// A finding is a node event that carries a resolution: NVIDIA's immediate
// resolution of an XID as the node classified it with the XID catalogue,
// or the node's own health judgement (ECC past its threshold, a row remap
// failure, a lost GPU). The store records it in the event's transaction
// (store.RemediationFinding); the reconciler of the node's shard takes it,
// and the Policy maps it to an action. An action of none ends there (the
// event was the whole answer). Any other opens the node's case, which
// moves, each move an event and an audit row written in its transaction:
//
//	detected ─▶ quarantined ─▶ draining ─▶ remediating ─▶ verifying ─▶ returned
//	   │  ▲          │                          │             │
//	   ▼  │          └──▶ escalated ◀───────────┴─────────────┘ (attempts spent)
//	  held (breaker tripped)
//
// Quarantine cordons the node and takes a disruption hold with reason
// quarantined (store.DisruptionAdmit; the budget never refuses it), but
// only while the pool's circuit breaker admits it: at most
// max(remediation.breaker.minNodes, remediation.breaker.share of the
// pool's GPU nodes) distinct nodes acted on within the sliding
// remediation.breaker.window (capped by .quarantines when set); the next
// trips the breaker, and until it closes (by itself a window after the
// trip, or reset by an operator) new cases are held: the node is still
// cordoned and quarantined, nothing else is done, and the held cases are
// acted on in the order they opened once it closes. Draining waits for
// the node's running commands (or the drain timeout) and then for one of
// the pool's remediation slots: the hold moves to remediating only while
// fewer than the pool's remediation concurrency are (checked by DisruptionAdmit in a
// transaction that locks the pool's row). The action is a command with
// the idempotency key remediation:<case>:<attempt>, enqueued in the same
// transaction as the move to remediating, so a worker killed at any point
// and another resuming from the recorded state never enqueue it twice.
// Verifying waits for the node to be ready again (after a reboot or power
// cycle, with a new boot id), its GPUs not failed, the case's own GPU ok
// (not degraded either) and no new finding, for
// remediation.verifySettle; then the node is uncordoned and released. A
// failed action moves up the ladder (gpu.reset, reboot, BMC power cycle)
// until remediation.maxAttempts, then the case is escalated: the node
// stays cordoned and quarantined until an operator returns it.
//
// An operator's ordered repair (nodes.gpuReset, nodes.reboot, or
// remediation return --reset-gpu / --reboot) is a case the API opens or
// moves to draining with the node admitted against the pool's disruption
// budget; the reconciler carries it out from there like its own. Stats
// gives each pool's figures (time to quarantine, to return, between
// incidents) from the cases kept.
package remediation
