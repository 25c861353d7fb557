// Package transfer moves a deployment's whole database at once, for the
// operator commands that may touch it directly (DESIGN.md, "Operator CLI"
// and "Growing from one machine to many"):
//
//   - Copy (better-compute store copy) copies the embedded SQLite database
//     of a stopped deployment into an empty PostgreSQL database: it
//     migrates the target, copies every table in the order of its foreign
//     keys in batches (COPY), moves the identity sequences past the copied
//     ids, and verifies each table's row count and checksum before it
//     commits, all in one transaction, so that an interrupted copy leaves
//     the target as it was.
//   - Backup writes the embedded database, while it is in use, into one
//     file with a manifest (version, schema, time, checksums); Unpack
//     reads it back and checks it against the manifest (better-compute
//     backup and restore).
//
// Both backends hold one schema (the migrations in store/sqlite and
// store/postgres, numbered alike); they differ only in how values are
// typed: timestamps are integer microseconds on SQLite and timestamptz on
// PostgreSQL, booleans 0/1 and boolean, JSON text and jsonb, blobs blob and
// bytea. The tables and their columns are read from the schemas
// themselves, so a new table is copied without a change here; a column
// type this package does not know, or a table or column on one side only,
// is refused before anything is written (PlanError).
//
// A table's checksum is the sum, lane by lane, of the SHA-256 of each of
// its rows with every value in one canonical form (timestamps as
// microseconds, booleans as 0/1, JSON with sorted keys and exact numbers),
// so that it is the same on both backends and does not depend on the
// order rows are read in.
package transfer
