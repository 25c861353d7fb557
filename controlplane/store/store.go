package store

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"time"
)

// Dialect names a backend's SQL dialect.
type Dialect string

// The dialects a Store may speak.
const (
	DialectSQLite   Dialect = "sqlite"
	DialectPostgres Dialect = "postgres"
)

// Errors every backend returns, matched with errors.Is.
var (
	// ErrNotFound is returned when the addressed row does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict is returned when a write would violate a uniqueness rule.
	ErrConflict = errors.New("conflict")
	// ErrDiskFull is returned by a write the database could not make for
	// want of disk space (SQLite's SQLITE_FULL, PostgreSQL's disk_full):
	// the API answers UNAVAILABLE "database disk full" (issue 29).
	ErrDiskFull = errors.New("database disk full")
	// ErrUnavailable is returned (wrapped, beside the driver's error) when
	// the database cannot be reached or will not take the statement now: a
	// connection refused, reset or timed out, a server shutting down or
	// starting up, or a standby that refuses writes (PostgreSQL's classes 08
	// and 57P0x, read_only_sql_transaction) — a failover or restart under
	// way. Nothing the caller did is wrong: the API answers UNAVAILABLE and
	// the caller may retry (issue 39; docs/scaling.md).
	ErrUnavailable = errors.New("database unavailable")
	// ErrFenced is returned by a fenced write whose lease is no longer held
	// by the writer at the writer's epoch.
	ErrFenced = errors.New("lease lost: write fenced")
	// ErrTokenInvalid is returned by JoinTokenConsume for an unknown token or
	// a wrong secret; the two are not told apart to the caller.
	ErrTokenInvalid = errors.New("join token unknown")
	// ErrTokenExpired is returned by JoinTokenConsume for a token past its TTL.
	ErrTokenExpired = errors.New("join token expired")
	// ErrTokenRevoked is returned by JoinTokenConsume for a revoked token.
	ErrTokenRevoked = errors.New("join token revoked")
	// ErrTokenExhausted is returned by JoinTokenConsume for a token whose uses
	// reached max-uses.
	ErrTokenExhausted = errors.New("join token exhausted")
)

// Shards is the number of shards work is split into (DESIGN.md, "Workers").
const Shards = 256

// ShardOf returns the shard of a key, such as a node id: FNV-1a (32 bit) of
// the key modulo Shards.
func ShardOf(key string) int {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return int(h % Shards)
}

// NewID returns a new random identifier with the given prefix, such as
// "node_k2xq7w4r9d3m5c8v1b6n0zj4p" (prefix, underscore, 26 base32 characters,
// 130 bits of randomness).
func NewID(prefix string) string {
	return prefix + "_" + strings.ToLower(rand.Text())
}

// Store is everything the control plane reads and writes: the composition
// of the domain interfaces, one file each in this package (NodeStore in
// node.go, CommandStore in command.go, ...), plus the transaction runners.
// Backends implement the whole of it (the storage seam, as river's
// riverdriver.Executor).
//
// Only composition roots hold a Store: controlplane/serve, the CLI's store
// commands (controlplane/cmd/better-compute), controlplane/pkg/bootstrap,
// controlplane/doctor, this package and its subpackages, and the programs
// under tests/bench. Every other consumer declares the small interface it
// needs, composed of these domain interfaces or of single methods, and runs
// transactions with InTx and InFencedTx so that its callback receives that
// small interface too (tests/storeseam_test.go keeps this).
//
// A Store handed to a Tx or FencedTx callback runs every call in that
// transaction.
type Store interface {
	// Dialect names the backend.
	Dialect() Dialect
	// Ping checks that the database answers.
	Ping(ctx context.Context) error
	// Now returns the database's clock: now() on PostgreSQL, the process's
	// clock on SQLite (the function the backend registers). doctor compares
	// it with the local clock, since expiry is decided by the database.
	Now(ctx context.Context) (time.Time, error)
	// Close releases the connections.
	Close() error

	Transactor
	FencedTransactor

	Migrator
	LeaseStore
	TenantStore
	SiteStore
	PoolStore
	NodeStore
	JoinTokenStore
	GatewayStore
	TunnelStore
	SessionStore
	WorkerStore
	ProcessStore
	CommandStore
	OutboxStore
	DeadLetterStore
	EventStore
	AuditStore
	PKIStore
	PKIRotationStore
	APITokenStore
	OIDCSessionStore
	SecretStore
	DisruptionStore
	ReservationStore
	RemediationStore
	RolloutStore
	GPUStore
	RecordingStore
	ReleasePinStore
	PolicyStore
	AccessStore
}

// ListParams pages a list: rows after Cursor (an id), at most Limit
// (1 to 1,000; 0 means 100).
type ListParams struct {
	Cursor string
	Limit  int
	// Within, when set, is a tenant's Path: lists of tenant-owned rows
	// return only those of that tenant and the tenants below it
	// (docs/tenants.md). "" lists every tenant's.
	Within string
}

// MaxListLimit is the most rows one list call returns.
const MaxListLimit = 1000
