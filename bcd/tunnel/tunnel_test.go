package tunnel_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/better-compute/better-compute/bcd/cmduser"
	"github.com/better-compute/better-compute/bcd/helper"
	"github.com/better-compute/better-compute/bcd/tunnel"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// stream is the gateway's side of a tunnel in memory: frames the handler
// sends arrive on out; frames put on in are what it receives.
type stream struct {
	in  chan *sessionv1.TunnelFrame
	out chan *sessionv1.TunnelFrame
}

func newStream() *stream {
	return &stream{in: make(chan *sessionv1.TunnelFrame, 64), out: make(chan *sessionv1.TunnelFrame, 1024)}
}

func (s *stream) Send(f *sessionv1.TunnelFrame) error { s.out <- f; return nil }

func (s *stream) Recv() (*sessionv1.TunnelFrame, error) {
	f, ok := <-s.in
	if !ok {
		return nil, io.EOF
	}
	return f, nil
}

func data(b string) *sessionv1.TunnelFrame {
	return &sessionv1.TunnelFrame{Body: &sessionv1.TunnelFrame_Data{Data: []byte(b)}}
}

// until reads frames until one with an exit, returning the data seen.
func until(t *testing.T, s *stream, within time.Duration) (string, *sessionv1.TunnelFrame) {
	t.Helper()
	var out bytes.Buffer
	deadline := time.After(within)
	for {
		select {
		case f := <-s.out:
			out.Write(f.GetData())
			if f.GetExit() != nil || f.GetError() != "" {
				return out.String(), f
			}
		case <-deadline:
			t.Fatalf("no exit frame within %v; output:\n%s", within, out.String())
		}
	}
}

// commandUser returns nobody as the command user, with a HOME it can
// reach; switching to it needs root.
func commandUser(t *testing.T) (*cmduser.User, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true but not root: shells run as the command user")
		}
		t.Skip("not root: shells run as the command user")
	}
	u, err := cmduser.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "bc-tunnel-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	return &u, filepath.Join(dir, cmduser.HomeDir)
}

// TestShellExitStatusAndSize: the shell runs as the command user in its
// HOME, sees the window size asked for and a resize, runs on a terminal,
// and its exit status comes back.
func TestShellExitStatusAndSize(t *testing.T) {
	u, home := commandUser(t)
	h := tunnel.New(tunnel.Config{Shell: "/bin/sh", CommandUser: u, CommandHome: home})
	s := newStream()
	done := make(chan struct{})
	go func() {
		h.HandleTunnel(context.Background(), &sessionv1.TunnelOpen{TunnelId: "t", Kind: sessionv1.TunnelKindShell, Rows: 30, Cols: 90}, s)
		close(done)
	}()
	s.in <- data("stty size; tty; echo id=$(id -u) home=$HOME pwd=$(pwd)\n")
	var first bytes.Buffer
	for deadline := time.After(20 * time.Second); !strings.Contains(first.String(), "/dev/pts/"); {
		select {
		case f := <-s.out:
			first.Write(f.GetData())
		case <-deadline:
			t.Fatalf("no tty output:\n%s", first.String())
		}
	}
	s.in <- &sessionv1.TunnelFrame{Body: &sessionv1.TunnelFrame_Resize{Resize: &sessionv1.WindowSize{Rows: 50, Cols: 132}}}
	s.in <- data("stty size; exit 3\n")
	rest, f := until(t, s, 20*time.Second)
	out := first.String() + rest
	<-done
	if f.GetExit().GetExitCode() != 3 {
		t.Fatalf("exit frame %v, want exit code 3; output:\n%s", f, out)
	}
	for _, want := range []string{"30 90", "50 132", "/dev/pts/", fmt.Sprintf("id=%d home=%s pwd=%s", u.UID, home, home)} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestPortEcho: kind port reaches a TCP echo server on 127.0.0.1, passes a
// half close both ways, and ends with an exit frame; a closed port is an
// error frame.
func TestPortEcho(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		line, _ := bufio.NewReader(c).ReadString('\n')
		c.Write([]byte(strings.ToUpper(line)))
		c.Close()
	}()
	h := tunnel.New(tunnel.Config{})
	s := newStream()
	go h.HandleTunnel(context.Background(), &sessionv1.TunnelOpen{TunnelId: "t", Kind: sessionv1.TunnelKindPort,
		Port: uint32(ln.Addr().(*net.TCPAddr).Port)}, s)
	s.in <- data("hello\n")
	s.in <- &sessionv1.TunnelFrame{Body: &sessionv1.TunnelFrame_Eof{Eof: true}}
	out, f := until(t, s, 10*time.Second)
	if out != "HELLO\n" || f.GetExit() == nil {
		t.Fatalf("port tunnel = %q, %v; want HELLO and an exit frame", out, f)
	}

	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	port := closed.Addr().(*net.TCPAddr).Port
	closed.Close()
	s = newStream()
	h.HandleTunnel(context.Background(), &sessionv1.TunnelOpen{TunnelId: "t", Kind: sessionv1.TunnelKindPort, Port: uint32(port)}, s)
	if _, f := until(t, s, 10*time.Second); !strings.Contains(f.GetError(), "connect to port") {
		t.Fatalf("closed port: %v, want an error frame", f)
	}
}

// TestRootShellThroughHelper: an unprivileged bcd's root shell is started
// by the root helper (its "shell" operation) and its exit status comes
// back; without a helper it is refused with an error frame.
func TestRootShellThroughHelper(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "helper.sock")
	ctx, cancel := context.WithCancel(context.Background())
	srv := helper.NewServer(helper.Config{Socket: sock, NodeUID: uint32(os.Getuid()), NodeGID: uint32(os.Getgid())}, slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	hc := &helper.Client{Socket: sock}
	for deadline := time.Now().Add(5 * time.Second); hc.Ping(context.Background()) != nil; {
		if time.Now().After(deadline) {
			t.Fatal("helper never answered")
		}
		time.Sleep(10 * time.Millisecond)
	}
	h := tunnel.New(tunnel.Config{Unprivileged: true, Helper: hc})
	s := newStream()
	go h.HandleTunnel(context.Background(), &sessionv1.TunnelOpen{TunnelId: "t", Kind: sessionv1.TunnelKindShell, AsRoot: true, Rows: 20, Cols: 70}, s)
	s.in <- data("stty size; exit 7\n")
	out, f := until(t, s, 20*time.Second)
	if f.GetExit().GetExitCode() != 7 || !strings.Contains(out, "20 70") {
		t.Fatalf("root shell: %v, output:\n%s", f, out)
	}

	s = newStream()
	tunnel.New(tunnel.Config{Unprivileged: true}).HandleTunnel(context.Background(),
		&sessionv1.TunnelOpen{TunnelId: "t", Kind: sessionv1.TunnelKindShell, AsRoot: true}, s)
	if _, f := until(t, s, 5*time.Second); !strings.Contains(f.GetError(), "root helper") {
		t.Fatalf("root shell without a helper: %v, want an error frame", f)
	}
}
