package gateway

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/better-compute/better-compute/controlplane/pkg/admission"
	"github.com/better-compute/better-compute/controlplane/pkg/pki"
	"github.com/better-compute/better-compute/proto/keyproof"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// NonceTTL is how long a Challenge nonce is accepted.
const NonceTTL = time.Minute

// Layout of a nonce: the gateway's clock at issue (Unix nanoseconds, 8
// bytes), 16 random bytes, and the first 16 bytes of HMAC-SHA256 under the
// gateway's nonce key over both and the connection's exporter. A nonce thus
// needs no state: the gateway that minted it recognises it, on the
// connection it was minted for, until it is NonceTTL old.
const (
	nonceTimeLen = 8
	nonceRandLen = 16
	nonceMACLen  = 16
	nonceLen     = nonceTimeLen + nonceRandLen + nonceMACLen
)

// nonces mints and checks Challenge nonces.
type nonces struct {
	key [32]byte
}

func newNonces() (*nonces, error) {
	n := &nonces{}
	if _, err := rand.Read(n.key[:]); err != nil {
		return nil, fmt.Errorf("nonce key: %w", err)
	}
	return n, nil
}

func (n *nonces) mac(head, exporter []byte) []byte {
	m := hmac.New(sha256.New, n.key[:])
	m.Write(head)
	m.Write(exporter)
	return m.Sum(nil)[:nonceMACLen]
}

// mint returns a nonce for the connection whose exporter is given.
func (n *nonces) mint(now time.Time, exporter []byte) []byte {
	out := make([]byte, nonceTimeLen+nonceRandLen, nonceLen)
	binary.BigEndian.PutUint64(out, uint64(now.UnixNano()))
	rand.Read(out[nonceTimeLen:])
	return append(out, n.mac(out, exporter)...)
}

// check reports whether nonce was minted by n for this exporter within
// NonceTTL of now.
func (n *nonces) check(nonce []byte, now time.Time, exporter []byte) error {
	if len(nonce) != nonceLen {
		return errors.New("not a nonce of this gateway")
	}
	head := nonce[:nonceTimeLen+nonceRandLen]
	if !hmac.Equal(n.mac(head, exporter), nonce[len(head):]) {
		return errors.New("nonce not minted for this connection by this gateway")
	}
	age := now.Sub(time.Unix(0, int64(binary.BigEndian.Uint64(nonce))))
	if age < -time.Second || age > NonceTTL {
		return fmt.Errorf("nonce is %s old, accepted for %s", age.Round(time.Second), NonceTTL)
	}
	return nil
}

// exporter returns the TLS exporter of the caller's connection.
func exporter(ctx context.Context) ([]byte, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, keyproof.ErrNoExporter
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil, keyproof.ErrNoExporter
	}
	return keyproof.Exporter(&info.State)
}

// Challenge hands out a nonce bound to the caller's connection.
func (j *joinService) Challenge(ctx context.Context, _ *sessionv1.ChallengeRequest) (*sessionv1.ChallengeResponse, error) {
	ekm, err := exporter(ctx)
	if err != nil {
		return nil, status.Error(codes.FailedPrecondition, "challenge needs TLS 1.3 keying material on this connection")
	}
	now := j.g.cfg.Clock.Now()
	return &sessionv1.ChallengeResponse{
		Nonce:      j.g.nonces.mint(now, ekm),
		ServerTime: timestamppb.New(now),
		ValidFor:   durationpb.New(NonceTTL),
	}, nil
}

// checkProof verifies a KeyProof made for purpose on the caller's
// connection: a nonce of this connection, a chain from the node CA naming a
// node (its validity period is not checked: an expired certificate still
// names its node and key), and a signature by the leaf's key. It returns the
// proven key, or an UNAUTHENTICATED status with reason PROOF_INVALID.
func (g *Gateway) checkProof(ctx context.Context, p *sessionv1.KeyProof, purpose keyproof.Purpose) (*admission.ProvenKey, error) {
	invalid := func(format string, args ...any) error {
		return refusal(codes.Unauthenticated, sessionv1.IdentityRefusal_PROOF_INVALID, "key proof refused: "+fmt.Sprintf(format, args...))
	}
	ekm, err := exporter(ctx)
	if err != nil {
		return nil, invalid("%v", err)
	}
	return g.verifyProof(p, purpose, ekm)
}

