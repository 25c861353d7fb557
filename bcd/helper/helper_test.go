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

	"github.com/better-compute/better-compute/bcd/cmduser"
	"github.com/better-compute/better-compute/bcd/helper"
	"github.com/better-compute/better-compute/bcd/process"
)

// startHelper starts a helper serving uid whose command user, when the test
// runs as root, is nobody (with a HOME it can reach); it returns the
// socket.
func startHelper(t *testing.T, uid uint32) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "helper.sock")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cfg := helper.Config{Socket: sock, NodeUID: uid, NodeGID: uint32(os.Getgid())}
	if os.Geteuid() == 0 {
		cu, err := cmduser.Lookup("nobody")
		if err != nil {
			t.Fatal(err)
		}
		dir, err := os.MkdirTemp("", "bc-helper-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if err := os.Chmod(dir, 0o711); err != nil {
			t.Fatal(err)
		}
		cfg.CommandUser, cfg.CommandHome = cu, filepath.Join(dir, cmduser.HomeDir)
	}
	s := helper.NewServer(cfg, slog.New(slog.DiscardHandler))
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

// needRoot skips a test that needs root, except under CI=true.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("CI=true but not root")
	}
	t.Skip("not root: the helper runs commands as the command user")
}

// TestExecThroughHelper: a plain exec runs as the command user in its
// HOME with USER and HOME set; a root exec runs as root under a grant.
func TestExecThroughHelper(t *testing.T) {
	needRoot(t)
	sock := startHelper(t, uint32(os.Getuid()))
	fi, err := os.Stat(sock)
	if err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode %v %v, want 0660", fi, err)
	}
	c := &helper.Client{Socket: sock}
	var out strings.Builder
	res := c.Exec(context.Background(), process.Spec{Argv: []string{"sh", "-c", `echo "$(id -u) $USER $(pwd) $HOME"; exit 4`}, Env: map[string]string{"X": "1"}},
		func(_ int, b []byte) { out.Write(b) })
	f := strings.Fields(out.String())
	if res.ExitCode != 4 || len(f) != 4 || f[0] != "65534" || f[1] != "nobody" || f[2] != f[3] || !strings.HasSuffix(f[2], "/"+cmduser.HomeDir) {
		t.Fatalf("exec as the command user: %+v output %q", res, out.String())
	}
	out.Reset()
	res = c.ExecRoot(context.Background(), "cmd_root", process.Spec{Argv: []string{"id", "-u"}}, func(_ int, b []byte) { out.Write(b) })
	if res.ExitCode != 0 || res.Err != nil || strings.TrimSpace(out.String()) != "0" {
		t.Fatalf("exec as root: %+v output %q", res, out.String())
	}
}

// TestRootNeedsGrant: a root exec without a grant, with one made for
// another command, or with one already used, is refused and runs nothing.
func TestRootNeedsGrant(t *testing.T) {
	needRoot(t)
	sock := startHelper(t, uint32(os.Getuid()))
	c := &helper.Client{Socket: sock}
	marker := filepath.Join(t.TempDir(), "ran")
	try := func(spec helper.ExecSpec) helper.Frame {
		t.Helper()
		conn, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		spec.Argv = []string{"touch", marker}
		if err := json.NewEncoder(conn).Encode(helper.Request{Op: helper.OpExec, Exec: &spec}); err != nil {
			t.Fatal(err)
		}
		var f helper.Frame
		if err := json.NewDecoder(conn).Decode(&f); err != nil {
			t.Fatal(err)
		}
		return f
	}
	other, err := c.Grant(context.Background(), "cmd_other")
	if err != nil {
		t.Fatal(err)
	}
	mine, err := c.Grant(context.Background(), "cmd_mine")
	if err != nil {
		t.Fatal(err)
	}
	for name, spec := range map[string]helper.ExecSpec{
		"no grant":          {CommandID: "cmd_mine"},
		"made up grant":     {CommandID: "cmd_mine", Grant: strings.Repeat("ab", 32)},
		"another's grant":   {CommandID: "cmd_mine", Grant: other},
		"no command id":     {Grant: mine},
		"oversized command": {CommandID: strings.Repeat("x", helper.MaxIDLen+1), Grant: mine},
	} {
		if f := try(spec); !f.Done || f.ExitCode != -1 || f.Error == "" {
			t.Errorf("%s: %+v, want a refusal", name, f)
		}
	}
	if f := try(helper.ExecSpec{CommandID: "cmd_mine", Grant: mine}); f.Error != "" || f.ExitCode != 0 {
		t.Fatalf("with its grant: %+v", f)
	}
	if err := os.Remove(marker); err != nil {
		t.Fatalf("the granted exec did not run: %v", err)
	}
	if f := try(helper.ExecSpec{CommandID: "cmd_mine", Grant: mine}); !strings.Contains(f.Error, "used or expired") {
		t.Errorf("grant used twice: %+v", f)
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused exec ran: %v", err)
	}
}

func TestCancelThroughHelper(t *testing.T) {
	needRoot(t)
	sock := startHelper(t, uint32(os.Getuid()))
	c := &helper.Client{Socket: sock}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	res := c.Exec(ctx, process.Spec{Argv: []string{"sleep", "600"}}, func(int, []byte) {})
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
	res := c.Exec(context.Background(), process.Spec{Argv: []string{"true"}}, func(int, []byte) {})
	if res.Err == nil || res.ExitCode != -1 {
		t.Fatalf("exec from another uid ran: %+v", res)
	}
}

func TestNoHelper(t *testing.T) {
	c := &helper.Client{Socket: filepath.Join(t.TempDir(), "absent.sock")}
	res := c.Exec(context.Background(), process.Spec{Argv: []string{"true"}}, func(int, []byte) {})
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
