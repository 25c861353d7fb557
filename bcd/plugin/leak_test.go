package plugin

import (
	"context"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// A host that ran, restarted and recycled plugins leaves no goroutine behind
// once closed. Not parallel: goleak sees every goroutine of the process.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	sink := newLogSink(t)
	h, err := New(testConfig(pluginDir(t, "fake"), sink))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	if _, err := h.Power(context.Background(), "fake", power("ok", 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(h.List()[0].PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Power(context.Background(), "fake", power("hang-health", 300*time.Millisecond)); err == nil {
		t.Fatal("hung call succeeded")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
