package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/better-compute/better-compute/controlplane/store"
)

// identity is an authenticated node caller.
type identity struct {
	nodeID string
	// serial is the serial of the certificate the caller presented.
	serial string
	// addr is the caller's socket address.
	addr net.Addr
}

// peerAddr returns the caller's socket address, nil when unknown.
func peerAddr(ctx context.Context) net.Addr {
	if p, ok := peer.FromContext(ctx); ok {
		return p.Addr
	}
	return nil
}

// peerIP returns the caller's IP address as text, for the audit log.
func peerIP(ctx context.Context) string {
	switch a := peerAddr(ctx).(type) {
	case *net.TCPAddr:
		return a.IP.String()
	case nil:
		return ""
	default:
		if host, _, err := net.SplitHostPort(a.String()); err == nil {
			return host
		}
		return a.String()
	}
}

// authenticate checks the caller's client certificate: it chains to the node
// CA roots (checked in the handshake and again here), names one node SPIFFE
// ID of the trust domain, is not revoked, and names a node that exists.
// revokedCode is the status code for a revoked certificate, which differs
// by method (session.proto).
func (g *Gateway) authenticate(ctx context.Context, revokedCode codes.Code) (*identity, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "no peer information")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return nil, status.Error(codes.Unauthenticated, "a node client certificate is required: join the machine first (bcd join)")
	}
	nodeID, serial, err := g.verifier.Verify(info.State.PeerCertificates, g.cfg.Now())
	if err != nil {
		return nil, status.Errorf(codes.Unauthenticated, "client certificate refused: %v", err)
	}
	revoked, err := g.store.RevocationCheck(ctx, serial)
	if err != nil {
		g.log.ErrorContext(ctx, "Revocation check failed", "node_id", nodeID, "error", err)
		return nil, status.Error(codes.Unavailable, "cannot check the certificate's revocation now; retry")
	}
	if revoked {
		return nil, status.Errorf(revokedCode, "certificate %s of node %s is revoked", serial, nodeID)
	}
	_, err = g.store.NodeGet(ctx, nodeID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, status.Errorf(codes.PermissionDenied, "certificate names node %s, which is not a node of this deployment: re-join the machine", nodeID)
	case err != nil:
		g.log.ErrorContext(ctx, "Node lookup failed", "node_id", nodeID, "error", err)
		return nil, status.Error(codes.Unavailable, "cannot look the node up now; retry")
	}
	return &identity{nodeID: nodeID, serial: serial, addr: p.Addr}, nil
}

// internal logs err and returns an INTERNAL status that does not leak it.
func (g *Gateway) internal(ctx context.Context, op string, err error) error {
	g.log.ErrorContext(ctx, "Gateway call failed", "op", op, "error", err)
	return status.Error(codes.Internal, fmt.Sprintf("%s failed on the gateway; see its log", op))
}
