package helper_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/helper"
)

// The helper streams only the kernel log's health records — NVRM Xid, PCIe
// AER and mlx5_core error lines (kmsg.IsHealthRecord) — (look-back first,
// then new ones) to its node user, until the client stops.
func TestKernelLogXidThroughHelper(t *testing.T) {
	dir := t.TempDir()
	logPath := filepath.Join(dir, "kmsg")
	const xid79 = "3,1412,5729011203,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1903, name=python3, GPU has fallen off the bus."
	const xid13 = "4,1413,5729011300,-;NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception"
	if err := os.WriteFile(logPath, []byte("6,1,2,-;secret: not for bcd\n"+xid79+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "helper.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	s := helper.NewServer(helper.Config{Socket: sock, NodeUID: uint32(os.Getuid()), NodeGID: uint32(os.Getgid()), KernelLog: logPath},
		slog.New(slog.DiscardHandler))
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	c := &helper.Client{Socket: sock}
	deadline := time.Now().Add(5 * time.Second)
	for c.Ping(context.Background()) != nil {
		if time.Now().After(deadline) {
			t.Fatal("helper never answered")
		}
		time.Sleep(10 * time.Millisecond)
	}

	got := make(chan string, 8)
	fctx, stop := context.WithCancel(t.Context())
	ferr := make(chan error, 1)
	go func() { ferr <- c.FollowKernelLog(fctx, func(r string) { got <- r }) }()
	next := func() string {
		select {
		case r := <-got:
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("no record from the helper")
			return ""
		}
	}
	if r := next(); r != xid79 {
		t.Fatalf("first record %q, want the XID 79 line (and never the other)", r)
	}
	f, err := os.OpenFile(logPath, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	const mlx5Fatal = "3,1414,5729011400,-;mlx5_core 0000:3b:00.0: poll_health:802:(pid 0): Fatal error 1 detected"
	_, _ = f.WriteString("6,3,4,-;another secret\n" + xid13 + "\n" +
		"6,5,6,-;mlx5_core 0000:3b:00.0: mlx5e_update_carrier:2345:(pid 77): Link up\n" + mlx5Fatal + "\n")
	f.Close()
	if r := next(); r != xid13 {
		t.Fatalf("appended record %q, want the XID 13 line", r)
	}
	if r := next(); r != mlx5Fatal {
		t.Fatalf("next record %q, want the mlx5_core fatal line (and not its link-up line)", r)
	}
	stop()
	if err := <-ferr; err != nil {
		t.Errorf("FollowKernelLog after stop = %v", err)
	}

	// A helper that cannot read the log says so.
	os.Remove(logPath)
	if err := c.FollowKernelLog(t.Context(), func(string) {}); err == nil || errors.Is(err, helper.ErrRefused) {
		t.Errorf("FollowKernelLog without a log = %v, want the helper's read error", err)
	}
}
