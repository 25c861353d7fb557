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

// TestShellThroughHelper: OpShell hands over a PTY whose shell runs as the
// helper's user (root in CI) with the size asked for, and reports its exit
// status when it ends.
func TestShellThroughHelper(t *testing.T) {
	sock := startHelper(t, uint32(os.Getuid()))
	c := &helper.Client{Socket: sock}
	sh, err := c.Shell(context.Background(), helper.ShellSpec{Rows: 33, Cols: 101})
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
	if !strings.Contains(out.String(), "33 101") || (os.Getuid() == 0 && !strings.Contains(out.String(), "\n0\r")) {
		t.Fatalf("root shell output:\n%s", out.String())
	}
}
