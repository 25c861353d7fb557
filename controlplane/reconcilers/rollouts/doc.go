// Package rollouts is the rollout reconciler: it moves the nodes of a pool
// to a bcd release in waves (DESIGN.md, "Rollouts of bcd"; issue 20;
// docs/rollouts.md).
//
// A rollout is a row (store.Rollout) with one row per node of its pool
// (store.RolloutNode), made by the API's rollouts.create once the release
// verified against the configured pins. The reconciler runs on the
// controllers role under the shard leases: the holder of shard
// store.ShardOf(rollout id) drives it, every write in a transaction fenced
// on that lease, so a worker killed mid-wave loses nothing and the next
// holder carries on from the rows. A round reads the active rollouts once
// (Due); each is then read whole (its nodes with their live state,
// one query) and written only where something is due.
//
// # Waves
//
// Wave 1 is the canary (Canary nodes, default 1, chosen among the nodes
// that are connected and ready), then waves of Wave nodes ("N" or "N%" of
// the pool). Within a wave a node is taken out of service only when the
// pool's disruption budget admits it (store.DisruptionAdmit, owner
// "rollout:<id>": every node out counts, whatever holds it) and fewer than
// MaxUnavailable of the rollout's nodes are out. A node that is offline, or
// held out of service by another owner (a quarantine), when its turn comes
// is skipped and reported, never waited for.
//
// A node's steps: draining (with Drain, its running commands finish; one
// still busy after Timeout is skipped), upgrading (the "upgrade" command,
// idempotency key rollout:<id>:upgrade, its id recorded in the node's row in
// the same transaction: a second worker finds it and never sends another),
// soaking (its upgrade command succeeded, which the restarted bcd reports,
// and it reconnected with the new version; it must stay connected and
// ready, with no GPU failed in its inventory and not quarantined, for
// Soak), upgraded (its hold released). Without
// Drain the commands still running when the upgrade is sent are finished
// as failed, "ended by the restart of bcd".
//
// # Halting
//
// A node whose upgrade command fails (its trial failed: bcd restored the
// previous release itself), that does not come back on the new version
// within Timeout, that turns unhealthy during its soak, or that runs its
// previous release again without a rollback command (bcd rolled itself
// back after a crash loop, issue 30: failed, nothing to send it) halts the
// rollout (state rolling-back; the rollout names the node and why). Every
// node the rollout upgraded, of every wave, the failed one included when it
// runs the new version, is sent "rollback" (rollout:<id>:rollback): bcd
// restores the release it kept beside the current one, no download. Nodes
// not yet out are left alone. Once every one is back on
// its previous version the rollout is halted (failed when a rollback
// failed too) and never starts another wave; abort ends it.
//
// # Watching, and the bake (issue 30)
//
// Every node the rollout upgraded stays watched until the rollout ends:
// one of any earlier wave that restarts bcd (a session opened without a
// resume cursor since it came back on the version), leaves ready, is
// quarantined, runs another version, or drops its session more than
// maxDrops times (new sessions after a gateway's drain, by
// nodes.reconnect_by, not counted) halts the rollout; the halt then rolls
// back every node the rollout upgraded, of every wave, each taking a slot
// of the pool's budget again when it is back in service, and the
// rollout.halted event names each node and why. After the last wave the
// rollout bakes for Bake (store.Rollout's bake fields: the phase and the
// time counted survive a restart, and the clock stops while paused) before
// it completes.
//
// # Health gate (issue 30)
//
// When every node of a wave is upgraded, the wave's upgraded nodes are
// compared with the pool's connected nodes not yet upgraded over the
// wave's soak (when none remain, with the same nodes over an equal window
// before their upgrade): bcd restarts and session drops per node-hour,
// GPU findings per GPU-hour, failed commands per command, counted by
// store.RolloutHealthCounts from the session starts, node events and
// commands the store keeps (gate.go). Package healthgate decides: halt (the rollout rolls
// back every node it upgraded), pass (the next wave starts), or
// inconclusive (too few node-hours): the soak is extended once by Soak,
// then the wave advances, or halts with RequireEvidence. Each wave's
// report is kept in the rollout (store.Rollout.Gates) and carried by its
// rollout.wave-completed event.
package rollouts
