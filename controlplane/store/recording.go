package store

import (
	"context"
	"time"
)

// Recording states (migration 0025, docs/tunnels.md, "Recorded shells").
const (
	// RecordingRecording: the shell is open and its events are being
	// stored.
	RecordingRecording = "recording"
	// RecordingComplete: the shell ended and every event was stored.
	RecordingComplete = "complete"
	// RecordingFailed: recording stopped before the shell ended (a
	// storage error, or the recording reached its size bound).
	RecordingFailed = "failed"
)

// Recording is one shell session's recording: its events are in sealed
// chunks (RecordingChunk), numbered from 0.
type Recording struct {
	ID        string
	TunnelID  string
	NodeID    string
	CreatedBy string // "token:<id>"
	AsRoot    bool
	StartedAt time.Time
	EndedAt   *time.Time
	// Bytes are the data bytes recorded, both ways; Chunks how many
	// chunks hold them.
	Bytes  int64
	Chunks int
	State  string
	Reason string
}

// RecordingChunk is one sealed chunk of a recording's events.
type RecordingChunk struct {
	RecordingID string
	Seq         int
	// Sealed is the chunk's events, sealed under the deployment secret
	// (package recording).
	Sealed []byte
}

// RecordingStore keeps shell recordings and their chunks.
type RecordingStore interface {
	// RecordingCreate inserts a recording in state RecordingRecording;
	// ErrConflict when the id is taken.
	RecordingCreate(ctx context.Context, p *RecordingCreateParams) (*Recording, error)
	// RecordingChunkAdd stores chunk Seq of a recording and adds Bytes to
	// its count, in one transaction: ErrConflict when that chunk exists,
	// ErrNotFound for an unknown recording.
	RecordingChunkAdd(ctx context.Context, p *RecordingChunkAddParams) error
	// RecordingEnd records a recording's end: its state (RecordingComplete
	// or RecordingFailed) and reason. A recording ended already keeps its
	// first end, except that a failure recorded after a completion is
	// ignored and a failure stays a failure.
	RecordingEnd(ctx context.Context, p *RecordingEndParams) error
	// RecordingGet returns a recording; ErrNotFound when there is none.
	RecordingGet(ctx context.Context, id string) (*Recording, error)
	// RecordingList returns recordings newest first (by id descending
	// within a start time), after Cursor (an id) when set, of NodeID when
	// set.
	RecordingList(ctx context.Context, p *RecordingListParams) ([]*Recording, error)
	// RecordingChunks returns a recording's chunks with Seq above After,
	// in order, at most Limit and, past the first, at most MaxBytes of
	// sealed data together.
	RecordingChunks(ctx context.Context, p *RecordingChunksParams) ([]*RecordingChunk, error)
	// RecordingPrune deletes the recordings started before before that
	// have ended, and those never ended started RecordingUnendedGrace
	// before that, with their chunks, and returns how many:
	// retention.recordings. A shell still open keeps its recording.
	RecordingPrune(ctx context.Context, before time.Time) (int64, error)
}

// RecordingCreateParams are RecordingCreate's inputs.
type RecordingCreateParams struct {
	ID        string
	TunnelID  string
	NodeID    string
	CreatedBy string
	AsRoot    bool
	Now       *time.Time
}

// RecordingChunkAddParams are RecordingChunkAdd's inputs.
type RecordingChunkAddParams struct {
	RecordingID string
	Seq         int
	Sealed      []byte
	// Bytes are the data bytes of the chunk's events.
	Bytes int64
}

// RecordingEndParams are RecordingEnd's inputs.
type RecordingEndParams struct {
	ID     string
	State  string
	Reason string
	Now    *time.Time
}

// RecordingListParams filter and page RecordingList.
type RecordingListParams struct {
	ListParams
	NodeID string
}

// RecordingChunksParams are RecordingChunks' inputs.
type RecordingChunksParams struct {
	RecordingID string
	// After is the last Seq already read; -1 for the first chunk.
	After    int
	Limit    int
	MaxBytes int
}

// RecordingUnendedGrace is how much longer than retention.recordings a
// recording that never ended is kept: its shell may still be open (a
// recording ends with its shell), or its process was killed mid-shell.
const RecordingUnendedGrace = 24 * time.Hour
