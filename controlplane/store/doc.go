// Package store is the seam between the control plane and its database, the
// only source of truth (DESIGN.md, "Storage").
//
// The package defines the records the control plane keeps, the parameter
// structs of every operation and the [Store] interface. Two backends implement
// it with the same SQL: store/sqlite (the embedded default, pure Go) and
// store/postgres (pgx v5, any number of processes). One conformance suite,
// store/storetest, runs against both.
//
// Conventions shared by every method:
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
