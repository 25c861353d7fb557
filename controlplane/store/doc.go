// Package store is the seam between the control plane and its database, the
// only source of truth (DESIGN.md, "Storage").
//
// The package defines the records the control plane keeps, the parameter
// structs of every operation and the [Store] interface. Two backends implement
// it with the same SQL: store/sqlite (the embedded default, pure Go) and
// store/postgres (pgx v5, any number of processes). One conformance suite,
// store/storetest, runs against both.
//
// # Domains
//
// [Store] is the composition of one small interface per domain, each in its
// own file with its records and params: [NodeStore] (node.go), [CommandStore]
// (command.go), [SessionStore] (session.go), [GatewayStore], [ProcessStore] and
// [WorkerStore], [LeaseStore], [SiteStore] and [PoolStore], [JoinTokenStore],
// [PKIStore], [APITokenStore], [SecretStore], [EventStore], [AuditStore],
// [OutboxStore], [DeadLetterStore], [DisruptionStore], [ReservationStore],
// [RemediationStore], [RolloutStore], [GPUStore], [TunnelStore] and
// [Migrator], plus the transaction runners [Transactor] and
// [FencedTransactor]. A new table gets its methods in its domain's file (or a
// new one) and its cases in storetest, on both backends, in the same change.
//
// # Who holds what
//
// Only composition roots hold a whole [Store]: controlplane/serve, the CLI's
// store commands (controlplane/cmd/better-compute), controlplane/pkg/bootstrap,
// controlplane/doctor, controlplane/compute (the embedded control plane, which
// runs serve on it), this package with its subpackages, and the programs
// under tests/bench. Every other package declares, where it consumes it, the
// small interface it needs: single methods, or the domain interfaces above
// composed (the api package's Store is the widest).
//
// # Transactions
//
// A transaction's callback receives exactly what it touches, never the whole
// store. The consumer declares that interface beside the transaction, embeds
// [Transactor] or [FencedTransactor] in its store interface, and runs the
// transaction with [InTx] or [InFencedTx]:
//
//	// Store is what the reconciler needs.
//	type Store interface {
//		store.FencedTransactor
//		NodeLivenessDue(ctx context.Context, p *store.NodeLivenessDueParams) ([]int, error)
//	}
//
//	// livenessTx is what a shard's liveness transaction touches.
//	type livenessTx interface {
//		NodeLivenessReconcile(ctx context.Context, p *store.NodeLivenessParams) (unreachable, ready []string, err error)
//	}
//
//	err := store.InFencedTx(ctx, r.store, fence, func(tx livenessTx) error {
//		unreachable, ready, err = tx.NodeLivenessReconcile(ctx, p)
//		return err
//	})
//
// Helpers called inside the transaction take the same interface or a smaller
// one. Method signatures are copied from this package's interfaces, so
// [Store] implements every such interface; a backend that did not would make
// InTx return an error, never panic. tests/storeseam_test.go checks, over the
// production code (tests may hold the real store to build fixtures): that no
// package outside the roots names [Store], that no transaction callback's
// interface has more than 20 methods, and that [Store] implements every
// InTx/InFencedTx type argument. docs/store.md says the same for
// contributors.
//
// # Conventions shared by every method
//
//   - Methods are noun-first (NodeUpsert, LeaseAcquire) and take a params
//     struct when they take more than an id.
//   - Backend errors are translated at the boundary: a missing row is
//     [ErrNotFound], a unique violation [ErrConflict]; driver errors never leak.
//   - Time used by SQL is injectable: params carry Now *time.Time and SQL uses
//     coalesce(Now, the database clock). With Now nil the database's clock
//     decides expiry, never the caller's.
//   - Timestamps are UTC: timestamptz on PostgreSQL, microseconds since the
//     Unix epoch on SQLite.
package store
