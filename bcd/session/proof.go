package session

import (
	"context"
	"crypto"
	"crypto/x509"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/better-compute/better-compute/proto/keyproof"
	sessionv1 "github.com/better-compute/better-compute/proto/session/v1"
)

// prove asks the gateway behind cc for a challenge and answers it with a
// KeyProof for purpose by key, whose certificate chain is chain. The proof
// is bound to the TLS connection the challenge came over: the call it goes
// with must use the same connection (one ClientConn, used at once).
func prove(ctx context.Context, cc *grpc.ClientConn, purpose keyproof.Purpose, key crypto.Signer, chain []*x509.Certificate) (*sessionv1.KeyProof, *sessionv1.ChallengeResponse, error) {
	var p peer.Peer
	ch, err := sessionv1.NewJoinServiceClient(cc).Challenge(ctx, &sessionv1.ChallengeRequest{}, grpc.Peer(&p))
	if err != nil {
		return nil, nil, fmt.Errorf("challenge: %w", err)
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil, nil, fmt.Errorf("challenge: %w", keyproof.ErrNoExporter)
	}
	ekm, err := keyproof.Exporter(&info.State)
	if err != nil {
		return nil, nil, fmt.Errorf("challenge: %w", err)
	}
	sig, err := keyproof.Sign(key, purpose, ch.GetNonce(), ekm)
	if err != nil {
		return nil, nil, err
	}
	ders := make([][]byte, len(chain))
	for i, c := range chain {
		ders[i] = c.Raw
	}
	return &sessionv1.KeyProof{CertificateChain: ders, Nonce: ch.GetNonce(), Signature: sig}, ch, nil
}

// refusalOf returns the IdentityRefusal a gateway gave with err, or
// IDENTITY_REFUSAL_UNSPECIFIED when it gave none (an older gateway, or not
// an identity refusal).
func refusalOf(err error) sessionv1.IdentityRefusal {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == sessionv1.RefusalDomain {
			return sessionv1.IdentityRefusal(sessionv1.IdentityRefusal_value[info.GetReason()])
		}
	}
	return sessionv1.IdentityRefusal_IDENTITY_REFUSAL_UNSPECIFIED
}
