package session

import (
	"errors"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// randomJitter returns a uniformly random duration in [0, max].
func randomJitter(bound time.Duration) time.Duration {
	if bound <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(bound) + 1))
}

// backoffBound is the upper bound of the delay after attempt failed
// attempts (attempt ≥ 0): min(ceil, base·2^attempt).
func backoffBound(base, ceil time.Duration, attempt int) time.Duration {
	d := base
	for range attempt {
		if d >= ceil/2 {
			return ceil
		}
		d *= 2
	}
	return min(d, ceil)
}

// ReconnectCeil is the cap of the reconnect backoff: backoffMax
// (Config.BackoffMax), or the gateway's reconnect window when that is
// longer (Welcome.reconnect_window): a fleet larger than its gateway admits
// in backoffMax is spread over the time the gateway needs.
func ReconnectCeil(backoffMax, window time.Duration) time.Duration {
	return max(backoffMax, window)
}

// reconnectDelay is the wait before the next attempt: full jitter over the
// backoff bound, and never less than the gateway's retry hint (itself
// jittered upwards by up to a quarter, so that refused daemons do not all
// come back together).
func reconnectDelay(jitter func(time.Duration) time.Duration, base, ceil time.Duration, attempt int, hint time.Duration) time.Duration {
	d := jitter(backoffBound(base, ceil, attempt))
	if hint > 0 {
		hint = min(hint, MaxRetryHint)
		d = max(d, hint+jitter(hint/4))
	}
	return d
}

// sessionEnd is how the end of an attempt counts for the backoff.
type sessionEnd int

const (
	// endFailed counts as a failed attempt: the backoff bound grows.
	endFailed sessionEnd = iota
	// endReset starts the backoff over: the next delay is full jitter over
	// BackoffBase.
	endReset
)

// backoffAfter says how the end of an attempt counts (issue 15), held being
// how long the session lasted from its Welcome:
//   - no Welcome: failed;
//   - welcomed, then drained, or closed by the gateway (the stream ended
//     cleanly, EOF): reset, however short the session;
//   - welcomed, then ended by the gateway as superseded (a Superseded
//     message, or ABORTED on a shared connection): failed, however long, so
//     that two bcd processes sharing one identity back off instead of
//     superseding each other in a loop;
//   - welcomed, then lost otherwise (the connection dropped, as when the
//     gateway is killed): reset once it lasted stableAfter, failed before.
//     An older gateway ends a superseded session by closing its connection,
//     which looks the same from here, so a short lost session still counts.
func backoffAfter(out outcome, held, stableAfter time.Duration) sessionEnd {
	if !out.welcomed {
		return endFailed
	}
	if out.drained {
		return endReset
	}
	switch {
	case errors.Is(out.err, errSuperseded) || status.Code(out.err) == codes.Aborted:
		return endFailed
	case errors.Is(out.err, errGatewayClosed):
		return endReset
	case held >= stableAfter:
		return endReset
	}
	return endFailed
}
