package executor_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/executor"
	"github.com/better-compute/better-compute/bcd/journal"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// crashDirEnv makes the test binary a bcd that starts a long command in
// the journal under that directory and waits to be killed.
const crashDirEnv = "BCD_EXECUTOR_TEST_CRASH_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashDirEnv); dir != "" {
		crashingBCD(dir)
	}
	os.Exit(m.Run())
}

// orphanCmd appends a line to runs, says "ready <pid>" and sleeps.
func orphanCmd(dir string) *sessionv1.Command {
	return execCmd("cmd_orphan", "sh", "-c", "echo run >> "+filepath.Join(dir, "runs")+"; echo ready $$; exec sleep 600")
}

// crashingBCD runs orphanCmd and prints its "ready <pid>" line once the
// program runs (its process group is then in the journal), then blocks.
func crashingBCD(dir string) {
	j, err := journal.Open(journal.Config{Path: filepath.Join(dir, journal.File)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	e := executor.New(executor.Config{Commands: asSelf{}, Journal: j})
	ready := make(chan string, 1)
	e.HandleCommand(context.Background(), orphanCmd(dir), func(u *sessionv1.CommandUpdate) error {
		if b := u.GetOutput().GetData(); bytes.HasPrefix(b, []byte("ready")) {
			ready <- string(b)
		}
		return nil
	})
	fmt.Print(<-ready)
	select {} // until SIGKILL
}

// procState returns the state letter of a process, or "" when it is gone.
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return f[0]
}

// TestCrashEndsTheOrphanAndNeverRunsTwice: bcd is killed with SIGKILL
// while a command runs; its process group, re-parented, keeps running. The
// next bcd over the same data directory ends the group and answers the
// command's redelivery as lost, without running it again.
func TestCrashEndsTheOrphanAndNeverRunsTwice(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bcd := exec.Command(os.Args[0], "-test.run=^$")
	bcd.Env = append(os.Environ(), crashDirEnv+"="+dir)
	bcd.Stderr = tWriter{t}
	out, err := bcd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := bcd.Start(); err != nil {
		t.Fatal(err)
	}
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		line <- s
	}()
	var pid int
	select {
	case s := <-line:
		pid, err = strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(s, "ready")))
		if err != nil {
			t.Fatalf("crashing bcd said %q", s)
		}
	case <-time.After(60 * time.Second):
		_ = bcd.Process.Kill()
		t.Fatal("the crashing bcd never started its command")
	}
	t.Cleanup(func() {
		if t.Failed() && procState(pid) != "" { // do not leave sleep 600 behind
			_ = syscall.Kill(-pid, syscall.SIGKILL)
		}
	})
	if err := bcd.Process.Kill(); err != nil { // the crash
		t.Fatal(err)
	}
	_ = bcd.Wait()
	if st := procState(pid); st == "" || st == "Z" {
		t.Fatalf("the command's process (pid %d) did not outlive the crash: state %q", pid, st)
	}

	j := openJournal(t, dir)
	e := executor.New(executor.Config{Commands: asSelf{}, Journal: j, Logger: testLogger(t)})
	r := newRecorder()
	e.HandleCommand(context.Background(), orphanCmd(dir), r.send) // the redelivery
	var res *sessionv1.CommandResult
	select {
	case res = <-r.result:
	case <-time.After(60 * time.Second):
		t.Fatal("no result for the redelivered command")
	}
	if res.GetState() != sessionv1.CommandState_COMMAND_STATE_LOST || !strings.Contains(res.GetError(), "left behind was ended") {
		t.Fatalf("redelivered command: %v", res)
	}
	// Reaped by init, or a zombie waiting for it: not running.
	if st := procState(pid); st != "" && st != "Z" {
		t.Fatalf("the orphaned process %d is still there: state %s", pid, st)
	}
	e.Wait()
	if b, err := os.ReadFile(filepath.Join(dir, "runs")); err != nil || string(b) != "run\n" {
		t.Fatalf("runs = %q, %v: want exactly one run", b, err)
	}
	if p := e.PendingResults(); len(p) != 0 {
		t.Fatalf("a delivered result is pending: %v", p)
	}
	if r.output() != "" {
		t.Fatalf("the redelivery produced output %q", r.output())
	}
}
