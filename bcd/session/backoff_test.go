package session

import (
	"testing"
	"time"
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