// verifyProof is checkProof for a connection whose exporter is ekm.
func (g *Gateway) verifyProof(p *sessionv1.KeyProof, purpose keyproof.Purpose, ekm []byte) (*admission.ProvenKey, error) {
	invalid := func(format string, args ...any) error {
		return refusal(codes.Unauthenticated, sessionv1.IdentityRefusal_PROOF_INVALID, "key proof refused: "+fmt.Sprintf(format, args...))
	}
	if err := g.nonces.check(p.GetNonce(), g.cfg.Clock.Now(), ekm); err != nil {
		return nil, invalid("%v: ask for a new challenge on this connection", err)
	}
	ders := p.GetCertificateChain()
	if len(ders) == 0 || len(ders) > 4 {
		return nil, invalid("%d certificates in the chain, want 1 to 4", len(ders))
	}
	chain := make([]*x509.Certificate, len(ders))
	for i, der := range ders {
		var err error
		if chain[i], err = x509.ParseCertificate(der); err != nil {
			return nil, invalid("certificate %d: %v", i, err)
		}
	}
	leaf := chain[0]
	// Judge the chain as of just before the leaf expired.
	nodeID, serial, err := g.current().reattest.Verify(chain, leaf.NotAfter.Add(-time.Second))
	if err != nil {
		return nil, invalid("%v", err)
	}
	if err := keyproof.Verify(leaf.PublicKey, purpose, p.GetNonce(), ekm, p.GetSignature()); err != nil {
		return nil, invalid("%v", err)
	}
	keyHash, err := pki.KeySHA256(leaf.PublicKey)
	if err != nil {
		return nil, invalid("%v", err)
	}
	return &admission.ProvenKey{NodeID: nodeID, KeySHA256: keyHash, Serial: serial, NotAfter: leaf.NotAfter}, nil
}

// Reattest renews the certificate of a node whose certificate expired
// during an outage, on the proof of its latest key.
func (j *joinService) Reattest(ctx context.Context, req *sessionv1.ReattestRequest) (*sessionv1.RenewResponse, error) {
	g := j.g
	if req.GetProof() == nil {
		return nil, status.Error(codes.InvalidArgument, "reattest needs a key proof")
	}
	proven, err := g.checkProof(ctx, req.GetProof(), keyproof.PurposeReattest)
	if err != nil {
		return nil, err
	}
	cert, err := g.admit.Reattest(ctx, &admission.ReattestRequest{
		Proven: *proven, CSR: req.GetCsr(), Source: peerIP(ctx), Via: "gateway:" + g.cfg.ID,
	})
	if err != nil {
		return nil, g.admissionStatus(ctx, "reattest", err)
	}
	return g.renewResponse(cert), nil
}

// admissionStatus turns a refusal of admission's identity rules into the
// status a node sees, with its IdentityRefusal; other errors are INTERNAL.
func (g *Gateway) admissionStatus(ctx context.Context, op string, err error) error {
	switch {
	case errors.Is(err, admission.ErrGracePassed):
		return refusal(codes.FailedPrecondition, sessionv1.IdentityRefusal_GRACE_PASSED, errText(err))
	case errors.Is(err, admission.ErrUnknownNode):
		return refusal(codes.PermissionDenied, sessionv1.IdentityRefusal_UNKNOWN_NODE, errText(err))
	case errors.Is(err, admission.ErrNotLatestKey):
		return refusal(codes.PermissionDenied, sessionv1.IdentityRefusal_NOT_LATEST_KEY, errText(err))
	case errors.Is(err, admission.ErrNodeRevoked):
		return refusal(codes.PermissionDenied, sessionv1.IdentityRefusal_REVOKED, errText(err))
	case errors.Is(err, admission.ErrInvalidRequest):
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return g.internal(ctx, op, err)
}

// errText is a refusal's text without admission's "join refused: " prefix.
func errText(err error) string {
	msg := err.Error()
	if p := admission.ErrRefused.Error() + ": "; len(msg) > len(p) && msg[:len(p)] == p {
		return msg[len(p):]
	}
	return msg
}
