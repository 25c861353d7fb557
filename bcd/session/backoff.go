package session

import (
	"math/rand/v2"
	"time"
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
