package store

import (
	"context"
	"time"
)

// OutboxEntry is an event waiting for delivery to the sinks.
type OutboxEntry struct {
	ID        int64
	Topic     string
	Key       string
	Payload   []byte // JSON
	CreatedAt time.Time
}

// OutboxStore keeps the transactional outbox and each sink's cursor.
type OutboxStore interface {
	OutboxInsert(ctx context.Context, topic, key string, payload []byte) (int64, error)
	// OutboxList returns entries with id above afterID, oldest first.
	OutboxList(ctx context.Context, afterID int64, limit int) ([]*OutboxEntry, error)
	// OutboxCursor returns the id of the last entry delivered to sink (0 at
	// first).
	OutboxCursor(ctx context.Context, sink string) (int64, error)
	OutboxCursorSet(ctx context.Context, sink string, lastID int64) error
	// OutboxMaxID returns the id of the newest entry (0 when the outbox is
	// empty): a sink's backlog is OutboxMaxID less its cursor.
	OutboxMaxID(ctx context.Context) (int64, error)
	// OutboxQuery returns the entries p selects: newest first by id, or
	// oldest first with p.Ascending. It reads without the outbox read lock,
	// so it may miss an entry whose transaction has not committed yet; a
	// reader that must see every entry in order (a sink, the event stream)
	// uses OutboxList.
	OutboxQuery(ctx context.Context, p *OutboxQueryParams) ([]*OutboxEntry, error)
	// OutboxPrune deletes the entries created before before, as a prefix of
	// ids (every id up to the newest such entry), and records the highest id
	// deleted for OutboxPrunedThrough. It returns how many it deleted.
	OutboxPrune(ctx context.Context, before time.Time) (int64, error)
	// OutboxPrunedThrough returns the highest id OutboxPrune has deleted (0
	// when nothing was pruned): a reader resuming after a lower id has lost
	// entries to retention.
	OutboxPrunedThrough(ctx context.Context) (int64, error)
	// OutboxWritten returns a channel that receives a value after each
	// commit, through this store, of a transaction that wrote to the
	// outbox (several coalesce into one pending value), and the function
	// that ends the subscription: the process's outbox readers read then
	// rather than at their next poll. On PostgreSQL such a commit also
	// sends NOTIFY on postgres.OutboxChannel, for the readers of other
	// processes (wake.ListenChannels).
	OutboxWritten() (<-chan struct{}, func())
}

// OutboxQueryParams filter OutboxQuery. Every filter is optional (zero
// means any) and all apply together.
type OutboxQueryParams struct {
	// BeforeID and AfterID bound the id: AfterID < id < BeforeID.
	BeforeID, AfterID int64
	// Since and Until bound the entry's creation time: Since <= time < Until.
	Since, Until time.Time
	// TopicPrefix matches topics (event types) that start with it, byte for
	// byte; no wildcards.
	TopicPrefix string
	// Key matches the key (the event's subject) exactly.
	Key string
	// Ascending lists oldest first; the default is newest first.
	Ascending bool
	// Limit is 1 to MaxListLimit; 0 means 100.
	Limit int
}
