package serve_test

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/controlplane/pkg/config"
	"github.com/better-compute/better-compute/controlplane/serve"
)

// notifySocket binds a unixgram socket, points NOTIFY_SOCKET at it (so the
// test cannot be parallel) and returns the messages sent to it, in order.
func notifySocket(t *testing.T) <-chan string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	t.Setenv("NOTIFY_SOCKET", path)
	msgs := make(chan string, 1024)
	go func() {
		buf := make([]byte, 64*1024)
		for {
			n, _, err := conn.ReadFromUnix(buf)
			if err != nil {
				close(msgs)
				return
			}
			msgs <- string(buf[:n])
		}
	}()
	return msgs
}

// next returns the next message that is not WATCHDOG=1, counting those in
// *watchdogs, or fails after timeout.
func next(t *testing.T, msgs <-chan string, watchdogs *int, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				t.Fatal("notify socket closed")
			}
			if m == "WATCHDOG=1" {
				*watchdogs++
				continue
			}
			return m
		case <-deadline:
			t.Fatalf("no sd_notify message within %v", timeout)
		}
	}
}

// TestNotify checks serve's sd_notify conversation: STATUS while starting,
// READY=1 only once the listeners are bound and this process is in the
// workers table, WATCHDOG=1 at half of WATCHDOG_USEC, STOPPING=1 on
// cancellation.
func TestNotify(t *testing.T) {
	msgs := notifySocket(t)
	t.Setenv("WATCHDOG_USEC", "200000") // 200 ms: WATCHDOG=1 every 100 ms
	cfg := load(t, map[string]string{config.EnvDataDir: t.TempDir()})
	st := open(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- serve.Run(ctx, cfg, st, serve.Options{Log: slog.New(slog.NewTextHandler(t.Output(), nil))})
	}()
	watchdogs := 0
	if m := next(t, msgs, &watchdogs, 30*time.Second); !strings.HasPrefix(m, "STATUS=Starting") {
		t.Fatalf("first message %q, want STATUS=Starting...", m)
	}
	m := next(t, msgs, &watchdogs, 60*time.Second)
	match := regexp.MustCompile(`^READY=1\nSTATUS=Serving all; API on (\S+); gateway on (\S+) \(https://`).FindStringSubmatch(m)
	if match == nil {
		t.Fatalf("message %q, want READY=1 with the serving status", m)
	}
	for _, addr := range match[1:] {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("READY=1 sent before %s listens: %v", addr, err)
		}
		c.Close()
	}
	workers, err := st.WorkerList(ctx, time.Minute, nil)
	if err != nil || len(workers) != 1 {
		t.Fatalf("READY=1 sent with workers %v (%v), want this process registered", workers, err)
	}
	// The watchdog keeps beating after READY=1.
	seen := watchdogs
	timeout := time.After(10 * time.Second)
	for watchdogs < seen+2 {
		select {
		case m := <-msgs:
			if m != "WATCHDOG=1" {
				t.Fatalf("message %q while serving, want only WATCHDOG=1", m)
			}
			watchdogs++
		case <-timeout:
			t.Fatalf("%d WATCHDOG=1 after READY=1 in 10 s with WATCHDOG_USEC=200000", watchdogs-seen)
		}
	}
	cancel()
	if m := next(t, msgs, &watchdogs, 10*time.Second); !strings.HasPrefix(m, "STOPPING=1\nSTATUS=Stopping") {
		t.Fatalf("message %q after cancellation, want STOPPING=1", m)
	}
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
}

// TestNotifyRoleFails checks that a role that cannot start means no
// READY=1, and STOPPING=1 with the reason.
func TestNotifyRoleFails(t *testing.T) {
	msgs := notifySocket(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg := load(t, map[string]string{config.EnvDataDir: t.TempDir()})
	cfg.Host.Listen = taken.Addr().String()
	st := open(t, cfg)
	err = serve.Run(context.Background(), cfg, st, serve.Options{Log: slog.New(slog.NewTextHandler(t.Output(), nil))})
	if err == nil {
		t.Fatal("serve with its API address taken returned nil")
	}
	watchdogs := 0
	if m := next(t, msgs, &watchdogs, 10*time.Second); !strings.HasPrefix(m, "STATUS=Starting") {
		t.Fatalf("first message %q, want STATUS=Starting...", m)
	}
	if m := next(t, msgs, &watchdogs, 10*time.Second); !strings.HasPrefix(m, "STOPPING=1\nSTATUS=Stopping: a role failed: ") {
		t.Fatalf("message %q, want STOPPING=1 naming the failure (and no READY=1)", m)
	}
}
