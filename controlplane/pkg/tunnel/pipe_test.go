package tunnel

import (
	"context"
	"io"
	"testing"
	"time"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// chanHop is a hop in memory: Recv reads in (io.EOF once closed), Send
// writes out.
type chanHop struct {
	in  chan *sessionv1.TunnelFrame
	out chan *sessionv1.TunnelFrame
}

func newHop() *chanHop {
	return &chanHop{in: make(chan *sessionv1.TunnelFrame, 16), out: make(chan *sessionv1.TunnelFrame, 16)}
}

func (h *chanHop) Send(f *sessionv1.TunnelFrame) error { h.out <- f; return nil }

func (h *chanHop) Recv() (*sessionv1.TunnelFrame, error) {
	f, ok := <-h.in
	if !ok {
		return nil, io.EOF
	}
	return f, nil
}

// TestPipeCountsAndExits: data both ways is counted, the node's exit frame
// reaches the client and ends the tunnel with its status.
func TestPipeCountsAndExits(t *testing.T) {
	client, node := newHop(), newHop()
	done := make(chan Result, 1)
	go func() { done <- Pipe(context.Background(), client, node, time.Minute) }()
	client.in <- Data([]byte("ls\n"))
	if f := <-node.out; string(f.GetData()) != "ls\n" {
		t.Fatalf("node got %v", f)
	}
	node.in <- Data([]byte("a b c\n"))
	node.in <- Exit(3, "")
	if f := <-client.out; string(f.GetData()) != "a b c\n" {
		t.Fatalf("client got %v", f)
	}
	if f := <-client.out; f.GetExit().GetExitCode() != 3 {
		t.Fatalf("client got %v, want the exit frame", f)
	}
	res := <-done
	if res.Reason != "exit" || res.BytesIn != 3 || res.BytesOut != 6 || res.Exit.GetExitCode() != 3 {
		t.Fatalf("result = %+v", res)
	}
}

// TestPipeIdle: with nothing passing for the idle timeout the tunnel ends
// and the client is told why; a bad frame from the client ends it too.
func TestPipeIdle(t *testing.T) {
	client, node := newHop(), newHop()
	start := time.Now()
	res := Pipe(context.Background(), client, node, 100*time.Millisecond)
	if res.Reason != "idle" || time.Since(start) < 100*time.Millisecond {
		t.Fatalf("result %+v after %v, want idle after 100ms", res, time.Since(start))
	}
	if f := <-client.out; f.GetError() == "" {
		t.Fatalf("client got %v, want an error frame", f)
	}

	client, node = newHop(), newHop()
	client.in <- Resize(0, 0)
	if res := Pipe(context.Background(), client, node, time.Minute); res.Reason == "" || res.Reason == "idle" {
		t.Fatalf("bad frame: result %+v", res)
	}
}
