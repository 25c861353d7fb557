package session

import (
	"context"
	"sync"

	"github.com/better-compute/better-compute/bcd/internal/logkey"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// TunnelHandler opens the tunnels a gateway asks for (capability "tunnel",
// docs/tunnels.md): a shell with a PTY or a TCP connection on the node.
type TunnelHandler interface {
	// HandleTunnel runs one tunnel over stream until it ends or ctx (the
	// session's) ends. The stream is open and the tunnel's id sent;
	// HandleTunnel sends its frames (data, exit, error) and reads the
	// client's (data, resize, signal, eof). stream.Send is safe for
	// concurrent use.
	HandleTunnel(ctx context.Context, open *sessionv1.TunnelOpen, stream TunnelStream)
}

// TunnelStream is a tunnel's end on the node.
type TunnelStream interface {
	Send(*sessionv1.TunnelFrame) error
	Recv() (*sessionv1.TunnelFrame, error)
}

// lockedTunnel serialises a Tunnel stream's sends.
type lockedTunnel struct {
	mu sync.Mutex
	s  sessionv1.SessionService_TunnelClient
}

func (l *lockedTunnel) Send(f *sessionv1.TunnelFrame) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s.Send(f)
}

func (l *lockedTunnel) Recv() (*sessionv1.TunnelFrame, error) { return l.s.Recv() }

// openTunnel opens the Tunnel stream the gateway asked for on the
// session's own connection and hands it to the configured TunnelHandler;
// without one it answers with an error frame.
func (s *session) openTunnel(open *sessionv1.TunnelOpen) {
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	st, err := sessionv1.NewSessionServiceClient(s.cc).Tunnel(ctx)
	if err != nil {
		s.c.log.WarnContext(ctx, "Tunnel not opened", attrGateway, s.gw.url, "tunnel_id", open.GetTunnelId(), logkey.Err, err)
		return
	}
	stream := &lockedTunnel{s: st}
	if err := stream.Send(&sessionv1.TunnelFrame{TunnelId: open.GetTunnelId()}); err != nil {
		return
	}
	if s.c.cfg.Tunnels == nil {
		_ = stream.Send(&sessionv1.TunnelFrame{Body: &sessionv1.TunnelFrame_Error{Error: "this node opens no tunnels"}})
	} else {
		s.c.log.InfoContext(ctx, "Tunnel opened", "tunnel_id", open.GetTunnelId(), "kind", open.GetKind(), "port", open.GetPort(),
			"as_root", open.GetAsRoot())
		s.c.cfg.Tunnels.HandleTunnel(ctx, open, stream)
		s.c.log.InfoContext(ctx, "Tunnel closed", "tunnel_id", open.GetTunnelId())
	}
	stream.mu.Lock()
	_ = st.CloseSend()
	stream.mu.Unlock()
	// Wait for the gateway to end the stream (or the session to end), so
	// that the last frames are delivered before cancel.
	for {
		if _, err := st.Recv(); err != nil {
			return
		}
	}
}
