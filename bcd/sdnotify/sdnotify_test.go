package sdnotify_test

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/sdnotify"
)

// listen binds a unixgram socket as systemd's NOTIFY_SOCKET.
func listen(t *testing.T) *net.UnixConn {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	return conn
}

func read(t *testing.T, conn *net.UnixConn) string {
	t.Helper()
	buf := make([]byte, 256)
	if err := conn.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	n, err := conn.Read(buf)
	if err != nil {
		t.Fatalf("read notify socket: %v", err)
	}
	return string(buf[:n])
}

func TestReadyStatusStopping(t *testing.T) {
	conn := listen(t)
	n := sdnotify.New(nil)
	n.Ready()
	n.Ready() // only once
	n.Status("connected to gw")
	n.Stopping()
	for _, want := range []string{"READY=1", "STATUS=connected to gw", "STOPPING=1"} {
		if got := read(t, conn); got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
}

func TestWatchdog(t *testing.T) {
	conn := listen(t)
	t.Setenv("WATCHDOG_USEC", "20000") // 20 ms: a ping every 10 ms
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sdnotify.New(nil).Watchdog(ctx) }()
	for range 3 {
		if got := read(t, conn); got != "WATCHDOG=1" {
			t.Errorf("got %q, want WATCHDOG=1", got)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Watchdog = %v", err)
	}
}

func TestOutsideSystemd(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	t.Setenv("WATCHDOG_USEC", "")
	n := sdnotify.New(nil)
	n.Ready()
	if err := n.Watchdog(context.Background()); err != nil { // returns at once
		t.Errorf("Watchdog = %v", err)
	}
}
