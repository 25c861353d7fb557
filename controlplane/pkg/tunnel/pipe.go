package tunnel

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Hop is one side of a tunnel: a WebSocket, a gRPC stream, a relay.
// Recv returns io.EOF when the other side closed cleanly.
type Hop interface {
	Send(*sessionv1.TunnelFrame) error
	Recv() (*sessionv1.TunnelFrame, error)
}

// Result is how a piped tunnel ended.
type Result struct {
	// BytesIn are data bytes from the client to the node; BytesOut from
	// the node to the client.
	BytesIn, BytesOut int64
	// Exit is the node's exit frame, when one came.
	Exit *sessionv1.TunnelExit
	// Reason says why the tunnel ended: "exit", "client closed",
	// "node closed", "idle", or an error.
	Reason string
}

// Pipe copies frames between client and node until either ends, the node
// sends an exit or error frame (passed on to the client), ctx ends, or no
// frame passes either way for idle (0: no limit). Every frame is checked
// (Check); a bad one ends the tunnel. It returns the bytes each way and
// why it ended; the caller closes both hops.
func Pipe(ctx context.Context, client, node Hop, idle time.Duration) Result {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var in, out atomic.Int64
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	var once sync.Once
	var res Result
	end := func(reason string, exit *sessionv1.TunnelExit) {
		once.Do(func() { res.Reason, res.Exit = reason, exit; cancel() })
	}
	go func() {
		for {
			f, err := client.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					end("client closed", nil)
				} else {
					end("client: "+err.Error(), nil)
				}
				return
			}
			if err := Check(f); err != nil {
				end("client: "+err.Error(), nil)
				return
			}
			in.Add(int64(len(f.GetData())))
			last.Store(time.Now().UnixNano())
			if err := node.Send(f); err != nil {
				end("node: "+err.Error(), nil)
				return
			}
		}
	}()
	go func() {
		for {
			f, err := node.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					end("node closed", nil)
				} else {
					end("node: "+err.Error(), nil)
				}
				return
			}
			if err := Check(f); err != nil {
				end("node: "+err.Error(), nil)
				return
			}
			out.Add(int64(len(f.GetData())))
			last.Store(time.Now().UnixNano())
			sendErr := client.Send(f)
			switch {
			case f.GetExit() != nil:
				end("exit", f.GetExit())
				return
			case f.GetError() != "":
				end("node: "+f.GetError(), nil)
				return
			case sendErr != nil:
				end("client: "+sendErr.Error(), nil)
				return
			}
		}
	}()
	var tick <-chan time.Time
	if idle > 0 {
		t := time.NewTicker(min(idle/4, time.Second) + time.Millisecond)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			end("cancelled", nil)
			res.BytesIn, res.BytesOut = in.Load(), out.Load()
			return res
		case <-tick:
			if time.Since(time.Unix(0, last.Load())) >= idle {
				_ = client.Send(Error("tunnel closed after " + idle.String() + " idle"))
				end("idle", nil)
			}
		}
	}
}

// Conn is a hop opened towards a node, which its opener closes.
type Conn interface {
	Hop
	// Close ends the tunnel on this hop. Safe to call more than once.
	Close()
}

// Opener opens a tunnel on a node: the gateway holding its session (in
// process), or the internal control API's relay to it. open.TunnelId names
// the tunnel. It returns once the node's end is open, with the id of the
// gateway that opened it.
type Opener interface {
	OpenTunnel(ctx context.Context, nodeID string, open *sessionv1.TunnelOpen) (Conn, string, error)
}

// ErrNoSession reports a node without a session an Opener can reach.
var ErrNoSession = errors.New("the node has no session: is bcd running and connected?")

// ErrUnsupported reports a node whose bcd does not offer the "tunnel"
// capability.
var ErrUnsupported = errors.New(`the node's bcd opens no tunnels (no "tunnel" capability): upgrade bcd`)

// OpenTimeout is how long an opener waits for the node to open its end.
const OpenTimeout = 10 * time.Second
