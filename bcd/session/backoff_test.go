package session

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestBackoffBound(t *testing.T) {
	t.Parallel()
	base, ceil := time.Second, 60*time.Second
	want := []time.Duration{1, 2, 4, 8, 16, 32, 60, 60}
	for i, w := range want {
		if got := backoffBound(base, ceil, i); got != w*time.Second {
			t.Errorf("bound after %d failures = %v, want %v", i, got, w*time.Second)
		}
	}
	if got := backoffBound(base, ceil, 1000); got != ceil {
		t.Errorf("bound after 1000 failures = %v, want the cap", got)
	}
}

func TestReconnectDelay(t *testing.T) {
	t.Parallel()
	top := func(d time.Duration) time.Duration { return d }
	zero := func(time.Duration) time.Duration { return 0 }
	base, ceil := time.Second, time.Minute
	if d := reconnectDelay(top, base, ceil, 3, 0); d != 8*time.Second {
		t.Errorf("delay = %v, want the bound 8s", d)
	}
	if d := reconnectDelay(zero, base, ceil, 3, 0); d != 0 {
		t.Errorf("delay = %v, want 0 (full jitter reaches 0)", d)
	}
	if d := reconnectDelay(zero, base, ceil, 0, 5*time.Second); d != 5*time.Second {
		t.Errorf("delay with hint = %v, want the 5s hint", d)
	}
	if d := reconnectDelay(top, base, ceil, 0, 4*time.Second); d != 5*time.Second {
		t.Errorf("delay with hint = %v, want hint plus a quarter", d)
	}
	if d := reconnectDelay(zero, base, ceil, 0, 24*time.Hour); d != MaxRetryHint {
		t.Errorf("delay with a huge hint = %v, want MaxRetryHint", d)
	}
	for range 1000 {
		if d := randomJitter(time.Second); d < 0 || d > time.Second {
			t.Fatalf("jitter %v outside [0, 1s]", d)
		}
	}
	if randomJitter(0) != 0 || randomJitter(-1) != 0 {
		t.Error("jitter of a non-positive bound is not 0")
	}
}

// TestBackoffAfter is the rule of issue 15 for how an attempt's end counts.
func TestBackoffAfter(t *testing.T) {
	t.Parallel()
	const stable = 30 * time.Second
	eof := fmt.Errorf("gateway gw: %w", errGatewayClosed)
	told := fmt.Errorf("gateway gw: %w (s2)", errSuperseded)
	lost := fmt.Errorf("gateway gw: %w", status.Error(codes.Unavailable, "error reading from server: EOF"))
	superseded := fmt.Errorf("gateway gw: %w", status.Error(codes.Aborted, "superseded by session s2"))
	for _, tc := range []struct {
		name string
		out  outcome
		held time.Duration
		want sessionEnd
	}{
		{"refused before Welcome", outcome{err: lost}, 0, endFailed},
		{"no Welcome in time", outcome{err: errors.New("gateway gw: no Welcome within 10s")}, 0, endFailed},
		{"drained at once", outcome{welcomed: true, drained: true, err: errDrained}, 0, endReset},
		{"drained, then lost", outcome{welcomed: true, drained: true, err: lost}, 0, endReset},
		{"closed by the gateway at once", outcome{welcomed: true, err: eof}, 0, endReset},
		{"superseded at once", outcome{welcomed: true, err: superseded}, 0, endFailed},
		{"superseded after an hour", outcome{welcomed: true, err: superseded}, time.Hour, endFailed},
		{"told superseded after an hour", outcome{welcomed: true, err: told}, time.Hour, endFailed},
		{"lost at once", outcome{welcomed: true, err: lost}, time.Second, endFailed},
		{"lost after StableAfter", outcome{welcomed: true, err: lost}, stable, endReset},
	} {
		if got := backoffAfter(tc.out, tc.held, stable); got != tc.want {
			t.Errorf("%s: backoffAfter = %v, want %v", tc.name, got, tc.want)
		}
	}
}
