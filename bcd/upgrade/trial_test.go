package upgrade

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestStartRetriesWhileTextBusy holds a write descriptor on a freshly
// written binary, as a process forked during the write does until it execs,
// and checks that the trial's start waits it out instead of failing.
func TestStartRetriesWhileTextBusy(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "bcd")
	f, err := os.OpenFile(bin, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("#!/bin/sh\nexit 0\n"); err != nil {
		t.Fatal(err)
	}
	newCmd := func() *exec.Cmd { return exec.Command(bin) }
	if err := newCmd().Start(); !errors.Is(err, syscall.ETXTBSY) {
		t.Fatalf("exec with a write descriptor open = %v, want ETXTBSY (the case this retry is for)", err)
	}
	released := make(chan struct{})
	go func() {
		time.Sleep(50 * time.Millisecond)
		f.Close()
		close(released)
	}()
	cmd, err := startRetryingBusy(context.Background(), newCmd)
	if err != nil {
		t.Fatalf("start once the descriptor closed: %v", err)
	}
	<-released
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the started binary: %v", err)
	}
}

// TestStartGivesUpOnOtherErrors checks that only ETXTBSY is retried.
func TestStartGivesUpOnOtherErrors(t *testing.T) {
	t.Parallel()
	calls := 0
	_, err := startRetryingBusy(context.Background(), func() *exec.Cmd {
		calls++
		return exec.Command(filepath.Join(t.TempDir(), "absent"))
	})
	if err == nil || calls != 1 {
		t.Fatalf("start of an absent binary: err %v after %d tries, want an error after 1", err, calls)
	}
}
