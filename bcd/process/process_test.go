package process_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/process"
)

func run(t *testing.T, ctx context.Context, spec process.Spec) (string, string, process.Result) {
	t.Helper()
	var out, errb bytes.Buffer
	res := process.Run(ctx, spec, func(stream int, b []byte) {
		if stream == process.Stdout {
			out.Write(b)
		} else {
			errb.Write(b)
		}
	})
	return out.String(), errb.String(), res
}

func TestOutputAndExitCode(t *testing.T) {
	out, errOut, res := run(t, context.Background(), process.Spec{Argv: []string{"sh", "-c", "echo hello; echo oops >&2; exit 3"}, Env: map[string]string{"X": "1"}})
	if out != "hello\n" || errOut != "oops\n" || res.ExitCode != 3 || res.Err != nil || res.Cancelled {
		t.Fatalf("out %q err %q res %+v", out, errOut, res)
	}
	out, _, _ = run(t, context.Background(), process.Spec{Argv: []string{"sh", "-c", "echo $X $HOME $PATH"}, Env: map[string]string{"X": "set"}})
	if out != "set / "+process.DefaultPath+"\n" {
		t.Fatalf("environment: %q", out)
	}
}

func TestOutputLimit(t *testing.T) {
	out, _, res := run(t, context.Background(), process.Spec{Argv: []string{"sh", "-c", "head -c 100000 /dev/zero"}, OutputLimit: 1000})
	if len(out) != 1000 || !res.Truncated || res.ExitCode != 0 {
		t.Fatalf("got %d bytes, truncated %v, exit %d", len(out), res.Truncated, res.ExitCode)
	}
}

func TestNotFound(t *testing.T) {
	_, _, res := run(t, context.Background(), process.Spec{Argv: []string{"no-such-program-xyz"}})
	if res.Err == nil || res.ExitCode != -1 || !strings.Contains(res.Err.Error(), "not found") {
		t.Fatalf("res = %+v", res)
	}
}

func TestCancelKillsProcessGroup(t *testing.T) {
	marker := fmt.Sprintf("sleep 600.%d", os.Getpid())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan process.Result, 1)
	// A shell that leaves a background child behind, as real scripts do.
	go func() {
		_, _, res := run(t, ctx, process.Spec{Argv: []string{"sh", "-c", marker + " & wait"}})
		done <- res
	}()
	deadline := time.Now().Add(5 * time.Second)
	for !running(marker) {
		if time.Now().After(deadline) {
			t.Fatal("child never started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	start := time.Now()
	cancel()
	res := <-done
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("cancel took %v", took)
	}
	if !res.Cancelled {
		t.Fatalf("res = %+v", res)
	}
	if running(marker) {
		t.Fatal("a child of the cancelled command is still running")
	}
}

func running(marker string) bool {
	out, _ := exec.Command("pgrep", "-f", marker).Output()
	return len(bytes.TrimSpace(out)) > 0
}

func TestMain(m *testing.M) {
	if _, err := exec.LookPath("pgrep"); err != nil {
		// procps is part of every Debian install; without it the kill test cannot look.
		os.Stderr.WriteString("pgrep not found\n")
	}
	os.Exit(m.Run())
}
