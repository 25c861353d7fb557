package store

import (
	"context"
	"time"
)

// DeadLetterStore keeps the entries each sink gave up on (migration 0009,
// sink_dead_letters): an entry moved here no longer blocks its subject,
// and waits for a replay (DESIGN.md, "Events").
type DeadLetterStore interface {
	// DeadLetterInsert moves an entry that d.Sink failed to deliver to the
	// dead-letter table; a second insert of the same sink and entry is a
	// no-op. Call it with OutboxCursorSet past the entry, in the
	// dispatcher's fenced transaction.
	DeadLetterInsert(ctx context.Context, d *DeadLetter) error
	// DeadLetterList returns dead letters with id above p.AfterID, oldest
	// first: of p.Sink (any when empty), only those awaiting replay when
	// p.Replay.
	DeadLetterList(ctx context.Context, p *DeadLetterListParams) ([]*DeadLetter, error)
	// DeadLetterReplay marks dead letters for redelivery (attempts back to
	// 0): those of ids, or with no ids every dead letter of sink (of every
	// sink when sink is empty too). It returns how many it marked.
	DeadLetterReplay(ctx context.Context, sink string, ids []int64) (int64, error)
	// DeadLetterDelete removes dead letters (a replay delivered them).
	DeadLetterDelete(ctx context.Context, ids []int64) error
	// DeadLetterFailed records a failed replay of dead letter id: attempts
	// + 1 and lastError; once attempts reach maxAttempts the replay stops
	// and it waits for another replay request.
	DeadLetterFailed(ctx context.Context, id int64, lastError string, maxAttempts int) error
	// DeadLetterCounts counts dead letters per sink (pending replays
	// included), for doctor.
	DeadLetterCounts(ctx context.Context) (map[string]int64, error)
}

// DeadLetter is an outbox entry a sink gave up on.
type DeadLetter struct {
	// ID is the dead letter's own id (set on read).
	ID int64
	// Sink names the sink that failed.
	Sink string
	// Entry is the outbox entry as it was (its payload the CloudEvents JSON).
	Entry OutboxEntry
	// Attempts is how many deliveries failed (since the last replay
	// request, for one being replayed).
	Attempts int
	// LastError is the last delivery's error.
	LastError string
	// Replay is set while a replay is pending.
	Replay bool
	// FailedAt is when it was moved here.
	FailedAt time.Time
	// TenantID is the tenant it was for: the id of its sink's tenant
	// (sinks.*[].tenant) when the sink gave up on it; "" for a
	// deployment-wide sink's, and those made before migration
	// 0030_dead_letter_tenant (docs/tenants.md, "Sinks").
	TenantID string
}

// DeadLetterListParams filter and page DeadLetterList.
type DeadLetterListParams struct {
	Sink    string
	AfterID int64
	Replay  bool
	// Limit is 1 to MaxListLimit; 0 means 100.
	Limit int
}
