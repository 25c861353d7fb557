package gateway

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/tunnel"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// Tunnels (docs/tunnels.md): OpenTunnel sends TunnelOpen on the node's
// session and waits for the node to open SessionService.Tunnel on the same
// connection naming the tunnel's id; the stream is then handed to the
// opener (the api in process, or the internal control API's relay) as a
// tunnel.Conn. The Tunnel handler accepts a stream only for a tunnel this
// gateway opened for the node of the stream's certificate. A session that
// ends (revoked, superseded, the node gone) closes its connection, and so
// every tunnel on it.

// MaxTunnelsPerNode is how many tunnels one node may have open or opening
// at once on its session's connection, which carries at most 16 streams
// (the session's Connect among them).
const MaxTunnelsPerNode = 8

// tunnelTable holds the tunnels waiting for their node's stream, and how
// many each node has.
type tunnelTable struct {
	mu      sync.Mutex
	pending map[string]*pendingTunnel
	perNode map[string]int
}

// reserve counts one more tunnel of nodeID, unless it has
// MaxTunnelsPerNode.
func (t *tunnelTable) reserve(nodeID string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.perNode == nil {
		t.perNode = map[string]int{}
	}
	if t.perNode[nodeID] >= MaxTunnelsPerNode {
		return false
	}
	t.perNode[nodeID]++
	return true
}

// release counts one tunnel of nodeID less.
func (t *tunnelTable) release(nodeID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.perNode[nodeID]--; t.perNode[nodeID] <= 0 {
		delete(t.perNode, nodeID)
	}
}

// pendingTunnel is one tunnel OpenTunnel waits for.
type pendingTunnel struct {
	nodeID string
	stream chan sessionv1.SessionService_TunnelServer
	done   chan struct{} // closed by the opener's Close: the handler returns
}

// add makes p the tunnel waiting under id, unless another one already
// waits under that id (false).
func (t *tunnelTable) add(id string, p *pendingTunnel) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pending == nil {
		t.pending = map[string]*pendingTunnel{}
	}
	if t.pending[id] != nil {
		return false
	}
	t.pending[id] = p
	return true
}

// claim hands the tunnel waiting under id to a stream of nodeID: it
// removes and returns it when it is nodeID's. A tunnel of another node is
// left waiting for its own node (other is true), so that a node naming
// another's tunnel id (issue 28) neither takes nor ends it.
func (t *tunnelTable) claim(id, nodeID string) (p *pendingTunnel, other bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p = t.pending[id]
	switch {
	case p == nil:
		return nil, false
	case p.nodeID != nodeID:
		return nil, true
	}
	delete(t.pending, id)
	return p, false
}

// withdraw removes p from under id, and reports whether it was still
// waiting there (false: a stream of its node claimed it).
func (t *tunnelTable) withdraw(id string, p *pendingTunnel) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.pending[id] != p {
		return false
	}
	delete(t.pending, id)
	return true
}

// OpenTunnel opens open on the node's session here and returns its stream
// once the node opened it (tunnel.Opener): tunnel.ErrNoSession when the
// node holds no session here, tunnel.ErrUnsupported when its bcd lacks the
// capability, an error after tunnel.OpenTimeout when the node does not open
// its end.
func (g *Gateway) OpenTunnel(ctx context.Context, nodeID string, open *sessionv1.TunnelOpen) (tunnel.Conn, string, error) {
	s := g.sessions.get(nodeID)
	if s == nil || s.closed.Load() {
		return nil, "", tunnel.ErrNoSession
	}
	if !slices.Contains(s.caps, sessionv1.CapabilityTunnel) {
		return nil, "", tunnel.ErrUnsupported
	}
	if open.GetTunnelId() == "" {
		return nil, "", fmt.Errorf("open tunnel: no tunnel id")
	}
	if !g.tunnels.reserve(nodeID) {
		return nil, "", fmt.Errorf("node %s has %d tunnels open, the most one node may have at once: close one", nodeID, MaxTunnelsPerNode)
	}
	opened := false
	defer func() {
		if !opened {
			g.tunnels.release(nodeID)
		}
	}()
	p := &pendingTunnel{nodeID: nodeID, stream: make(chan sessionv1.SessionService_TunnelServer, 1), done: make(chan struct{})}
	if !g.tunnels.add(open.GetTunnelId(), p) {
		return nil, "", fmt.Errorf("open tunnel on node %s: tunnel id %s is already waiting for a node", nodeID, open.GetTunnelId())
	}
	if err := s.send(&sessionv1.GatewayMessage{Body: &sessionv1.GatewayMessage_TunnelOpen{TunnelOpen: open}}); err != nil {
		g.tunnels.withdraw(open.GetTunnelId(), p)
		return nil, "", fmt.Errorf("open tunnel on node %s: %w", nodeID, err)
	}
	t := time.NewTimer(tunnel.OpenTimeout)
	defer t.Stop()
	select {
	case st := <-p.stream:
		g.log.InfoContext(ctx, "Tunnel opened", logkey.NodeID, nodeID, "tunnel_id", open.GetTunnelId(), "kind", open.GetKind())
		opened = true
		return &nodeConn{stream: st, done: p.done, release: func() { g.tunnels.release(nodeID) }}, g.cfg.ID, nil
	case <-t.C:
	case <-ctx.Done():
	}
	if !g.tunnels.withdraw(open.GetTunnelId(), p) {
		// The node's stream came in the meantime: let its handler go.
		select {
		case <-p.stream:
		default:
		}
		close(p.done)
	}
	if ctx.Err() != nil {
		return nil, "", ctx.Err()
	}
	return nil, "", fmt.Errorf("node %s did not open tunnel %s within %s", nodeID, open.GetTunnelId(), tunnel.OpenTimeout)
}

// nodeConn is the node's Tunnel stream as the opener sees it.
type nodeConn struct {
	stream  sessionv1.SessionService_TunnelServer
	done    chan struct{}
	release func()
	once    sync.Once
}

func (c *nodeConn) Send(f *sessionv1.TunnelFrame) error { return c.stream.Send(f) }

func (c *nodeConn) Recv() (*sessionv1.TunnelFrame, error) {
	f, err := c.stream.Recv()
	if err != nil {
		return nil, err
	}
	return f, nil
}

func (c *nodeConn) Close() { c.once.Do(func() { close(c.done); c.release() }) }

// Tunnel takes a node's end of a tunnel OpenTunnel asked for and holds it
// until the opener closes it or the connection ends.
func (ss *sessionService) Tunnel(stream sessionv1.SessionService_TunnelServer) error {
	g := ss.g
	id, err := g.authenticate(stream.Context(), codes.PermissionDenied)
	if err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if err := tunnel.Check(first); err != nil || first.GetTunnelId() == "" {
		return status.Error(codes.InvalidArgument, "the first tunnel frame must name the tunnel")
	}
	p, other := g.tunnels.claim(first.GetTunnelId(), id.nodeID)
	switch {
	case other:
		// Refused, and the tunnel keeps waiting for its own node.
		g.log.WarnContext(stream.Context(), "Tunnel stream refused: the tunnel id is another node's", logkey.NodeID, id.nodeID,
			"tunnel_id", first.GetTunnelId())
		return status.Errorf(codes.PermissionDenied, "tunnel %s is not for node %s", first.GetTunnelId(), id.nodeID)
	case p == nil:
		return status.Errorf(codes.NotFound, "no tunnel %s is waiting on this gateway", first.GetTunnelId())
	}
	p.stream <- stream
	select {
	case <-p.done:
	case <-stream.Context().Done():
	}
	return nil
}
