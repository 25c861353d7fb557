package store

import (
	"context"
	"time"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Event is something that happened on a node or in the control plane, such
// as a GPU XID error.
type Event struct {
	ID       int64
	NodeID   string
	Kind     string
	Severity string
	Message  string
	Time     time.Time
	Payload  []byte // JSON
	// GPUFinding is the typed finding of a node's GPU event (kinds
	// "gpu.*"), as the node sent it. When set, EventInsert stores its
	// protojson as Payload (gpufinding.Marshal; Payload is ignored), writes
	// the gpu.health-changed event and, when it names a resolution, a
	// RemediationFinding, all in one transaction. EventList leaves it nil:
	// gpufinding.Decode reads it from Payload, in either stored shape.
	GPUFinding *sessionv1.GPUFinding
}

// EventStore keeps events.
type EventStore interface {
	EventInsert(ctx context.Context, e *Event) (int64, error)
	EventList(ctx context.Context, p *EventListParams) ([]*Event, error)
	EventPrune(ctx context.Context, before time.Time) (int64, error)
}

// EventListParams filter EventList. AfterID pages by id.
type EventListParams struct {
	NodeID  string
	AfterID int64
	Limit   int
}
