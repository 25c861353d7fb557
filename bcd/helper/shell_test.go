package helper_test

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/helper"
)

// TestShellThroughHelper: OpShell hands over a PTY whose shell runs as root
// under a grant for the tunnel (as the command user without as_root) with
// the size asked for, and reports its exit status when it ends.
func TestShellThroughHelper(t *testing.T) {
	needRoot(t)
	sock := startHelper(t, uint32(os.Getuid()))
	c := &helper.Client{Socket: sock}
	shellAs(t, c, helper.ShellSpec{Rows: 33, Cols: 101, AsRoot: true, ID: "tun_1"}, "0")
	shellAs(t, c, helper.ShellSpec{Rows: 33, Cols: 101, ID: "tun_2"}, "65534")
	if _, err := c.Shell(context.Background(), helper.ShellSpec{AsRoot: true, ID: "tun_3", Grant: strings.Repeat("00", 32)}); err == nil ||
		!strings.Contains(err.Error(), "grant") {
		t.Fatalf("root shell with a made-up grant: %v, want refused", err)
	}
}

// shellAs starts a shell with spec and checks it runs as uid.
func shellAs(t *testing.T, c *helper.Client, spec helper.ShellSpec, uid string) {
	t.Helper()
	sh, err := c.Shell(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer sh.Close()
	if _, err := sh.PTY.Write([]byte("stty size; id -u; exit 6\n")); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		b := make([]byte, 4096)
		for {
			n, err := sh.PTY.Read(b)
			out.Write(b[:n])
			if err != nil {
				return
			}
		}
	}()
	code, _, err := sh.Wait()
	if err != nil || code != 6 {
		t.Fatalf("root shell ended %d, %v; want 6", code, err)
	}
	select {
	case <-done:
	case <-time.After(2 * time.Second):
	}
	sh.PTY.Close()
	<-done
	if !strings.Contains(out.String(), "33 101") || !strings.Contains(out.String(), "\n"+uid+"\r") {
		t.Fatalf("shell output, want uid %s:\n%s", uid, out.String())
	}
}
