package session

import (
	"fmt"
	"time"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// EventKind names what an Event reports.
type EventKind int

// Kinds of Event, in the order a session usually produces them.
const (
	// EventConnecting reports that an attempt to reach Gateway starts.
	EventConnecting EventKind = iota + 1
	// EventConnected reports that Gateway answered Hello with Welcome;
	// SessionID is set.
	EventConnected
	// EventDraining reports that Gateway sent Drain; the session ends
	// after Delay.
	EventDraining
	// EventDisconnected reports that the attempt or session with Gateway
	// ended; Err says why (nil when Run's context ended).
	EventDisconnected
	// EventBackoff reports that the Client waits Delay before the next
	// attempt (after a failure, or the rest of a Drain's wait).
	EventBackoff
	// EventRenewed reports that the certificate was renewed and persisted.
	EventRenewed
	// EventRenewFailed reports that a renewal failed (Err); it is retried
	// unless Err wraps ErrRevoked.
	EventRenewFailed
)

// String returns the kind's name, for example "connected".
func (k EventKind) String() string {
	switch k {
	case EventConnecting:
		return "connecting"
	case EventConnected:
		return "connected"
	case EventDraining:
		return "draining"
	case EventDisconnected:
		return "disconnected"
	case EventBackoff:
		return "backoff"
	case EventRenewed:
		return "renewed"
	case EventRenewFailed:
		return "renew-failed"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event reports a change in a Client. Fields that do not apply to Kind are
// zero.
type Event struct {
	// Kind is what happened.
	Kind EventKind
	// Gateway is the URL of the gateway concerned.
	Gateway string
	// SessionID is Welcome.session_id of the session concerned.
	SessionID string
	// Delay is the wait chosen, for EventBackoff and EventDraining.
	Delay time.Duration
	// Err is the cause, for EventDisconnected and EventRenewFailed.
	Err error
	// GPUHealth are the health thresholds the Welcome carried, for
	// EventConnected; nil when it carried none.
	GPUHealth *sessionv1.GPUHealthThresholds
	// Attempt counts failed attempts (sessions shorter than
	// Config.StableAfter included) since the last session that lasted, for
	// EventConnecting and EventBackoff; 0 for the first attempt.
	Attempt int
}
