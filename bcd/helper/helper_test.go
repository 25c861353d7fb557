package helper_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bcexec "github.com/better-compute/better-compute/bcd/exec"
	"github.com/better-compute/better-compute/bcd/helper"
)

func startHelper(t *testing.T, uid uint32) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "helper.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	s := helper.NewServer(helper.Config{Socket: sock, NodeUID: uid, NodeGID: uint32(os.Getgid())}, slog.New(slog.DiscardHandler))
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	c := &helper.Client{Socket: sock}
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := c.Ping(context.Background())
		if err == nil || errors.Is(err, helper.ErrRefused) {
			return sock
		}
		if time.Now().After(deadline) {
			t.Fatalf("helper never answered: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestExecThroughHelper(t *testing.T) {
	sock := startHelper(t, uint32(os.Getuid()))
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode %v %v, want 0660", fi, err)
	}
	c := &helper.Client{Socket: sock}
	var out strings.Builder
	res := c.Exec(context.Background(), bcexec.Spec{Argv: []string{"sh", "-c", "id -u; exit 4"}}, func(_ int, b []byte) { out.Write(b) })
	if res.ExitCode != 4 || strings.TrimSpace(out.String()) != "0" && os.Getuid() == 0 {
		t.Fatalf("exec: %+v output %q", res, out.String())
	}
}

func TestCancelThroughHelper(t *testing.T) {
	sock := startHelper(t, uint32(os.Getuid()))
	c := &helper.Client{Socket: sock}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	res := c.Exec(ctx, bcexec.Spec{Argv: []string{"sleep", "600"}}, func(int, []byte) {})
	if !res.Cancelled || time.Since(start) > 3*time.Second {
		t.Fatalf("cancelled exec: %+v after %v", res, time.Since(start))
	}
}

func TestOtherUIDRefused(t *testing.T) {
	sock := startHelper(t, uint32(os.Getuid())+4242)
	c := &helper.Client{Socket: sock}
	// The helper answers and closes without reading the request, so the
	// client's write races with the close: the refusal must win every time.
	for range 100 {
		err := c.Ping(context.Background())
		if !errors.Is(err, helper.ErrRefused) || !strings.Contains(err.Error(), "may not use the root helper") {
			t.Fatalf("ping from another uid: %v", err)
		}
	}
	res := c.Exec(context.Background(), bcexec.Spec{Argv: []string{"true"}}, func(int, []byte) {})
	if res.Err == nil || res.ExitCode != -1 {
		t.Fatalf("exec from another uid ran: %+v", res)
	}
}

func TestNoHelper(t *testing.T) {
	c := &helper.Client{Socket: filepath.Join(t.TempDir(), "absent.sock")}
	res := c.Exec(context.Background(), bcexec.Spec{Argv: []string{"true"}}, func(int, []byte) {})
	if !errors.Is(res.Err, helper.ErrUnavailable) {
		t.Fatalf("without a helper: %+v", res)
	}
}

func TestOperationOffAllowListRefused(t *testing.T) {
	sock := startHelper(t, uint32(os.Getuid()))
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := json.NewEncoder(conn).Encode(helper.Request{Op: "install-kernel-module"}); err != nil {
		t.Fatal(err)
	}
	var f helper.Frame
	if err := json.NewDecoder(conn).Decode(&f); err != nil {
		t.Fatal(err)
	}
	if !f.Done || !strings.Contains(f.Error, "allow-list") {
		t.Fatalf("frame = %+v", f)
	}
}
