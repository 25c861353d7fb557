// Package placer is the capacity placer, capacity.placer (DESIGN.md,
// "Scheduler: reservations and the capacity placer"; docs/reservations.md):
// the scheduler role's reconciler that gives pending reservations GPUs,
// swaps a placed reservation off a node that turned unhealthy before its
// start, and moves reservations placed → active at their start and active
// → ended at their end.
//
// It runs under the scheduler role's own shard membership (Shards
// scheduler-shard:<n> leases split among the live processes running the
// scheduler role, package shard): a pool belongs to shard
// store.ShardOf(pool id) mod Shards, so several scheduler processes split
// the pools and a pool is placed by one process at a time. Every write of
// a round goes through the shard's fence. The database, not the fence, is
// what keeps a GPU from being booked twice (store.ReservationStore).
//
// Placement (Fit) is best fit: a request for N GPUs goes to the one node
// with the fewest free matching GPUs that still has N, so that whole free
// nodes stay free for large requests; when no single node has N free and N
// is a multiple of a node's GPU count, it takes N/count whole free nodes of
// that count; a request for K nodes takes K whole free nodes, those with
// the fewest GPUs first. GPU facts (model, memory, health, UUID) come from
// the node inventories (package inventory).
package placer
