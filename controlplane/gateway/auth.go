package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/better-compute/better-compute/controlplane/internal/logkey"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/controlplane/store"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
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

// peerIP returns the caller's IP address as text (addrIP), for the
// per-source bounds and the audit log.
func peerIP(ctx context.Context) string { return addrIP(peerAddr(ctx)) }

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
	now := g.cfg.Clock.Now()
	nodeID, serial, err := g.current().verifier.Verify(info.State.PeerCertificates, now)
	switch leaf := info.State.PeerCertificates[0]; {
	case errors.Is(err, pki.ErrExpired) && now.Before(leaf.NotBefore):
		return nil, refusal(codes.Unauthenticated, sessionv1.IdentityRefusal_CERT_NOT_YET_VALID,
			fmt.Sprintf("client certificate not yet valid: valid from %s, the gateway's clock reads %s",
				leaf.NotBefore.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339)))
	case errors.Is(err, pki.ErrExpired):
		return nil, refusal(codes.Unauthenticated, sessionv1.IdentityRefusal_CERT_EXPIRED,
			fmt.Sprintf("client certificate expired at %s, the gateway's clock reads %s: re-attest (JoinService.Reattest)",
				leaf.NotAfter.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339)))
	case err != nil:
		return nil, status.Errorf(codes.Unauthenticated, "client certificate refused: %v", err)
	}
	revoked, err := g.store.RevocationCheck(ctx, serial)
	if err != nil {
		g.log.ErrorContext(ctx, "Revocation check failed", logkey.NodeID, nodeID, logkey.Err, err)
		return nil, status.Error(codes.Unavailable, "cannot check the certificate's revocation now; retry")
	}
	if revoked {
		return nil, refusal(revokedCode, sessionv1.IdentityRefusal_REVOKED, fmt.Sprintf("certificate %s of node %s is revoked", serial, nodeID))
	}
	_, err = g.store.NodeGet(ctx, nodeID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, refusal(codes.PermissionDenied, sessionv1.IdentityRefusal_UNKNOWN_NODE,
			fmt.Sprintf("certificate names node %s, which is not a node of this deployment: re-join the machine", nodeID))
	case err != nil:
		g.log.ErrorContext(ctx, "Node lookup failed", logkey.NodeID, nodeID, logkey.Err, err)
		return nil, status.Error(codes.Unavailable, "cannot look the node up now; retry")
	}
	return &identity{nodeID: nodeID, serial: serial, addr: p.Addr}, nil
}

// internal logs err and returns an INTERNAL status that does not leak it.
func (g *Gateway) internal(ctx context.Context, op string, err error) error {
	g.log.ErrorContext(ctx, "Gateway call failed", "op", op, logkey.Err, err)
	return status.Error(codes.Internal, fmt.Sprintf("%s failed on the gateway; see its log", op))
}

// refusal is a status with code and msg whose details carry reason as a
// google.rpc.ErrorInfo (session.proto, IdentityRefusal), so a node tells
// an expired certificate from a revoked one without reading text.
func refusal(code codes.Code, reason sessionv1.IdentityRefusal, msg string) error {
	st := status.New(code, msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason.String(), Domain: sessionv1.RefusalDomain}); err == nil {
		st = d
	}
	return st.Err()
}
