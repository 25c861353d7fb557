package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/better-compute/better-compute/controlplane/pkg/tunnel"
	"github.com/better-compute/better-compute/controlplane/store"
	controlv1 "github.com/better-compute/better-compute/proto/control/v1"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// TunnelRelay opens the tunnel the api's first message names on the node's
// session here, answers a frame with the tunnel id alone once the node's
// end is open (or fails: NOT_FOUND without a session here,
// FAILED_PRECONDITION for a bcd without tunnels, UNAVAILABLE when the node
// does not open it), then copies frames both ways until either side ends.
func (s *service) TunnelRelay(stream controlv1.ControlService_TunnelRelayServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	open := first.GetOpen()
	if open == nil || open.GetNodeId() == "" || open.GetOpen().GetTunnelId() == "" {
		return status.Error(codes.InvalidArgument, "the first relay message must be RelayOpen with a node and a tunnel id")
	}
	conn, _, err := s.gw.OpenTunnel(stream.Context(), open.GetNodeId(), open.GetOpen())
	switch {
	case errors.Is(err, tunnel.ErrNoSession):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, tunnel.ErrUnsupported):
		return status.Error(codes.FailedPrecondition, err.Error())
	case err != nil:
		return status.Error(codes.Unavailable, err.Error())
	}
	defer conn.Close()
	if err := stream.Send(&sessionv1.TunnelFrame{TunnelId: open.GetOpen().GetTunnelId()}); err != nil {
		return err
	}
	tunnel.Pipe(stream.Context(), relayServerHop{stream}, conn, 0)
	return nil
}

// relayServerHop is the api's side of a relay, as the gateway sees it.
type relayServerHop struct {
	s controlv1.ControlService_TunnelRelayServer
}

func (h relayServerHop) Send(f *sessionv1.TunnelFrame) error { return h.s.Send(f) }

func (h relayServerHop) Recv() (*sessionv1.TunnelFrame, error) {
	m, err := h.s.Recv()
	if err != nil {
		return nil, err
	}
	if m.GetFrame() == nil {
		return nil, fmt.Errorf("relay message without a frame")
	}
	return m.GetFrame(), nil
}

// OpenTunnel opens a tunnel through the internal API of the gateway that
// holds the node's session (tunnel.Opener): tunnel.ErrNoSession when no
// gateway with an internal address holds one.
func (c *Client) OpenTunnel(ctx context.Context, nodeID string, open *sessionv1.TunnelOpen) (tunnel.Conn, string, error) {
	sess, err := c.store.SessionGet(ctx, nodeID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, "", tunnel.ErrNoSession
	}
	if err != nil {
		return nil, "", fmt.Errorf("open tunnel: %w", err)
	}
	gw, err := c.store.GatewayGet(ctx, sess.GatewayID)
	if err != nil || gw.InternalAddress == "" {
		return nil, "", fmt.Errorf("%w: gateway %s serves no internal control API (host.gateway.internal)", tunnel.ErrNoSession, sess.GatewayID)
	}
	cl, err := c.conn(gw.InternalAddress)
	if err != nil {
		return nil, "", err
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stream, err := cl.TunnelRelay(rctx)
	if err == nil {
		err = stream.Send(&controlv1.RelayMessage{Body: &controlv1.RelayMessage_Open{Open: &controlv1.RelayOpen{NodeId: nodeID, Open: open}}})
	}
	var ack *sessionv1.TunnelFrame
	if err == nil {
		ack, err = stream.Recv()
	}
	if err != nil {
		cancel()
		switch status.Code(err) {
		case codes.NotFound:
			return nil, "", tunnel.ErrNoSession
		case codes.FailedPrecondition:
			return nil, "", tunnel.ErrUnsupported
		}
		if errors.Is(err, io.EOF) {
			err = errors.New("the gateway ended the relay")
		}
		return nil, "", fmt.Errorf("open tunnel through gateway %s: %w", gw.ID, err)
	}
	if ack.GetTunnelId() != open.GetTunnelId() {
		cancel()
		return nil, "", fmt.Errorf("open tunnel through gateway %s: unexpected first frame", gw.ID)
	}
	return &relayClientConn{stream: stream, cancel: cancel}, gw.ID, nil
}

// relayClientConn is the gateway's side of a relay, as the api sees it.
type relayClientConn struct {
	stream controlv1.ControlService_TunnelRelayClient
	cancel context.CancelFunc
	once   sync.Once
}

func (c *relayClientConn) Send(f *sessionv1.TunnelFrame) error {
	return c.stream.Send(&controlv1.RelayMessage{Body: &controlv1.RelayMessage_Frame{Frame: f}})
}

func (c *relayClientConn) Recv() (*sessionv1.TunnelFrame, error) { return c.stream.Recv() }

func (c *relayClientConn) Close() { c.once.Do(c.cancel) }
